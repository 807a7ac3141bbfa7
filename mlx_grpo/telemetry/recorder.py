"""The run's recorder: built once, handed to the loop, it turns each step into a record and writes it.

`RunRecorder` owns everything that measures a run across steps — the reward and throughput
trackers, the alert engine, the system sampler — and everything that writes it out: the sinks
(run directory, TensorBoard, W&B) and the console. Its state is one `state_dict()` for checkpoints,
so a resumed run's records equal an uninterrupted run's. The trainer's loop and `RewardMonitor`
(the custom-loop API) share it. Imports no mlx.

Per step: `record_step(data)` builds the record from the step's raw data (`step_record`), adds the
trackers' metrics, evaluation and system figures, and runs the alert rules; `write(report)` sends it
to the sinks and the console. The two are apart so a checkpoint taken between them is timed in the
same step's record.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .alerts.alert import Alert
from .alerts.config import pattern_warnings
from .alerts.console import format_alert
from .alerts.engine import AlertEngine
from .alerts.rules import Rule
from .events import AlertEvent, Completions, Final, Samples, Scalars
from .metrics.names import (
    ACCEL_LIMIT_GB,
    BACKPROP_TOKENS_PER_S,
    CHECKPOINT_SECONDS,
    ELAPSED_SECONDS,
    GEN_TOKENS_PER_S,
    TOKENS_CUMULATIVE,
    TOKENS_TOTAL,
)
from .metrics.reward_stats import RewardTracker, ThroughputTracker
from .metrics.step_data import StepData, peak_share_metrics, step_record
from .rundir.completions import completion_rows, sample_rows


@dataclass
class StepReport:
    """One step's record, ready to write."""

    step: int
    record: dict[str, Any]
    alerts: list[Alert]
    histograms: dict[str, np.ndarray] = field(default_factory=dict)
    rewards: dict[str, np.ndarray] = field(default_factory=dict)  # "total" and per function, per completion
    completions: list[dict] = field(default_factory=list)  # every completion of the step, one row each
    samples: list[dict] = field(default_factory=list)  # samples.jsonl's selection of those rows


class RunRecorder:
    """Trackers, alert engine, system sampler, sinks and console of one run.

    `sinks` (a SinkSet) and `console` (a TrainingConsole) may be None: a custom loop that only wants
    records and alerts. `reward_fns` are the run's reward functions (rewards.RewardFunction): their
    hooks' metrics, alerts, epoch figures and state go through here. `components` are other objects of the step with
    state of their own (`state_dict`/`load_state_dict`, e.g. the adaptive window's controller).
    `samples_per_step`: how many groups' first completion go to samples.jsonl. `engine`: an alert engine of
    the caller's (RewardMonitor's, whose rules may change) instead of one over `rules`.
    """

    def __init__(self, reward_names: Sequence[str], rules: Sequence[Rule], *, sinks: Any = None,
                 console: Any = None, sampler: Any = None, reward_fns: Sequence[Any] = (),
                 components: Mapping[str, Any] | None = None, hist_every: int = 10, log_every: int = 1,
                 num_steps: int | None = None, num_iterations: int = 1, samples_per_step: int = 4,
                 engine: AlertEngine | None = None, clock: Callable[[], float] = time.perf_counter):
        self.rewards = RewardTracker(reward_names, hist_every=hist_every)
        self.gen_throughput = ThroughputTracker(GEN_TOKENS_PER_S)
        self.backprop_throughput = ThroughputTracker(BACKPROP_TOKENS_PER_S)
        self.engine = engine if engine is not None else AlertEngine(rules)
        self._unchecked_rules = list(rules)  # patterns matching nothing are said once, at the first record
        self.sinks, self.console, self.sampler = sinks, console, sampler
        self.reward_fns = list(reward_fns)
        self.hooks = {fn.name: fn.hooks for fn in self.reward_fns}
        self.components = dict(components or {})
        self.log_every, self.num_steps, self.num_iterations = log_every, num_steps, num_iterations
        self.nonfinite_in_a_row = 0  # updates in a row skipped for a NaN/Inf loss or gradient
        self.samples_per_step = samples_per_step
        self.tokens_seen = 0.0  # tokens/total over every step so far (a rollback does not give them back)
        self._clock = clock
        self._started = clock()

    # ------------------------------------------------------------------ per step

    def observe(self, step: int, record: dict[str, Any], scores: np.ndarray, total: np.ndarray,
                loss: float | None = None, arrays: Mapping[str, np.ndarray] | None = None) -> list[Alert]:
        """Add the reward trackers' metrics to `record` and run the alert rules on it; returns the alerts."""
        record.update(self.rewards.update(step, scores, total, loss=loss, extra=arrays))
        alerts = self.engine.check({"step": step, "time": time.time(), **record})
        for hooks in self.hooks.values():
            alerts.extend(Alert(step=step, time=time.time(), **body) for body in hooks.take_alerts())
        return alerts

    def record_step(self, data: StepData, evaluation: Mapping[str, float] | None = None,
                    epoch_ended: bool = False, last: bool = False) -> StepReport:
        """The step's whole record and alerts. `epoch_ended`: this step drew the epoch's last prompt;
        `last`: the run's last step (a partial epoch is reported there)."""
        step = data.step
        record = step_record(data)
        self.tokens_seen += record[TOKENS_TOTAL]
        record[TOKENS_CUMULATIVE] = self.tokens_seen
        record.update(self.gen_throughput.update(data.completion_tokens, data.seconds["rollout"]))
        record.update(self.backprop_throughput.update(data.trained_tokens * self.num_iterations,
                                                      data.seconds["update"]))
        for hooks in self.hooks.values():
            record.update(hooks.step_metrics(step))
        if evaluation:
            record.update(evaluation)
        if self.sampler is not None:
            record.update(self.sampler.snapshot())
        record.update(peak_share_metrics(data.peak_memory, record.get(ACCEL_LIMIT_GB)))
        record[ELAPSED_SECONDS] = self.elapsed()
        self.nonfinite_in_a_row = self.nonfinite_in_a_row + 1 if data.update.skipped else 0
        alerts = self.observe(step, record, data.scores, data.total, loss=data.update.loss,
                              arrays={"advantages/hist": data.trained_advantages,
                                      "completions/length/hist": data.lengths})
        if epoch_ended or (last and self.rewards.epoch_has_data()):
            record.update(self.end_epoch(partial=not epoch_ended))
        for message in data.new_errors:
            self.message(f"warning: {message}", style="yellow")
        for message in pattern_warnings(self._unchecked_rules, record):
            self.message(f"warning: {message}", style="yellow")
        self._unchecked_rules = []
        scores = {"total": data.total, **{name: data.scores[i] for i, name in enumerate(data.reward_names)}}
        rows = completion_rows(
            step=step, prompts=data.prompt_texts, answers=data.answers, texts=data.texts, reasoning=data.reasoning,
            predicted=data.predicted, group_size=data.group_size, reward_names=data.reward_names, scores=data.scores,
            total=data.total, advantages=data.advantages, lengths=data.lengths, truncated=data.truncated,
            correct=data.correct, trajectories=data.trajectories) if data.texts else []
        return StepReport(step, record, alerts, self.rewards.histograms(step), scores, rows,
                          sample_rows(rows, data.group_size, self.samples_per_step))

    def record_evaluation(self, step: int, evaluation: Mapping[str, float]) -> StepReport:
        """A record of an evaluation alone: the one before the first update is step 0's, the policy as it
        started (the baseline of the rules that compare with the start)."""
        record: dict[str, Any] = {**evaluation, ELAPSED_SECONDS: self.elapsed()}
        alerts = self.engine.check({"step": step, "time": time.time(), **record})
        return StepReport(step, record, alerts)

    def end_epoch(self, partial: bool = False) -> dict[str, float]:
        """Close an epoch: the reward tracker's and the reward hooks' epoch metrics."""
        out = self.rewards.end_epoch(partial=partial)
        for hooks in self.hooks.values():
            out.update(hooks.end_epoch())
        return out

    def write(self, report: StepReport, checkpoint_s: float | None = None) -> None:
        """Send the step to the sinks (every `log_every` steps and the last) and the console."""
        if checkpoint_s is not None:
            report.record[CHECKPOINT_SECONDS] = checkpoint_s
        step, last = report.step, report.step == self.num_steps
        if self.sinks is not None and (step % self.log_every == 0 or last):
            self.sinks.handle(Scalars(step, report.record, report.histograms, report.rewards))
            if report.samples:
                self.sinks.handle(Samples(step, report.samples))
        if self.sinks is not None and report.completions:
            self.sinks.handle(Completions(step, report.completions))
        for alert in report.alerts:
            self.alert(alert)
        if self.console is not None and self.num_steps:
            self.console.step(step, report.record, every=max(1, self.num_steps // 20))

    def alert(self, alert: Alert) -> None:
        """An alert to the sinks and the console."""
        if self.sinks is not None:
            self.sinks.handle(AlertEvent.of(alert))
        self.message(format_alert(alert))

    def message(self, text: Any, style: str | None = None) -> None:
        """Print a line on the console, if there is one."""
        if self.console is not None:
            self.console.message(text, style=style)

    def elapsed(self) -> float:
        """Training seconds so far, across resumes."""
        return self._clock() - self._started

    # ------------------------------------------------------------------ the end

    def final_metrics(self, steps: int, finished: bool, run_dir: Any = None,
                      last_record: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Whole-run statistics; a finished run adds its last evaluation and the reward hooks' summaries."""
        final: dict[str, Any] = {**self.rewards.final_metrics(), "final/steps": float(steps)}
        if finished:
            final.update({k: v for k, v in (last_record or {}).items() if k.startswith("eval/")})
            for hooks in self.hooks.values():
                final.update(hooks.final_metrics(run_dir))
        return final

    def close(self, final: Mapping[str, Any], status: str) -> None:
        """Stop the system sampler and close the sinks (once)."""
        if self.sampler is not None:
            self.sampler.stop()
        if self.sinks is not None:
            self.sinks.handle(Final(final))
            self.sinks.close(status)

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Everything the recorder needs to resume exactly: trackers, alert engine, reward hooks."""
        return {
            "rewards": self.rewards.state_dict(),
            "throughput": {t.name: t.state_dict() for t in (self.gen_throughput, self.backprop_throughput)},
            "alerts": self.engine.state_dict(),
            "reward_errors_reported": [fn.name for fn in self.reward_fns if fn.error_reported],
            "reward_functions": {name: state for name, hooks in self.hooks.items()
                                 if (state := hooks.state_dict()) is not None},
            "components": {name: component.state_dict() for name, component in self.components.items()},
            "nonfinite_in_a_row": self.nonfinite_in_a_row,
            "tokens_cumulative": self.tokens_seen,
            "elapsed_s": self.elapsed(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what state_dict saved."""
        self.rewards.load_state_dict(state["rewards"])
        for tracker in (self.gen_throughput, self.backprop_throughput):
            if tracker.name in state["throughput"]:
                tracker.load_state_dict(state["throughput"][tracker.name])
        self.engine.load_state_dict(state["alerts"])
        self.tokens_seen = float(state.get("tokens_cumulative", 0.0))  # checkpoints before it: from 0
        for fn in self.reward_fns:
            fn.error_reported = fn.name in state["reward_errors_reported"]
        for name, hooks in self.hooks.items():
            if name in state["reward_functions"]:
                hooks.load_state_dict(state["reward_functions"][name])
        saved = state.get("components", {})
        for name, component in self.components.items():
            if name in saved:  # a component turned on only at resume starts fresh
                component.load_state_dict(saved[name])
        self.nonfinite_in_a_row = int(state["nonfinite_in_a_row"])
        self._started = self._clock() - float(state["elapsed_s"])
