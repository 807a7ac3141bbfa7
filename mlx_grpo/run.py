"""A run's life: open it (resume, the run directory, sinks, recorder), train step by step, checkpoint, finish.

Read `train()` top to bottom: open the run, then per step: step, evaluate when due, record, checkpoint when
due, write. The step itself is trainer.py's; this module owns everything around it."""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx

from .checkpoint import (PendingCheckpoint, latest_checkpoint, list_checkpoints, load_checkpoint, prepare_checkpoint,
                         read_state)
from .config import TrainConfig, config_to_dict
from .console import TrainingConsole
from .data import load_datasets
from .common.errors import UserError
from .extras.entropy_dump import EntropyDump, EntropyDumpWriter
from .distributed import init_world
from .machine import accel_memory, describe_device, share_memory_with, versions, wire_memory
from .models import chunk_ignored, count_parameters, resolve_dtype
from .plan import fit_run
from .resume import last_record, log_positions, resumable_checkpoint, resume_command, truncate_logs
from .run_lock import RunLock, create_run_dir
from .signals import StopRequest, report_stop
from .telemetry.alerts.alert import Alert
from .telemetry.alerts.config import check_rule_metrics, load_alert_rules, rules_from_config, with_on_alert
from .telemetry.metrics.system import SystemSampler
from .telemetry.recorder import RunRecorder, StepReport
from .telemetry.events import Artifact, Flush, Start
from .telemetry.rundir.completions import truncate_completions
from .telemetry.rundir.layout import RunPaths
from .common.secrets import scrub_secrets
from .telemetry.rundir.writer import RunDirWriteError, RunInfo, new_run_info
from .telemetry.sinks import SinkSet, make_sinks
from .telemetry.sinks.trackio import TrackioOptions, trackio_store
from .telemetry.sinks.wandb import WandbOptions
from .common.terminal import terminal_safe
from .trainer import Trainer, remedied


ALERT_STOP = "alert:"  # a stop request from an alert rule: this prefix and the rule's name
EXIT_GUARD_STOP = 3  # the exit code of a run a guard stopped: repeated non-finite updates, an alert's `action: stop`
EXIT_PEER_LOST = 4  # a data-parallel rank lost another (killed, crashed): mlx.launch itself still exits 0


@dataclass
class Run:
    """An opened run: its directory, the trainer, the recorder, where the steps start, and where they are."""

    run_dir: Path
    trainer: Trainer
    recorder: RunRecorder
    start_step: int
    run_id: str
    last_record: dict[str, Any]
    base_dir: Path  # where the config's relative paths resolve from
    lock: RunLock | None = None  # rank 0's lock on the run directory, released when the run closes
    rollbacks: int = 0  # rollbacks made so far (alert rules with action rollback)
    remedy: dict[str, float] = field(default_factory=dict)  # their factors, multiplied: {"learning_rate": 0.25}
    step: int = 0  # the step under way (or the last one done)
    report: StepReport | None = None  # the last step's record

    @property
    def config(self) -> TrainConfig:
        return self.trainer.config

    @property
    def writes(self) -> bool:
        """Whether this process writes the run's files and speaks for it: rank 0 of a data-parallel run."""
        return self.trainer.world.is_main


# ----------------------------------------------------------------------------- opening a run

def open_run(config: TrainConfig, base_dir: Path, resume_dir: Path | None) -> Run:
    """Build the trainer, restore a checkpoint when resuming, and assemble the recorder and its sinks."""
    # refuse early: a resume with nothing to resume, a mistake in the alert file, a run that cannot fit
    checkpoint = resumable_checkpoint(resume_dir, config.num_steps) if resume_dir is not None else None
    rules = alert_rules(config, base_dir)
    share_memory_with(init_world().ranks_on_this_host())  # before the plan: ranks on one Mac share it
    config, memory_plan = fit_run(config, base_dir)
    remedy = saved_remedy(checkpoint)  # rollbacks before the checkpoint changed the learning rate and beta
    trainer = Trainer.build(remedied(config, remedy), base_dir)
    run_dir, lock = open_directory(trainer, resume_dir)
    memory_warning = wire_memory(trainer.resident_bytes())
    saved = resume_point(trainer, checkpoint, run_dir, resume_dir)
    sinks, console, run_info = open_sinks(trainer, run_dir, base_dir, saved, resume_dir)
    recorder = open_recorder(trainer, rules, sinks, console, saved)
    start_step = saved.get("step", 0)
    run = Run(run_dir, trainer, recorder, start_step, run_info.run_id,
              last_record(run_dir) if resume_dir is not None else {}, base_dir, lock,
              rollbacks=int(saved.get("rollbacks", 0)), remedy=remedy, step=start_step)
    announce(run, memory_plan, memory_warning)
    return run


def alert_rules(config: TrainConfig, base_dir: Path) -> list:
    """The run's alert rules: the built-in ones (unless turned off) and those of the config's alerts file."""
    if config.alerts_file is not None:
        path = Path(config.alerts_file)
        path = path if path.is_absolute() else base_dir / path
        rules = load_alert_rules(path, defaults=config.enable_alerts)
        for warning in check_rule_metrics(rules, str(path)):  # a rule on a metric no run logs never fires
            print(f"mlx-grpo: warning: {terminal_safe(warning)}", file=sys.stderr, flush=True)
    else:
        rules = rules_from_config({}, defaults=config.enable_alerts)
    return with_on_alert(rules, config.on_alert)


def saved_remedy(checkpoint: Path | None) -> dict[str, float]:
    """The rollbacks' factors a checkpoint kept (none for a new run)."""
    if checkpoint is None:
        return {}
    return read_state(checkpoint).get("remedy", {})


def open_directory(trainer: Trainer, resume_dir: Path | None) -> tuple[Path, RunLock | None]:
    """The run directory: rank 0 creates it (or takes the resumed one) and locks it for the run; the other
    ranks learn its path."""
    world, main_dir, lock = trainer.world, None, None
    if world.is_main:
        main_dir, lock = (resume_dir, RunLock(resume_dir).acquire()) if resume_dir else new_run_dir(trainer.config)
    return Path(world.from_main(str(main_dir) if world.is_main else "")), lock


def new_run_dir(config: TrainConfig) -> tuple[Path, RunLock]:
    """A new run directory, created by this process alone (two runs named alike get two directories).
    Outputs go where the user stands, as with every other trainer: `mlx-grpo train cfg/my.yaml` writes
    to ./runs, where `mlx-grpo watch` and `tensorboard --logdir runs` look. (Inputs named inside a
    config, such as datasets and reward files, resolve against the config file.)"""
    return create_run_dir(Path(config.monitoring_dir).expanduser(),
                          config.run_name or time.strftime("grpo-%Y%m%d-%H%M%S"))


def resume_point(trainer: Trainer, checkpoint: Path | None, run_dir: Path, resume_dir: Path | None) -> dict[str, Any]:
    """On resume: the checkpoint's weights, optimiser and data order, and the logs cut back to it. Returns
    the checkpoint's state ({} for a new run)."""
    saved: dict[str, Any] = {}
    if checkpoint is not None:
        saved = load_checkpoint(checkpoint, trainer.policy.model, trainer.optimizer)
        trainer.world.check_resume(saved, checkpoint)
        trainer.order.load_state(saved["order"])
    if resume_dir is not None and trainer.world.is_main:
        truncate_logs(run_dir, saved.get("log_positions"), saved.get("step", 0))
        truncate_completions(run_dir, saved.get("step", 0))
    return saved


def open_sinks(trainer: Trainer, run_dir: Path, base_dir: Path, saved: dict[str, Any],
               resume_dir: Path | None) -> tuple[SinkSet, TrainingConsole, RunInfo]:
    """The console and the sinks: the run directory always, TensorBoard, W&B, Trackio, every completion and
    the entropy dumps as configured. Only rank 0 writes: the other ranks get a set without sinks."""
    config, writes, start_step = trainer.config, trainer.world.is_main, saved.get("step", 0)
    console = TrainingConsole(config.num_steps, start_step)
    console.console.quiet = not writes  # rank 0 speaks for the run
    info = RunInfo(name=run_dir.name, run_id=saved.get("run_id"))
    sinks = SinkSet(None)
    if writes:
        sinks = make_sinks(run_dir, tensorboard=config.tensorboard, tensorboard_dir=config.tensorboard_dir,
                           wandb=wandb_options(config, run_dir), trackio=trackio_options(config, run_dir),
                           warn=lambda m: console.message(m, style="yellow"),
                           purge_step=start_step + 1 if resume_dir is not None else None,
                           completions_max_mb=config.completions_max_mb if config.keep_completions else None,
                           extra=[EntropyDumpWriter(run_dir)])
        info = new_run_info(run_dir, run_dir.name, {**config_to_dict(config), "base_dir": str(base_dir)},
                            versions(), {**describe_device(resolve_dtype(config)), **trainer.world.describe()},
                            config.num_steps, run_id=saved.get("run_id"),
                            resume_step=start_step if resume_dir is not None else None)
    sinks.handle(Start(info, run_dir))
    if config.wandb and config.wandb_log_dataset and resume_dir is None and writes:
        log_dataset(sinks, config, base_dir)
    return sinks, console, info


def wandb_options(config: TrainConfig, run_dir: Path) -> WandbOptions | None:
    """W&B's options; opt-in only: an API key in the environment is not a request to log."""
    if not config.wandb:
        return None
    return WandbOptions(project=config.wandb_project, entity=config.wandb_entity,
                        name=config.wandb_run_name or run_dir.name, tags=config.wandb_tags, notes=config.wandb_notes,
                        log_checkpoints=config.wandb_log_checkpoints, chart_every=config.wandb_chart_every)


def trackio_options(config: TrainConfig, run_dir: Path) -> TrackioOptions | None:
    return TrackioOptions(project=config.trackio_project, name=run_dir.name) if config.trackio else None


def open_recorder(trainer: Trainer, rules: list, sinks: SinkSet, console: TrainingConsole,
                  saved: dict[str, Any]) -> RunRecorder:
    """The recorder: trackers, alerts, the system sampler, the console; a resume restores their state."""
    config = trainer.config
    recorder = RunRecorder(
        [f.name for f in trainer.reward_fns], rules, sinks=sinks, console=console,
        sampler=SystemSampler(accel_memory=accel_memory).start(), reward_fns=trainer.reward_fns,
        components={"adaptive_window": trainer.window} if trainer.window is not None else {},
        hist_every=config.histogram_every, log_every=config.log_every, num_steps=config.num_steps,
        num_iterations=config.num_iterations, samples_per_step=config.samples_per_step)
    if "run_state" in saved:
        recorder.load_state_dict(saved["run_state"])
    return recorder


def announce(run: Run, memory_plan: str, memory_warning: str | None) -> None:
    """Say what runs: the model and batch, the memory plan, what loading changed, where Trackio stores,
    warnings, and the reward functions' own lines."""
    trainer, config, say = run.trainer, run.config, run.recorder.message
    total_params, trainable_params = count_parameters(trainer.policy.model)
    say(f"run {run.run_dir}  model {config.model_id}: {total_params:,} parameters, {trainable_params:,} "
        f"trainable; {config.batch_size} prompts x {config.num_generations} completions per step (batch_size "
        f"counts prompts)")
    say(memory_plan)
    if trainer.policy.load_note is not None:
        say(trainer.policy.load_note)
    if config.trackio and "trackio" in run.recorder.sinks.active:
        say(f"trackio: run {run.run_dir.name} of project {config.trackio_project}, stored offline in "
            f"{trackio_store()} (trackio show --project {config.trackio_project})")
    for warning in (memory_warning, chunk_ignored(trainer.policy.model, config)):
        if warning is not None:
            say(warning, style="yellow")
    for fn in trainer.reward_fns:
        if (line := fn.hooks.describe()) is not None:
            say(line)


# ----------------------------------------------------------------------------- what comes after a step

@dataclass
class Continue:
    """Go on to the next step."""


@dataclass
class RollBack:
    """An alert rule with `action: rollback` fired: back to the last checkpoint from before it, remedied."""

    alert: Alert


@dataclass
class Stop:
    """Checkpoint and stop, every rank at the same step: a signal's name, or ALERT_STOP and a rule's name."""

    request: str

    @property
    def by_alert(self) -> str | None:
        """The alert rule that stopped the run, if one did."""
        return self.request.removeprefix(ALERT_STOP) if self.request.startswith(ALERT_STOP) else None


@dataclass
class Fail:
    """Write the step and stop with this error (its message and exit code), keeping the checkpoints there are."""

    error: UserError


Next = Continue | RollBack | Stop | Fail


def after_step(run: Run, report: StepReport, stop: StopRequest) -> Next:
    """The one decision after each step's record: go on, roll back, stop, or fail."""
    config, recorder, step = run.config, run.recorder, report.step
    if recorder.nonfinite_in_a_row >= config.max_consecutive_nonfinite:  # the last good checkpoint stays
        return Fail(UserError(nonfinite_stop_message(recorder.nonfinite_in_a_row, step, run.run_dir, config),
                              exit_code=EXIT_GUARD_STOP))
    can_roll_back = run.rollbacks < config.max_rollbacks
    rollback = rollback_alert(report) if can_roll_back and step != config.num_steps else None
    if rollback is not None and not stop.requested:
        return RollBack(rollback)
    # a stop is a signal's name or an alert rule with `action: stop` (or `rollback`, none left)
    stopping = run.trainer.world.agree(stop.requested or alert_stop_request(report, can_roll_back))
    return Stop(stopping) if stopping else Continue()


# ----------------------------------------------------------------------------- the loop

def train(config: TrainConfig, base_dir: Path, resume_dir: Path | None = None) -> dict[str, Any]:
    """Run GRPO; returns the final metrics plus the run directory and status."""
    run = open_run(config, base_dir, resume_dir)
    status, ending = "failed", None
    try:
        with run.recorder.console, StopRequest() as stop:
            ending = run_steps(run, stop)
        status = "interrupted" if isinstance(ending, Stop) else "finished"
    except KeyboardInterrupt:
        status = "interrupted"
        if run.writes:  # rank 0 speaks for the run
            report_stop(run.run_dir, run.step, checkpoint_saved=False)
        raise
    except RuntimeError as err:
        if not run.trainer.world.lost_peer(err):
            raise
        raise UserError(peer_lost_message(run.trainer.world.rank, run.step, run.run_dir),
                        exit_code=EXIT_PEER_LOST) from None
    except RunDirWriteError as err:
        raise UserError(f"{err}; stopped at step {run.step}. The last complete checkpoint is untouched: free some "
                        f"space, then continue with: {resume_command(run.run_dir)}") from None
    finally:
        final = finish(run, status)
    stopped_by = ending.by_alert if isinstance(ending, Stop) else None
    return {**final, "status": status, "run_dir": str(run.run_dir),
            **({"stopped_by_alert": stopped_by} if stopped_by is not None else {})}


def run_steps(run: Run, stop: StopRequest) -> Next:
    """The steps: step, evaluate when due, record, decide, checkpoint when due, write, act. Returns how they
    ended: Continue (every step done) or Stop."""
    if run.start_step == 0:
        before_first_update(run)
    for run.step in range(run.start_step + 1, run.config.num_steps + 1):
        run.report = record_step(run, run.step)
        decision = write_step(run, run.report, after_step(run, run.report, stop))
        if isinstance(decision, RollBack):
            roll_back(run, decision.alert, run.step)
        elif isinstance(decision, Fail):
            raise decision.error
        elif isinstance(decision, Stop):
            say_stop(run, decision)
            return decision
    return Continue()


def record_step(run: Run, step: int) -> StepReport:
    """One step (rollout, rewards, advantages, reference, update: the global batch's data), the held-out
    evaluation when due, and the step's record, trackers and alerts."""
    trainer, config = run.trainer, run.config
    epoch = trainer.order.epoch
    data = trainer.step(step)
    evaluation = trainer.evaluate(data.peak_memory) if eval_due(step, config) else None
    report = run.recorder.record_step(data, evaluation, epoch_ended=trainer.order.epoch != epoch,
                                      last=step == config.num_steps)
    if data.entropy_dump is not None:
        run.recorder.sinks.handle(EntropyDump(data.entropy_dump))
    return report


def write_step(run: Run, report: StepReport, decision: Next) -> Next:
    """Write the step's record, with a checkpoint first when one is due (timed in the record) or the run
    stops. A full disk found while writing turns the decision into a stop with a checkpoint."""
    recorder, step = run.recorder, report.step
    if isinstance(decision, (RollBack, Fail)):
        recorder.write(report)
        return decision
    config = run.config
    due_now = (due(step, config.checkpoint_every, config.num_steps) or step == config.num_steps
               or isinstance(decision, Stop))
    pending = prepare(run, step) if run.writes and due_now else None
    recorder.write(report, checkpoint_s=pending.seconds if pending is not None else None)
    out_of_space = recorder.sinks.out_of_space if run.writes else None
    if out_of_space:
        # the step's records went into the space set aside: checkpoint now (a checkpoint that does not fit
        # is refused in one line, as at any step) and stop, every step written
        pending = pending or prepare(run, step)
        decision = Fail(UserError(f"the disk of the run directory is full ({out_of_space}); stopped after step "
                                  f"{step}, checkpoint saved, every step written. Free some space, then continue "
                                  f"with: {resume_command(run.run_dir)}"))
    if pending is not None:
        recorder.sinks.handle(Flush())  # the step's TensorBoard events are on disk before the checkpoint is
        path = pending.commit({"log_positions": log_positions(run.run_dir)})
        recorder.sinks.handle(Artifact("checkpoint", step=step, path=path))
        mx.clear_cache()  # the checkpoint's host copies: not kept (and wired) until the run ends
    return decision


def say_stop(run: Run, stop: Stop) -> None:
    """Say why the run stopped and how to continue it. Said now, while nothing can go wrong: a second
    Ctrl-C during the cleanup ends it at once."""
    if stop.by_alert is not None:
        # Plain stderr, one line, like report_stop: the command must paste as is.
        print(f"mlx-grpo: {alert_stop_message(stop.by_alert, run.step, run.run_dir)}", file=sys.stderr, flush=True)
    elif run.writes:
        report_stop(run.run_dir, run.step, checkpoint_saved=True)


def peer_lost_message(rank: int, step: int, run_dir: Path) -> str:
    """The line said when a data-parallel rank lost a peer: the last checkpoint and the resume command."""
    last = latest_checkpoint(RunPaths(run_dir).checkpoints)
    saved = f"the last checkpoint is {last.name}" if last is not None else "there is no checkpoint yet"
    return (f"rank {rank} lost another process of the run during step {step} (it was stopped or died); "
            f"{saved}, the run directory has every record up to it. Continue with the same mlx.launch command "
            f"and: {resume_command(run_dir)}")


def before_first_update(run: Run) -> None:
    """Step 0 of a new run: the held-out accuracy before the first update, where the policy started (a run
    restarted from scratch has it already), and, when a rule can roll back, a checkpoint of the starting
    weights for a rollback in the first steps to go back to."""
    trainer, recorder = run.trainer, run.recorder
    if trainer.config.eval_every > 0 and trainer.correctness is not None and run.last_record.get("step") != 0:
        recorder.write(recorder.record_evaluation(0, trainer.evaluate()))
    if run.writes and any(rule.action == "rollback" for rule in recorder.engine.rules):
        prepare(run, 0).commit({"log_positions": log_positions(run.run_dir)})


def alert_stop_request(report: StepReport, can_roll_back: bool = True) -> str | None:
    """The stop request of the first alert of the step whose rule has `action: stop` (or `rollback` when the
    run has no rollback left), if any."""
    stops = ("stop",) if can_roll_back else ("stop", "rollback")
    return next((ALERT_STOP + alert.rule for alert in report.alerts if alert.action in stops), None)


def rollback_alert(report: StepReport) -> Alert | None:
    """The step's first alert whose rule has `action: rollback`, if any."""
    return next((alert for alert in report.alerts if alert.action == "rollback"), None)


def roll_back(run: Run, alert: Alert, step: int) -> None:
    """Restore the last checkpoint saved before the alert's condition began to hold, apply its rule's remedy,
    and record the rollback as an event: an alert of rule 'rollback' (alerts.jsonl, TensorBoard's alerts
    text, W&B, the dashboard's Alerts view, the report) and the checkpoint state's count and factors."""
    trainer, recorder = run.trainer, run.recorder
    rule = next(r for r in recorder.engine.rules if r.name == alert.rule)
    began = step - rule.for_steps + 1
    candidates = [p for p in list_checkpoints(RunPaths(run.run_dir).checkpoints) if int(p.name.split("_")[1]) < began]
    if not candidates:
        raise UserError(f"alert rule '{rule.name}' (action: rollback) fired at step {step} and no checkpoint "
                        f"from before step {began} is left to go back to", exit_code=EXIT_GUARD_STOP)
    checkpoint = candidates[-1]
    factors = dict(rule.remedy)
    before = (trainer.config.learning_rate, trainer.config.beta)
    trainer.roll_back(checkpoint, factors)
    run.rollbacks += 1
    for key, factor in factors.items():
        run.remedy[key] = run.remedy.get(key, 1.0) * factor
    after = (trainer.config.learning_rate, trainer.config.beta)
    changes = ", ".join(f"{label} {old:g} -> {new:g}" for label, key, old, new in
                        (("learning rate", "learning_rate", before[0], after[0]), ("beta", "beta", before[1], after[1]))
                        if key in factors) or "no remedy"
    event = Alert(step=step, time=time.time(), level="warning", rule="rollback", metric=alert.metric,
                  value=alert.value, action="rollback",
                  message=f"rolled back to {checkpoint.name} after '{rule.name}' at step {step} "
                          f"(rollback {run.rollbacks} of {trainer.config.max_rollbacks}); {changes}; "
                          f"training goes on at step {step + 1}")
    recorder.alert(event)


def alert_stop_message(rule: str, step: int, run_dir: Path) -> str:
    """The line said when an alert rule stopped the run, with the command that continues it."""
    return (f"alert rule '{rule}' (action: stop) stopped the run after step {step}, checkpoint saved; "
            f"continue with: {resume_command(run_dir)}")


def log_dataset(sinks: SinkSet, config: TrainConfig, base_dir: Path) -> None:
    """The rows of the run's train and held-out splits, to the sinks that keep datasets (W&B's worker
    thread writes and uploads them; the training thread only hands the lists over)."""
    train_rows, heldout_rows = load_datasets(config, base_dir)
    name = "arithmetic" if config.dataset == "arithmetic" else Path(config.dataset).stem
    sinks.handle(Artifact(
        "dataset", name=f"{name}-seed{config.seed}" if config.dataset == "arithmetic" else name,
        splits={"train": train_rows, "heldout": heldout_rows},
        metadata={"dataset": config.dataset, "eval_dataset": config.eval_dataset,
                  "dataset_format": config.dataset_format, "prompt_field": config.prompt_field,
                  "answer_field": config.answer_field, "train_size": config.train_size,
                  "eval_size": config.eval_size, "seed": config.seed}))


def log_final_model(run: Run, step: int) -> None:
    """With `wandb_log_model`, the final policy as a model directory (adapters fused) in `final_model/` of the
    run directory, logged by W&B as a model artifact. A failure here is a warning: the run is already done."""
    from .export import write_fused

    trainer, recorder = run.trainer, run.recorder
    try:
        path = write_fused(RunPaths(run.run_dir).final_model, trainer.policy.model, trainer.policy.tokenizer,
                           trainer.config.model_id, run.base_dir)
    except (UserError, OSError, ValueError) as err:
        recorder.message(f"warning: the final model was not logged to W&B: {err}", style="yellow")
        return
    recorder.sinks.handle(Artifact("model", step=step, path=path))


def due(step: int, every: int, num_steps: int) -> bool:
    """Every `every` steps (0: never) and at the last step."""
    return bool(every) and (step % every == 0 or step == num_steps)


def eval_due(step: int, config: TrainConfig) -> bool:
    """Every eval_every steps and at the end; the run's first evaluation is made before step 1's update
    (step 0's record), so the held-out curve starts where the model started."""
    return due(step, config.eval_every, config.num_steps)


def prepare(run: Run, step: int) -> PendingCheckpoint:
    """Everything a resume needs, written but not yet in place: it is committed once the step's record
    is written, with the logs' lengths at that moment (a crash in between leaves the previous one)."""
    trainer, recorder = run.trainer, run.recorder
    state = {"order": trainer.order.state(), "run_id": run.run_id,
             "config": scrub_secrets(dataclasses.asdict(trainer.config)), "run_state": recorder.state_dict(),
             "rollbacks": run.rollbacks, "remedy": run.remedy, **trainer.world.checkpoint_state()}
    return prepare_checkpoint(RunPaths(run.run_dir).checkpoints, step, trainer.policy.model, trainer.optimizer, state,
                              trainer.adapter_config(), trainer.config.keep_checkpoints)


def finish(run: Run, status: str) -> dict[str, Any]:
    """Close the run: final metrics, the sinks, and on a finished run the report and its last line."""
    recorder, step = run.recorder, run.step
    if status == "finished" and run.writes and run.config.wandb_log_model and "wandb" in recorder.sinks.active:
        log_final_model(run, step)
    last = run.report.record if run.report is not None else run.last_record
    final = recorder.final_metrics(step, status == "finished", run.run_dir if run.writes else None, last)
    recorder.close(final, status)
    if run.lock is not None:
        run.lock.release()
    if status == "finished" and run.writes:
        say_finished(run)
    return final


def say_finished(run: Run) -> None:
    """The finished run's report.json and its last line."""
    from .telemetry.analysis.report import write_report

    recorder, step = run.recorder, run.step
    try:
        reward_report = write_report(run.run_dir)
    except OSError as err:  # a disk that filled at the very end: the run itself is complete
        recorder.message(f"finished {step} steps; report.json could not be written ({err.strerror or err}): "
                         f"mlx-grpo report {run.run_dir} prints it", style="yellow")
        return
    recorder.message(f"finished {step} steps in {recorder.elapsed():.0f} s: {reward_report.outcome.headline()}"
                     f"; reward functions' {reward_report.quality.headline()} — run directory: {run.run_dir}")


def nonfinite_stop_message(count: int, step: int, run_dir: Path, config: TrainConfig) -> str:
    """The line said when repeated non-finite updates stopped the run."""
    return (f"{count} updates in a row had a NaN or Inf loss or gradient (each was skipped: the weights never "
            f"saw them); stopped at step {step}. Continue from the last checkpoint with a lower learning rate: "
            f"{resume_command(run_dir)} --learning-rate {config.learning_rate / 10:g}")
