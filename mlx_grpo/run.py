"""A run's life: open it (resume, the run directory, sinks, recorder), train step by step, checkpoint, finish.

Read `train()` top to bottom: open the run, then per step: step, evaluate when due, record, checkpoint when
due, write. The step itself is trainer.py's; this module owns everything around it."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten

from .checkpoint import PendingCheckpoint, latest_checkpoint, list_checkpoints, load_checkpoint, prepare_checkpoint
from .config import TrainConfig, config_to_dict
from .console import TrainingConsole
from .data import load_datasets
from .errors import UserError
from .extras import entropy_dump
from .distributed import init_world
from .machine import accel_memory, describe_device, matmul_peak_flops, share_memory_with, versions, wire_memory
from .models import chunk_ignored, count_parameters, resolve_dtype
from .plan import fit_run
from .resume import last_record, log_positions, resumable_checkpoint, resume_command, truncate_logs
from .run_lock import RunLock, create_run_dir
from .signals import StopRequest, report_stop
from .telemetry.alerts.alert import Alert
from .telemetry.alerts.config import check_rule_metrics, load_alert_rules, rules_from_config, with_on_alert
from .telemetry.alerts.console import format_alert
from .telemetry.metrics.system import SystemSampler
from .telemetry.recorder import RunRecorder, StepReport
from .telemetry.rundir.completions import CompletionsWriter, truncate_completions
from .telemetry.rundir.writer import RunDirWriteError, scrub_secrets
from .telemetry.units import plural
from .telemetry.sinks import make_sinks
from .telemetry.sinks.trackio import TrackioOptions, trackio_store
from .telemetry.sinks.wandb import WandbOptions
from .telemetry.terminal import terminal_safe
from .trainer import Trainer, remedied


@dataclass
class Run:
    """An opened run: its directory, the trainer, the recorder and where the steps start."""

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


def new_run_dir(config: TrainConfig) -> tuple[Path, RunLock]:
    """A new run directory, created by this process alone (two runs named alike get two directories).
    Outputs go where the user stands, as with every other trainer: `mlx-grpo train cfg/my.yaml` writes
    to ./runs, where `mlx-grpo watch` and `tensorboard --logdir runs` look. (Inputs named inside a
    config, such as datasets and reward files, resolve against the config file.)"""
    return create_run_dir(Path(config.monitoring_dir).expanduser(),
                          config.run_name or time.strftime("grpo-%Y%m%d-%H%M%S"))


def open_run(config: TrainConfig, base_dir: Path, resume_dir: Path | None) -> Run:
    """Build the trainer, restore a checkpoint when resuming, and assemble the recorder and its sinks."""
    # refuse early: a mistake in the alert file, a run that cannot fit, before anything loads
    checkpoint = resumable_checkpoint(resume_dir, config.num_steps) if resume_dir is not None else None
    rules = alert_rules(config, base_dir)
    share_memory_with(init_world().ranks_on_this_host())  # before the plan: ranks on one Mac share it
    config, memory_plan, planned_peak = fit_run(config, base_dir)
    remedy: dict[str, float] = {}
    if checkpoint is not None:  # rollbacks before the checkpoint changed the learning rate and beta: keep them
        remedy = json.loads((checkpoint / "state.json").read_text()).get("remedy", {})
        config = remedied(config, remedy)
    # the trainer: model, reference, rewards, data, optimiser
    trainer = Trainer.build(config, base_dir)
    world = trainer.world
    # the directory: rank 0 creates it (or takes the resumed one) and locks it for the run
    main_dir, lock = None, None
    if world.is_main:
        main_dir, lock = (resume_dir, RunLock(resume_dir).acquire()) if resume_dir else new_run_dir(config)
    run_dir = Path(world.from_main(str(main_dir) if world.is_main else ""))
    memory_warning = wire_memory(resident_bytes(trainer), planned_peak)
    trainer.peak_flops_per_s = matmul_peak_flops()  # perf/mfu's denominator
    # resume: the checkpoint's weights, optimiser and data order; the logs cut back to it
    saved: dict[str, Any] = {}
    if checkpoint is not None:
        saved = load_checkpoint(checkpoint, trainer.policy.model, trainer.optimizer)
        world.check_resume(saved, checkpoint)
        trainer.order.load_state(saved["order"])
    if resume_dir is not None and world.is_main:
        truncate_logs(run_dir, saved.get("log_positions"), saved.get("step", 0))
        truncate_completions(run_dir, saved.get("step", 0))
    start_step = saved.get("step", 0)
    # sinks: the run directory always, TensorBoard, W&B and Trackio as configured (rank 0 writes)
    console = TrainingConsole(config.num_steps, start_step)
    console.console.quiet = not world.is_main  # rank 0 speaks for the run
    wandb = None
    if config.wandb:  # opt-in only: an API key in the environment is not a request to log
        wandb = WandbOptions(project=config.wandb_project, entity=config.wandb_entity,
                             name=config.wandb_run_name or run_dir.name, tags=config.wandb_tags,
                             notes=config.wandb_notes, log_checkpoints=config.wandb_log_checkpoints,
                             chart_every=config.wandb_chart_every)
    trackio = TrackioOptions(project=config.trackio_project, name=run_dir.name) if config.trackio else None
    sinks = world.sinks(lambda: make_sinks(
        run_dir, tensorboard=config.tensorboard, tensorboard_dir=config.tensorboard_dir, wandb=wandb,
        trackio=trackio, warn=lambda m: console.message(m, style="yellow"),
        purge_step=start_step + 1 if resume_dir is not None else None), run_dir)
    run_info = sinks.start(run_dir.name, {**config_to_dict(config), "base_dir": str(base_dir)}, versions(),
                           {**describe_device(resolve_dtype(config)), **world.describe()}, config.num_steps,
                           run_id=saved.get("run_id"), resume_step=start_step if resume_dir is not None else None)
    if wandb is not None and config.wandb_log_dataset and resume_dir is None and world.is_main:
        log_dataset(sinks, config, base_dir)
    # the recorder: trackers, alerts, the system sampler, the console; a resume restores their state
    recorder = RunRecorder(
        [f.name for f in trainer.reward_fns], rules, sinks=sinks, console=console,
        sampler=SystemSampler(accel_memory=accel_memory).start(), reward_fns=trainer.reward_fns,
        components={"adaptive_window": trainer.window} if trainer.window is not None else {},
        hist_every=config.histogram_every, log_every=config.log_every, num_steps=config.num_steps,
        num_iterations=config.num_iterations,
        completions=CompletionsWriter(run_dir, config.completions_max_mb)
        if config.keep_completions and world.is_main else None)
    if "run_state" in saved:
        recorder.load_state_dict(saved["run_state"])
    # say what runs
    total_params, trainable_params = count_parameters(trainer.policy.model)
    console.message(f"run {run_dir}  model {config.model_id}: {total_params:,} parameters, "
                    f"{trainable_params:,} trainable; {config.batch_size} prompts x {config.num_generations} "
                    f"completions per step (batch_size counts prompts)")
    console.message(memory_plan)
    if trainer.policy.load_note is not None:
        console.message(trainer.policy.load_note)
    if trackio is not None and "trackio" in sinks.active:
        console.message(f"trackio: run {trackio.name} of project {trackio.project}, stored offline in "
                        f"{trackio_store()} (trackio show --project {trackio.project})")
    for warning in (memory_warning, chunk_ignored(trainer.policy.model, config)):
        if warning is not None:
            console.message(warning, style="yellow")
    for fn in trainer.reward_fns:
        if (line := fn.hooks.describe()) is not None:
            console.message(line)
    return Run(run_dir, trainer, recorder, start_step, run_info.run_id,
               last_record(run_dir) if resume_dir is not None else {}, base_dir, lock,
               rollbacks=int(saved.get("rollbacks", 0)), remedy=remedy)


def resident_bytes(trainer: Trainer) -> int:
    """What stays in memory all run: the weights in the run's dtype, a frozen reference copy, and AdamW's
    two moments per trainable value. Counted from the arrays' shapes: the moments are built at the first
    update and a dtype cast is still lazy here, so the allocator's counter would read low."""
    def nbytes(tree: Any) -> int:
        return sum(v.nbytes for _, v in tree_flatten(tree))

    model, reference = trainer.policy.model, trainer.reference
    copy = nbytes(reference.model.parameters()) if reference is not None and not reference.uses_adapters_off else 0
    return nbytes(model.parameters()) + copy + 2 * nbytes(model.trainable_parameters())


def train(config: TrainConfig, base_dir: Path, resume_dir: Path | None = None) -> dict[str, Any]:
    """Run GRPO; returns the final metrics plus the run directory and status."""
    run = open_run(config, base_dir, resume_dir)
    trainer, recorder, world, run_dir = run.trainer, run.recorder, run.trainer.world, run.run_dir
    step, report, status, stopping, stopped_by = run.start_step, None, "failed", None, None
    stop = StopRequest()
    try:
        with recorder.console, stop:
            if run.start_step == 0:
                before_first_update(run)
            for step in range(run.start_step + 1, config.num_steps + 1):
                # rollout, rewards, advantages, reference, update: the global batch's data
                epoch, last = trainer.order.epoch, step == config.num_steps
                data = trainer.step(step)
                evaluation = trainer.evaluate(data.peak_memory) if eval_due(step, config) else None
                # the step's record, trackers and alerts
                report = recorder.record_step(data, evaluation, epoch_ended=trainer.order.epoch != epoch, last=last)
                if data.entropy_dump is not None and world.is_main:
                    entropy_dump.write_dump(run_dir, data.entropy_dump)
                # repeated non-finite updates: write the step and stop, keeping the last good checkpoint
                if recorder.nonfinite_in_a_row >= config.max_consecutive_nonfinite:
                    recorder.write(report)
                    raise UserError(nonfinite_stop_message(recorder.nonfinite_in_a_row, step, run_dir, config),
                                    exit_code=EXIT_GUARD_STOP)
                # an alert rule with `action: rollback`: back to the last checkpoint from before it, remedied
                can_roll_back = run.rollbacks < config.max_rollbacks
                rollback = rollback_alert(report) if can_roll_back and not last else None
                if rollback is not None and not stop.requested:
                    recorder.write(report)
                    roll_back(run, rollback, step)
                    continue
                # checkpoint when due (timed in this step's record), then write the record;
                # a stop is a signal's name or an alert rule with `action: stop` (or `rollback`, none left)
                stopping = world.agree(stop.requested or alert_stop_request(report, can_roll_back))
                pending = None
                if world.is_main and (due(step, config.checkpoint_every, config.num_steps) or last or stopping):
                    pending = prepare(trainer, recorder, run, step)
                recorder.write(report, checkpoint_s=pending.seconds if pending is not None else None)
                out_of_space = world.is_main and getattr(recorder.sinks, "out_of_space", None)
                if out_of_space and pending is None:
                    # the step's records went into the space set aside: checkpoint now (a checkpoint that does
                    # not fit is refused in one line, as at any step) and stop, every step written
                    pending = prepare(trainer, recorder, run, step)
                if pending is not None:
                    recorder.sinks.flush()  # the step's TensorBoard events are on disk before the checkpoint is
                    recorder.sinks.log_checkpoint(pending.commit({"log_positions": log_positions(run_dir)}), step)
                    mx.clear_cache()  # the checkpoint's host copies: not kept (and wired) until the run ends
                if out_of_space:
                    raise UserError(f"the disk of the run directory is full ({out_of_space}); stopped after step "
                                    f"{step}, checkpoint saved, every step written. Free some space, then continue "
                                    f"with: {resume_command(run_dir)}")
                # stop when asked (Ctrl-C, SIGTERM), every rank at the same step
                if stopping:
                    # Said now, while nothing can go wrong: a second Ctrl-C during the cleanup ends it at once.
                    stopped_by = stopping.removeprefix(ALERT_STOP) if stopping.startswith(ALERT_STOP) else None
                    if stopped_by is not None:
                        # Plain stderr, one line, like report_stop: the command must paste as is.
                        print(f"mlx-grpo: {alert_stop_message(stopped_by, step, run_dir)}", file=sys.stderr,
                              flush=True)
                    elif world.is_main:
                        report_stop(run_dir, step, checkpoint_saved=True)
                    break
        status = "interrupted" if stopping else "finished"
    except KeyboardInterrupt:
        status = "interrupted"
        if world.is_main:  # rank 0 speaks for the run
            report_stop(run_dir, step, checkpoint_saved=False)
        raise
    except RuntimeError as err:
        if not world.lost_peer(err):
            raise
        raise UserError(peer_lost_message(world.rank, step, run_dir), exit_code=EXIT_PEER_LOST) from None
    except RunDirWriteError as err:
        raise UserError(f"{err}; stopped at step {step}. The last complete checkpoint is untouched: free some "
                        f"space, then continue with: {resume_command(run_dir)}") from None
    finally:
        final = finish(run, step, status, report)
    return {**final, "status": status, "run_dir": str(run_dir),
            **({"stopped_by_alert": stopped_by} if stopped_by is not None else {})}


EXIT_PEER_LOST = 4  # a data-parallel rank lost another (killed, crashed): mlx.launch itself still exits 0


def peer_lost_message(rank: int, step: int, run_dir: Path) -> str:
    """The line said when a data-parallel rank lost a peer: the last checkpoint and the resume command."""
    last = latest_checkpoint(run_dir / "checkpoints")
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
    if trainer.world.is_main and any(rule.action == "rollback" for rule in recorder.engine.rules):
        prepare(trainer, recorder, run, 0).commit({"log_positions": log_positions(run.run_dir)})


ALERT_STOP = "alert:"  # a stop request from an alert rule: this prefix and the rule's name


EXIT_GUARD_STOP = 3  # the exit code of a run a guard stopped: repeated non-finite updates, an alert's `action: stop`


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
    candidates = [p for p in list_checkpoints(run.run_dir / "checkpoints") if int(p.name.split("_")[1]) < began]
    if not candidates:
        raise UserError(f"alert rule '{rule.name}' (action: rollback) fired at step {step} and no checkpoint "
                        f"from before step {began} is left to go back to", exit_code=EXIT_GUARD_STOP)
    checkpoint = candidates[-1]
    factors = dict(rule.remedy)
    before = (trainer.config.learning_rate, trainer.config.beta)
    trainer.roll_back(checkpoint, factors)
    rearm_alert_rules(recorder, checkpoint)
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
    if recorder.sinks is not None:
        recorder.sinks.write_alert(event)
    recorder.message(format_alert(event))


def rearm_alert_rules(recorder: RunRecorder, checkpoint: Path) -> None:
    """The alert rules as they were at `checkpoint`: their latches, cooldowns, windows and baselines. The
    policy is back there, so the rules judge what follows afresh: a second collapse fires again (and rolls
    back again or, with no rollback left, stops the run) instead of sitting in the first alert's cooldown,
    and the windows hold no steps of the discarded policy."""
    saved = json.loads((checkpoint / "state.json").read_text())
    recorder.engine.load_state_dict(saved["run_state"]["alerts"])


def alert_stop_message(rule: str, step: int, run_dir: Path) -> str:
    """The line said when an alert rule stopped the run, with the command that continues it."""
    return (f"alert rule '{rule}' (action: stop) stopped the run after step {step}, checkpoint saved; "
            f"continue with: {resume_command(run_dir)}")


def log_dataset(sinks: Any, config: TrainConfig, base_dir: Path) -> None:
    """The rows of the run's train and held-out splits, to the sinks that keep datasets (W&B's worker
    thread writes and uploads them; the training thread only hands the lists over)."""
    train_rows, heldout_rows = load_datasets(config, base_dir)
    name = "arithmetic" if config.dataset == "arithmetic" else Path(config.dataset).stem
    sinks.log_dataset(f"{name}-seed{config.seed}" if config.dataset == "arithmetic" else name,
                      {"train": train_rows, "heldout": heldout_rows},
                      {"dataset": config.dataset, "eval_dataset": config.eval_dataset,
                       "dataset_format": config.dataset_format, "prompt_field": config.prompt_field,
                       "answer_field": config.answer_field, "train_size": config.train_size,
                       "eval_size": config.eval_size, "seed": config.seed})


def log_final_model(run: Run, step: int) -> None:
    """With `wandb_log_model`, the final policy as a model directory (adapters fused) in `final_model/` of the
    run directory, logged by W&B as a model artifact. A failure here is a warning: the run is already done."""
    from .export import write_fused

    trainer, recorder = run.trainer, run.recorder
    try:
        path = write_fused(run.run_dir / "final_model", trainer.policy.model, trainer.policy.tokenizer,
                           trainer.config.model_id, run.base_dir)
    except (UserError, OSError, ValueError) as err:
        recorder.message(f"warning: the final model was not logged to W&B: {err}", style="yellow")
        return
    recorder.sinks.log_model(path, step)


def due(step: int, every: int, num_steps: int) -> bool:
    """Every `every` steps (0: never) and at the last step."""
    return bool(every) and (step % every == 0 or step == num_steps)


def eval_due(step: int, config: TrainConfig) -> bool:
    """Every eval_every steps and at the end; the run's first evaluation is made before step 1's update
    (step 0's record), so the held-out curve starts where the model started."""
    return due(step, config.eval_every, config.num_steps)


def prepare(trainer: Trainer, recorder: RunRecorder, run: Run, step: int) -> PendingCheckpoint:
    """Everything a resume needs, written but not yet in place: it is committed once the step's record
    is written, with the logs' lengths at that moment (a crash in between leaves the previous one)."""
    state = {"order": trainer.order.state(), "run_id": run.run_id,
             "config": scrub_secrets(dataclasses.asdict(trainer.config)), "run_state": recorder.state_dict(),
             "rollbacks": run.rollbacks, "remedy": run.remedy, **trainer.world.checkpoint_state()}
    return prepare_checkpoint(run.run_dir / "checkpoints", step, trainer.policy.model, trainer.optimizer, state,
                              trainer.adapter_config(), trainer.config.keep_checkpoints)


def finish(run: Run, step: int, status: str, last_step: StepReport | None) -> dict[str, Any]:
    """Close the run: final metrics, the sinks, and on a finished run the report and its last line."""
    recorder, world = run.recorder, run.trainer.world
    if (status == "finished" and world.is_main and run.trainer.config.wandb_log_model
            and "wandb" in recorder.sinks.active):
        log_final_model(run, step)
    last = last_step.record if last_step is not None else run.last_record
    final = recorder.final_metrics(step, status == "finished", run.run_dir if world.is_main else None, last)
    recorder.close(final, status)
    if run.lock is not None:
        run.lock.release()
    if status == "finished" and world.is_main:
        from .telemetry.analysis.report import write_report

        try:
            reward_report = write_report(run.run_dir)
        except OSError as err:  # a disk that filled at the very end: the run itself is complete
            recorder.message(f"finished {plural(step, 'step')}; report.json could not be written ({err.strerror or err}): "
                             f"mlx-grpo report {run.run_dir} prints it", style="yellow")
            return final
        recorder.message(f"finished {plural(step, 'step')} in {recorder.elapsed():.0f} s: "
                         f"{reward_report.last_line()} — run directory: {run.run_dir}")
    return final


def nonfinite_stop_message(count: int, step: int, run_dir: Path, config: TrainConfig) -> str:
    """The line said when repeated non-finite updates stopped the run."""
    return (f"{count} updates in a row had a NaN or Inf loss or gradient (each was skipped: the weights never "
            f"saw them); stopped at step {step}. Continue from the last checkpoint with a lower learning rate: "
            f"{resume_command(run_dir)} --learning-rate {config.learning_rate / 10:g}")
