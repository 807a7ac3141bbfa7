"""A run's life after it opens (opening.py): the steps, the one decision after each, checkpoints, the end.

Read `train()` and `run_steps()` top to bottom: per step, step (trainer.py), evaluate when due, record
(the recorder), decide (`after_step`: Continue, RollBack, Stop or Fail), choose the checkpoint (`checkpoint_due`:
when due, stopping, or at a new best held-out accuracy), write, stop on a full disk, checkpoint, act.
Every run-level choice is made here: whether to go on, roll back or stop, and that only rank 0 writes."""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx

from ..checkpoint import PendingCheckpoint, latest_checkpoint, list_checkpoints, prepare_checkpoint, read_state
from ..common.errors import UserError
from ..common.secrets import scrub_secrets
from ..common.units import plural
from ..config.train_config import TrainConfig
from ..extras.entropy_dump import EntropyDump
from ..telemetry.alerts.alert import Alert
from ..telemetry.alerts.remedy import Remedy
from ..telemetry.events import Artifact, Flush
from ..telemetry.metrics.names import EVAL_ACCURACY
from ..telemetry.recorder import RunRecorder, StepReport
from ..telemetry.rundir.layout import RunPaths, checkpoint_name, checkpoint_step
from ..telemetry.rundir.writer import RunDirWriteError
from .opening import Run, open_run
from .resume import log_positions, resume_command
from .signals import StopRequest, report_stop

ALERT_STOP = "alert:"  # a stop request from an alert rule: this prefix and the rule's name
EXIT_GUARD_STOP = 3  # the exit code of a run a guard stopped: repeated non-finite updates, an alert's `action: stop`
EXIT_PEER_LOST = 4  # a data-parallel rank lost another (killed, crashed): mlx.launch itself still exits 0


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
        if (failure := metal_failure(err)) is not None:
            raise UserError(f"{failure} during step {run.step}. The checkpoints and records up to the last "
                            f"checkpoint are kept: continue with: {resume_command(run.run_dir)}") from None
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
    """The steps: step, evaluate when due, record, decide, choose the checkpoint, write, stop on a full disk,
    checkpoint, act. Returns how they ended: Continue (every step done) or Stop."""
    if run.start_step == 0:
        before_first_update(run)
    for run.step in range(run.start_step + 1, run.config.num_steps + 1):
        run.report = record_step(run, run.step)
        decision = after_step(run, run.report, stop)
        pending = checkpoint_due(run, run.report, decision)
        write_step(run, run.report, pending)
        decision, pending = stop_on_full_disk(run, decision, pending)
        if pending is not None:
            save_checkpoint(run, pending, run.step)
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


def checkpoint_due(run: Run, report: StepReport, decision: Next) -> PendingCheckpoint | None:
    """The step's checkpoint, prepared when one is due: every checkpoint_every steps, the last step, a stop that
    keeps one, a new best held-out accuracy (the best checkpoint). None after a rollback or a failure, and on the
    ranks that do not write."""
    if isinstance(decision, (RollBack, Fail)):
        return None
    config, step = run.config, report.step
    new_best = note_best_eval(run, report)
    # a collapse rule's stop keeps no checkpoint of the broken policy when one from before it exists: the
    # resume command then continues from there (say_stop names it, with the rule's remedy)
    stop_saves = isinstance(decision, Stop) and way_back(run, decision) is None
    due_now = (due(step, config.checkpoint_every, config.num_steps) or step == config.num_steps
               or stop_saves or new_best)
    return prepare(run, step) if run.writes and due_now else None


def note_best_eval(run: Run, report: StepReport) -> bool:
    """Whether the step's held-out accuracy is the run's best so far (kept in `run.best_eval`)."""
    accuracy = report.record.get(EVAL_ACCURACY)
    new_best = (report.step > 0 and isinstance(accuracy, float) and math.isfinite(accuracy)
                and (run.best_eval is None or accuracy > run.best_eval[1]))
    if new_best:
        run.best_eval = (report.step, accuracy)
    return new_best


def write_step(run: Run, report: StepReport, pending: PendingCheckpoint | None) -> None:
    """Write the step's record, with the time its checkpoint took to prepare."""
    run.recorder.write(report, checkpoint_s=pending.seconds if pending is not None else None)


def stop_on_full_disk(run: Run, decision: Next,
                      pending: PendingCheckpoint | None) -> tuple[Next, PendingCheckpoint | None]:
    """A disk found full while writing the step turns the decision into a stop, with a checkpoint: the step's
    records went into the space set aside, so checkpoint now (a checkpoint that does not fit is refused in one
    line, as at any step) and stop, every step written."""
    if isinstance(decision, (RollBack, Fail)) or not run.writes or not run.recorder.sinks.out_of_space:
        return decision, pending
    step = run.report.step
    return Fail(UserError(f"the disk of the run directory is full ({run.recorder.sinks.out_of_space}); stopped "
                          f"after step {step}, checkpoint saved, every step written. Free some space, then "
                          f"continue with: {resume_command(run.run_dir)}")), pending or prepare(run, step)


def save_checkpoint(run: Run, pending: PendingCheckpoint, step: int) -> None:
    """Commit the prepared checkpoint, the step's TensorBoard events on disk first."""
    recorder = run.recorder
    recorder.sinks.handle(Flush())
    path = pending.commit({"log_positions": log_positions(run.run_dir)})
    recorder.sinks.handle(Artifact("checkpoint", step=step, path=path))
    mx.clear_cache()  # the checkpoint's host copies: not kept (and wired) until the run ends


def say_stop(run: Run, stop: Stop) -> None:
    """Say why the run stopped and how to continue it. Said now, while nothing can go wrong: a second
    Ctrl-C during the cleanup ends it at once."""
    if stop.by_alert is not None:
        # Plain stderr, one line, like report_stop: the command must paste as is.
        back = way_back(run, stop)
        message = alert_stop_message(stop.by_alert, run.step, run.run_dir) if back is None else \
            collapse_stop_message(stop.by_alert, run.step, run.run_dir, back, run.config.learning_rate)
        if back is None and (remedy := stop_remedy(run, stop)) is not None:
            message = broken_stop_message(stop.by_alert, run.step, remedy, run.config.learning_rate)
        print(f"mlx-grpo: {message}", file=sys.stderr, flush=True)
    elif run.writes:
        report_stop(run.run_dir, run.step, checkpoint_saved=True)


METAL_FAILED = "[METAL] Command buffer execution failed"
# what ends a Metal command buffer, by the error name in MLX's message: (cause, what helps)
METAL_CAUSES = {
    "ImpactingInteractivity": ("macOS's GPU watchdog ended a long GPU job while the display was on",
                               "let the display sleep or run over SSH (docs/PLATFORMS.md, \"The GPU watchdog\")"),
    "OutOfMemory": ("the GPU ran out of memory", "check `mlx-grpo plan` and lower micro_batch_size"),
    "Timeout": ("the GPU timed out", "let the display sleep or run over SSH; a new process is needed"),
}


def metal_failure(err: BaseException) -> str | None:
    """What a failed Metal command buffer means, said in one line (MLX 0.32 and later raise it as a
    RuntimeError; before, MLX ends the process); None for any other error."""
    text = str(err)
    if METAL_FAILED not in text:
        return None
    cause, helps = next(((c, h) for name, (c, h) in METAL_CAUSES.items() if name in text),
                        ("the GPU stopped the run's work", "check the message, then resume"))
    detail = text[text.index(METAL_FAILED):].splitlines()[0][:240]
    return f"the Metal GPU failed ({detail}): {cause}; {helps}"


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
        report = recorder.record_evaluation(0, trainer.evaluate())
        recorder.write(report)
        if isinstance(accuracy := report.record.get(EVAL_ACCURACY), float):
            run.best_eval = (0, accuracy)  # what a checkpoint must beat to be kept as the best
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
    candidates = [p for p in list_checkpoints(RunPaths(run.run_dir).checkpoints) if checkpoint_step(p) < began]
    if not candidates:
        raise UserError(f"alert rule '{rule.name}' (action: rollback) fired at step {step} and no checkpoint "
                        f"from before step {began} is left to go back to", exit_code=EXIT_GUARD_STOP)
    checkpoint = candidates[-1]
    before = (trainer.config.learning_rate, trainer.config.beta)
    trainer.roll_back(checkpoint, rule.remedy)
    rearm_alert_rules(recorder, checkpoint)
    run.rollbacks += 1
    run.remedy = run.remedy.then(rule.remedy)
    after = (trainer.config.learning_rate, trainer.config.beta)
    changes = ", ".join(f"{label} {old:g} -> {new:g}" for label, key, old, new in
                        (("learning rate", "learning_rate", before[0], after[0]), ("beta", "beta", before[1], after[1]))
                        if rule.remedy.changes(key)) or "no remedy"
    event = Alert(step=step, time=time.time(), level="warning", rule="rollback", metric=alert.metric,
                  value=alert.value, action="rollback",
                  message=f"rolled back to {checkpoint.name} after '{rule.name}' at step {step} "
                          f"(rollback {run.rollbacks} of {trainer.config.max_rollbacks}); {changes}; "
                          f"training goes on at step {step + 1}")
    recorder.alert(event)


def rearm_alert_rules(recorder: RunRecorder, checkpoint: Path) -> None:
    """The alert rules as they were at `checkpoint`: their latches, cooldowns, windows and baselines. The
    policy is back there, so the rules judge what follows afresh: a second collapse fires again (and rolls
    back again or, with no rollback left, stops the run) instead of sitting in the first alert's cooldown,
    and the windows hold no steps of the discarded policy."""
    recorder.engine.load_state_dict(read_state(checkpoint)["run_state"]["alerts"])


def way_back(run: Run, stop: Stop) -> tuple[Path, Remedy] | None:
    """For a stop by a rule with a remedy (a collapse: the policy is broken), the last checkpoint from before its
    condition began and the remedy's factors; None for any other stop, or with no such checkpoint, or when a
    checkpoint after it exists (the resume would take that one)."""
    rule = next((r for r in run.recorder.engine.rules if r.name == stop.by_alert), None)
    if rule is None or not rule.remedy:
        return None
    checkpoints = list_checkpoints(RunPaths(run.run_dir).checkpoints)
    began = run.step - rule.for_steps + 1
    if not checkpoints or checkpoint_step(checkpoints[-1]) >= began:
        return None
    return checkpoints[-1], rule.remedy


def stop_remedy(run: Run, stop: Stop) -> Remedy | None:
    """The remedy of the rule that stopped the run, when it has one (a collapse: the policy is broken)."""
    rule = next((r for r in run.recorder.engine.rules if r.name == stop.by_alert), None)
    return rule.remedy if rule is not None and rule.remedy else None


def broken_stop_message(rule: str, step: int, remedy: Remedy, learning_rate: float) -> str:
    """The line said when a collapse rule stopped a run with no checkpoint from before the collapse: resuming
    would go on training the broken policy, so it says how to start again instead."""
    lower = lower_learning_rate(remedy, learning_rate)
    return (f"alert rule '{rule}' (action: stop) stopped the run after step {step}: the policy broke, and its "
            f"only checkpoint holds the broken policy (a resume would stop again); start the run again with a "
            f"lower learning rate ({lower.strip() or 'see the rule'}), or with --on-alert rollback, which keeps a "
            f"checkpoint of the start and goes back to it by itself")


def collapse_stop_message(rule: str, step: int, run_dir: Path, back: tuple[Path, Remedy],
                          learning_rate: float) -> str:
    """The line said when a collapse rule stopped the run: no checkpoint of the broken policy, and the command
    that continues from the last one before the collapse with the rule's remedy."""
    checkpoint, remedy = back
    lower = lower_learning_rate(remedy, learning_rate)
    return (f"alert rule '{rule}' (action: stop) stopped the run after step {step}: the policy broke, so it was "
            f"not checkpointed; continue from {checkpoint.name}, before the collapse, with a lower learning rate: "
            f"{resume_command(run_dir)}{lower} (or let on_alert: rollback do it: --on-alert rollback)")


def lower_learning_rate(remedy: Remedy, learning_rate: float) -> str:
    """The option that starts or resumes with the remedy's learning rate (empty when it leaves it)."""
    if not remedy.changes("learning_rate"):
        return ""
    return f" --learning-rate {learning_rate * remedy.factor('learning_rate'):g}"


def alert_stop_message(rule: str, step: int, run_dir: Path) -> str:
    """The line said when an alert rule stopped the run, with the command that continues it."""
    return (f"alert rule '{rule}' (action: stop) stopped the run after step {step}, checkpoint saved; "
            f"continue with: {resume_command(run_dir)}")


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
             "rollbacks": run.rollbacks, "remedy": run.remedy.to_state(), "best_eval": run.best_eval,
             **trainer.world.checkpoint_state()}
    spare = checkpoint_name(run.best_eval[0]) if run.best_eval is not None else None
    return prepare_checkpoint(RunPaths(run.run_dir).checkpoints, step, trainer.policy.model, trainer.optimizer, state,
                              trainer.adapter_config(), trainer.config.keep_checkpoints, spare)


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
    from ..telemetry.analysis.report import write_report

    recorder, step = run.recorder, run.step
    try:
        reward_report = write_report(run.run_dir)
    except OSError as err:  # a disk that filled at the very end: the run itself is complete
        recorder.message(f"finished {plural(step, 'step')}; report.json could not be written "
                         f"({err.strerror or err}): mlx-grpo report {run.run_dir} prints it", style="yellow")
        return
    recorder.message(f"finished {plural(step, 'step')} in {recorder.elapsed():.0f} s: {reward_report.last_line()}"
                     f" — run directory: {run.run_dir}")


def nonfinite_stop_message(count: int, step: int, run_dir: Path, config: TrainConfig) -> str:
    """The line said when repeated non-finite updates stopped the run."""
    return (f"{count} updates in a row had a NaN or Inf loss or gradient (each was skipped: the weights never "
            f"saw them); stopped at step {step}. Continue from the last checkpoint with a lower learning rate: "
            f"{resume_command(run_dir)} --learning-rate {config.learning_rate / 10:g}")
