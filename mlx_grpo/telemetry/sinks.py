"""Where metric records go: the run directory always, TensorBoard unless turned off, W&B and Trackio when asked.

Public API:

- `Sink`: the interface every optional sink implements (each method defaults to doing nothing):
  `start(info, run_dir)`, `write(step, scalars, histograms, rewards)`, `write_samples(step, samples)`,
  `write_alert(alert)`, `write_final(metrics)`, `log_checkpoint(path, step)`,
  `log_dataset(name, splits, metadata)`, `log_model(path, step)`, `close(status)`.
  `info` is the `RunInfo` written to run.json, `run_dir` the run directory; `scalars` maps canonical
  names to floats; `histograms` maps names to arrays; `rewards` maps "total" and each reward function's
  name to the step's scores per completion [N] (prompt-major), for the W&B 3D views.
- `TensorBoardSink(logdir, flush_secs=2, purge_step=None)`: tensorboardX event files in `logdir` (the run's
  `tensorboard/`): all scalars of a step as one event, histograms, samples as a markdown table
  (`samples/completions`), alerts (`alerts`), the final metrics, a custom-scalars layout grouping
  rewards / policy / performance / system, and the config as hyper-parameters **in the same run**:
  tensorboardX's `add_hparams` writes into a new timestamped sub-directory, so this sink writes the
  hparams plugin's experiment and session-start summaries into its own event file instead, and the
  session-end status when it closes. `purge_step` (a resumed run's first step) hides the events an
  interrupted session wrote at or after that step. A write error in tensorboardX's writer thread (a
  full disk) is kept and raised by the sink's next call, so SinkSet turns TensorBoard off with a
  warning; left alone, the thread would die and the training thread block on its full queue.
- `WandbOptions` and `WandbSink(options)`: Weights & Biases (imported only here, at construction; a
  missing `wandb` raises ImportError). `wandb.init` with project / entity / name / tags / notes, the
  run config; the same scalars; `wandb.Histogram`s; the completions table `samples/completions` in
  INCREMENTAL mode, so each log adds rows and the history is kept (wandb >= 0.21; W&B Server >= 0.70
  to render it); `charts/reward_breakdown` (bar chart of the per-function means), three 3D point
  clouds (`wandb.Object3D`, which work offline): `charts/reward_landscape_3d` (step, example, total
  reward), `charts/reward_components_3d` (step, reward function, score; a colour per function) and
  `charts/policy_evolution_3d` (KL, mean reward, step), and with a rubric `charts/criteria_heatmap`
  (criterion x step, as HTML) with its data as the table `charts/criteria_over_time`, all redrawn every
  `chart_every` steps (0: about ten times per run, wandb_charts.chart_interval) and at the last step;
  alerts through `run.alert`; checkpoints as model artifacts when `log_checkpoints` is set; the
  dataset's rows as a `dataset` artifact (`log_dataset`) and the final model as a `model` artifact
  (`log_model`); final metrics in the run summary. WANDB_MODE=offline (or `mode="offline"`) works
  without a network.
- `TrackioOptions` and `TrackioSink(options)`: Trackio (imported only here, at construction; a missing
  `trackio` raises ImportError), local and offline: its SQLite store (TRACKIO_DIR, by default
  ~/.cache/huggingface/trackio, where `trackio show` looks), never a Space or server, even when
  TRACKIO_SPACE_ID / TRACKIO_SERVER_URL are set. `trackio.init` with the project, the run directory's name
  (the same trackio run again when the run is resumed) and the run config; the same scalars at every
  logged step, the final metrics at the last step; `trackio.finish` on close. It runs on the training
  thread: trackio's `log` only queues for trackio's own writer thread (~0.3 ms for a step's 130 scalars), and
  init and finish print trackio's own lines, which are held back there. `trackio_store()` is where the
  store is, for the start-up line.
- `ThreadedSink(inner, max_pending=10000, close_timeout=120)`: runs a sink on a worker thread (make_sinks
  wraps W&B in one): the training thread only queues; errors surface on the next call; a full queue drops
  records instead of blocking, and `close` reports the count.
- `SinkSet(rundir, sinks=(), warn=None)`: what the trainer talks to. It writes the JSONL run directory
  first (its errors propagate: the local record is the contract) and fans out to the other sinks. A
  sink that raises is turned off for the rest of the run: one warning (to `warn`, default stderr)
  and one `sink_failed` alert in alerts.jsonl; training and the run directory carry on. As a context
  manager it closes with `finished`, `interrupted` (KeyboardInterrupt) or `failed`.
  `start(name, config, versions, device, total_steps, run_id, resume_step=None)` writes run.json (see
  RunDirWriter.start for resuming) and starts every sink;
  `write(step, scalars, histograms=None, rewards=None, time=None)`, `write_samples`, `write_alert`,
  `write_final`, `log_checkpoint`, `log_dataset`, `log_model`, `close(status)` fan out; `active` names the
  sinks still on.
- `make_sinks(run_dir, tensorboard=True, tensorboard_dir=None, flush_secs=2, wandb=None, trackio=None,
  warn=None, fsync=False, purge_step=None) -> SinkSet`: the usual set; a sink whose library is not installed
  is left out with a warning.
- `wandb_enabled(flag, environ=os.environ) -> bool`: `--wandb` / `--no-wandb` / neither (on when
  WANDB_API_KEY is set).
- `samples_markdown(samples) -> str`, `flatten_config(config) -> dict`: the formatting the sinks share.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import queue
import re
import sys
import threading
import time as _time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .catalogue import tensorboard_layout
from .rundir import RUN_JSON, RunDirWriter, RunInfo, json_safe, read_run_info, scrub_secrets, scrub_text
from .wandb_charts import CATEGORY_COLOURS, category_cloud, chart_interval, heatmap_svg, value_cloud
from .names import ACCURACY_TRAIN, EVAL_ACCURACY, KL, LOSS, REWARD_MEAN, SAMPLES_TABLE

# Sample columns shown in text and tables; long texts are cut so a step's table stays readable.
TEXT_LIMIT = 600
# A fixed bin count: tensorboardX's default ("tensorflow" edges) costs ~2.5 ms per histogram, 30 bins ~0.2 ms.
HIST_BINS = 30
HPARAM_METRICS = (REWARD_MEAN, ACCURACY_TRAIN, EVAL_ACCURACY, LOSS)


class Sink:
    """Where a run's records go besides the run directory; every method may be left as it is."""

    name = "sink"

    def start(self, info: RunInfo, run_dir: Path) -> None:
        """The run begins: open whatever the sink writes to."""

    def write(self, step: int, scalars: Mapping[str, float], histograms: Mapping[str, np.ndarray],
              rewards: Mapping[str, np.ndarray] | None) -> None:
        """One logged step: its scalars, histograms and the per-function reward arrays."""

    def write_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        """One step's sample completions."""

    def write_alert(self, alert: Mapping[str, Any]) -> None:
        """An alert that fired."""

    def write_final(self, metrics: Mapping[str, float]) -> None:
        """The end-of-run summary metrics."""

    def log_checkpoint(self, path: str | Path, step: int) -> None:
        """A checkpoint was committed at `path`."""

    def log_dataset(self, name: str, splits: Mapping[str, Sequence[Mapping[str, Any]]],
                    metadata: Mapping[str, Any]) -> None:
        """The run's train and held-out rows."""

    def log_model(self, path: str | Path, step: int) -> None:
        """The final model's directory."""

    def flush(self) -> None:
        """Put what was written so far on disk (before a checkpoint records that it was)."""

    def close(self, status: str) -> None:
        """The run ended: flush and close."""


# ----------------------------------------------------------------------------- shared helpers


def _clip(text: Any, limit: int = TEXT_LIMIT) -> str:
    text = "" if text is None else str(text)
    return text if len(text) <= limit else text[:limit] + " [...]"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "null" if not math.isfinite(value) else f"{value:.4g}"
    return "" if value is None else str(value)


def _md_cell(value: Any) -> str:
    return _clip(value).replace("\\", "\\\\").replace("|", "\\|").replace("\n", "<br>")


def samples_markdown(samples: Sequence[Mapping[str, Any]]) -> str:
    """Sample completions as a markdown table (TensorBoard's text view)."""
    fns = list(dict.fromkeys(k for s in samples for k in (s.get("rewards") or {})))
    header = ["prompt", "completion", "answer", *fns, "total", "advantage", "length", "truncated", "correct"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for s in samples:
        rewards = s.get("rewards") or {}
        row = [_md_cell(s.get("prompt")), _md_cell(s.get("completion")), _md_cell(s.get("answer")),
               *(_fmt(rewards.get(fn)) for fn in fns), _fmt(s.get("total")), _fmt(s.get("advantage")),
               _fmt(s.get("length")), _fmt(s.get("truncated")), _fmt(s.get("correct"))]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, bool | int | float | str]:
    """Nested config as `a.b` keys with plain values (lists as JSON text); None values are dropped."""
    out: dict[str, bool | int | float | str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten_config(value, name + "."))
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        elif value is not None:
            out[name] = json.dumps(json_safe(value))
    return out


# ----------------------------------------------------------------------------- TensorBoard


@dataclass(frozen=True)
class _FlushMarker:
    """Queued behind a step's events: the writer thread reaching it means every earlier event is written."""
    token: int


class _GuardedEvents:
    """Sits between tensorboardX's writer thread and the event file: keeps the first write error and
    drops later events, instead of letting the error end the thread (its queue would then fill and
    block the training thread for good). It also answers flush markers, which gives the training thread
    a real barrier: tensorboardX's own flush() leaves events still waiting in its queue unwritten."""

    def __init__(self, inner: Any, events: Any):
        self.inner = inner
        self.events = events  # the writer thread's queue
        self.error: BaseException | None = None
        self._reached: dict[int, threading.Event] = {}
        self._next_token = 0

    def write_event(self, event: Any) -> None:
        if isinstance(event, _FlushMarker):
            self.flush()
            self._reached.pop(event.token, threading.Event()).set()
            return
        if self.error is None:
            try:
                self.inner.write_event(event)
            except Exception as exc:  # kept for the training thread, which raises it
                self.error = exc

    def flush(self) -> None:
        if self.error is None:
            try:
                self.inner.flush()
            except Exception as exc:
                self.error = exc

    def flush_queued(self, timeout: float = 60.0) -> None:
        """Block until every event queued so far is written and flushed (or `timeout` seconds passed)."""
        self._next_token += 1
        reached = self._reached[self._next_token] = threading.Event()
        self.events.put(_FlushMarker(self._next_token))
        reached.wait(timeout)


def _guard_writer_thread(writer: Any) -> _GuardedEvents | None:
    """Put a _GuardedEvents in front of the writer thread of a tensorboardX SummaryWriter (2.6 layout);
    None when the layout is different (the thread then stays unguarded)."""
    event_writer = getattr(writer._get_file_writer(), "event_writer", None)
    worker = getattr(event_writer, "_worker", None)
    events = getattr(event_writer, "_event_queue", None)
    if worker is None or events is None or not hasattr(worker, "_record_writer"):
        return None
    guard = _GuardedEvents(worker._record_writer, events)
    worker._record_writer = guard
    return guard


def differing_first(values: dict[str, Any], run_dir: str | Path | None, limit: int = 50) -> dict[str, Any]:
    """`values` with the keys whose value differs from some sibling run's (the runs beside this one in
    its monitoring directory, newest `limit`) first: TensorBoard's HParams table then opens on what
    the runs being compared actually vary."""
    from .compare import differing_keys

    if run_dir is None:
        return values
    here = Path(run_dir)
    try:
        siblings = sorted((p for p in here.parent.iterdir() if p != here and (p / RUN_JSON).is_file()),
                          key=lambda p: p.stat().st_mtime, reverse=True)[:limit]
    except OSError:
        return values
    configs = [flatten_config(info.config) for info in map(read_run_info, siblings) if info is not None and info.config]
    if not configs:
        return values
    first = [k for k in differing_keys([values, *configs]) if k in values]
    return {**{k: values[k] for k in first}, **values}


class TensorBoardSink(Sink):
    """TensorBoard event files: scalars, histograms, samples, alerts, hparams, the custom layout."""

    name = "tensorboard"

    def __init__(self, logdir: str | Path, flush_secs: int = 2, purge_step: int | None = None):
        from tensorboardX import SummaryWriter
        from tensorboardX.proto.summary_pb2 import Summary

        self._summary = Summary
        self.logdir = Path(logdir)
        # tensorboardX names an event file by the second it was opened and opens it with "wb": a resumed
        # session starting in the same second as the one before it would erase that session's events.
        # The suffix keeps every session's file, and sorts same-second files in the order they were opened
        # (TensorBoard reads them in name order, which its purge-on-resume relies on).
        suffix = f".{_time.time_ns() % 1_000_000_000:09d}.{os.getpid()}"
        self.writer = SummaryWriter(logdir=str(self.logdir), flush_secs=flush_secs, purge_step=purge_step,
                                    filename_suffix=suffix)
        self._guard = _guard_writer_thread(self.writer)
        self._last_step = 0

    def _raise_write_error(self) -> None:
        if self._guard is not None and self._guard.error is not None:
            error = self._guard.error
            raise OSError(f"writing {self.logdir} failed: {error}") from error

    def start(self, info: RunInfo, run_dir: Path) -> None:
        """Open the event writer and write the layout, the config and the hparams."""
        from tensorboardX.summary import hparams

        self.writer.add_custom_scalars(tensorboard_layout())
        hparam_values = differing_first(flatten_config(info.config), run_dir)
        experiment, session_start, _ = hparams(hparam_values, {name: 0.0 for name in HPARAM_METRICS})
        file_writer = self.writer._get_file_writer()
        file_writer.add_summary(experiment)
        file_writer.add_summary(session_start)
        shown = {**info.to_dict(), "run_dir": str(run_dir)}
        self.writer.add_text("run", "```\n" + json.dumps(json_safe(shown), indent=2) + "\n```", 0)

    def write(self, step, scalars, histograms, rewards) -> None:
        """Scalars and histograms of one step."""
        self._raise_write_error()
        # One event holding every scalar: ~100 add_scalar calls would cost ~10x more per step.
        values = [self._summary.Value(tag=name, simple_value=float(value))
                  for name, value in scalars.items() if value is not None]
        self.writer._get_file_writer().add_summary(self._summary(value=values), step)
        for name, array in histograms.items():
            self.writer.add_histogram(name, np.asarray(array, dtype=np.float64), step, bins=HIST_BINS)
        self._last_step = max(self._last_step, step)

    def write_samples(self, step, samples) -> None:
        """The samples as a markdown table."""
        self._raise_write_error()
        self.writer.add_text(SAMPLES_TABLE, samples_markdown(samples), step)

    def flush(self) -> None:
        """Write what is queued to disk now."""
        if self._guard is not None:
            self._guard.flush_queued()
        else:
            self.writer.flush()
        self._raise_write_error()

    def write_alert(self, alert) -> None:
        """The alert as text under `alerts`."""
        self._raise_write_error()
        text = f"**{alert.get('level', 'info')}** `{alert.get('rule', '')}` {_md_cell(alert.get('message'))}"
        self.writer.add_text("alerts", text, int(alert.get("step") or self._last_step))

    def write_final(self, metrics) -> None:
        """The final metrics, and the hparams' results."""
        self._raise_write_error()
        self.write(self._last_step, {k: v for k, v in metrics.items() if isinstance(v, (int, float))}, {}, None)
        rows = "\n".join(f"| `{k}` | {_fmt(v)} |" for k, v in metrics.items())
        self.writer.add_text("final", "| metric | value |\n|---|---|\n" + rows, self._last_step)

    def close(self, status: str) -> None:
        """Flush and close the event writer."""
        from tensorboardX.proto.api_pb2 import Status
        from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData, SessionEndInfo
        from tensorboardX.proto.summary_pb2 import SummaryMetadata

        # The hparams plugin knows success, failure, running and unknown; an interrupted run may yet continue.
        code = {"finished": "STATUS_SUCCESS", "interrupted": "STATUS_UNKNOWN"}.get(status, "STATUS_FAILURE")
        content = HParamsPluginData(session_end_info=SessionEndInfo(status=Status.Value(code)), version=0)
        metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="hparams",
                                                                          content=content.SerializeToString()))
        session_end = self._summary(value=[self._summary.Value(tag="_hparams_/session_end_info", metadata=metadata)])
        self.writer._get_file_writer().add_summary(session_end)
        self.writer.close()
        self._raise_write_error()


# ----------------------------------------------------------------------------- Weights & Biases


@dataclass
class WandbOptions:
    """The W&B settings of a run (project, entity, name, tags, notes, what to upload)."""

    project: str = "mlx-grpo"
    entity: str | None = None
    name: str | None = None
    tags: Sequence[str] = ()
    notes: str | None = None
    mode: str | None = None  # "online", "offline", "disabled"; None = WANDB_MODE or online
    dir: str | None = None  # where W&B keeps its files; None = WANDB_DIR if set, else the run directory
    chart_every: int = 0  # 0: about ten times per run (wandb_charts.chart_interval)
    landscape_points: int = 10_000  # the most recent points each 3D cloud keeps
    log_checkpoints: bool = False
    extra_config: Mapping[str, Any] = field(default_factory=dict)


def tracker_config(info: RunInfo) -> dict[str, Any]:
    """What an external tracker records as the run's config: the config, plus where and with what it ran."""
    return {**info.config, "run_id": info.run_id, "versions": info.versions, "device": info.device}


class WandbSink(Sink):
    """Weights & Biases: scalars, histograms, samples tables, charts, artifacts."""

    name = "wandb"

    def __init__(self, options: WandbOptions):
        import wandb

        self.wandb = wandb
        self.options = options
        self.run = None
        self._table = None
        self._table_fns: list[str] = []
        self._landscape = _RecentPoints(options.landscape_points)
        self._components = _RecentPoints(options.landscape_points)
        self._component_names: list[str] = []
        self._evolution: list[tuple[float, float, float]] = []
        self._criteria: dict[str, dict[int, float]] = {}  # criterion -> step -> mean score
        self._chart_every = options.chart_every
        self._total_steps: int | None = None

    def start(self, info: RunInfo, run_dir: Path) -> None:
        """Start the W&B run with the scrubbed config (resuming the same W&B run on a resume)."""
        opts = self.options
        # An explicit dir wins, then the user's WANDB_DIR, then the run directory (keeps a run self-contained).
        wandb_dir = opts.dir or (None if os.environ.get("WANDB_DIR") else str(run_dir))
        config = {**tracker_config(info), **opts.extra_config}
        # Notes and tags are free text a user may paste a key into; W&B's own metadata would record the
        # command line, secrets typed as flags included, so it is not collected.
        tags = [scrub_text(str(tag)) for tag in opts.tags]
        self.run = self.wandb.init(project=opts.project, entity=opts.entity, name=opts.name or info.name,
                                   tags=tags or None, notes=scrub_text(opts.notes) if opts.notes else None,
                                   config=json_safe(scrub_secrets(config)), dir=wandb_dir, mode=opts.mode,
                                   settings=self.wandb.Settings(x_disable_meta=True))
        self._total_steps = info.total_steps
        self._chart_every = chart_interval(opts.chart_every, self._total_steps)

    def write(self, step, scalars, histograms, rewards) -> None:
        """One step's scalars and histograms, and the charts when they are due."""
        data: dict[str, Any] = {k: v for k, v in scalars.items() if v is not None}
        for name, array in histograms.items():
            data[name] = self.wandb.Histogram(np.asarray(array, dtype=np.float64))
        if rewards:
            self._add_rewards(step, rewards)
        if KL in scalars and REWARD_MEAN in scalars:
            self._evolution.append((float(scalars[KL]), float(scalars[REWARD_MEAN]), float(step)))
        for name, value in scalars.items():
            if name.startswith("criteria/") and name.endswith("/mean") and value is not None:
                self._criteria.setdefault(name[len("criteria/"):-len("/mean")], {})[step] = float(value)
        if step % self._chart_every == 0 or step == self._total_steps:
            data.update(self._charts(scalars))
        self.run.log(data, step=step)

    def _add_rewards(self, step: int, rewards: Mapping[str, np.ndarray]) -> None:
        total = np.asarray(rewards["total"], dtype=np.float64)
        points = np.stack([np.full(total.size, float(step)), np.arange(total.size, dtype=np.float64), total], axis=1)
        self._landscape.add(points[np.isfinite(total)])
        for name in rewards:
            if name != "total" and name not in self._component_names:
                self._component_names.append(name)
        parts = []
        for index, name in enumerate(self._component_names):
            scores = np.asarray(rewards.get(name, ()), dtype=np.float64)
            scores = scores[np.isfinite(scores)]  # a function that failed this batch has NaN scores
            parts.append(np.stack([np.full(scores.size, float(step)), np.full(scores.size, float(index)), scores],
                                  axis=1))
        if parts:
            self._components.add(np.concatenate(parts))

    def _charts(self, scalars: Mapping[str, float]) -> dict[str, Any]:
        charts: dict[str, Any] = {}
        means = {k.split("/")[1]: v for k, v in scalars.items()
                 if re.fullmatch(r"rewards/[^/]+/mean", k) and k != REWARD_MEAN}
        if means:
            charts["charts/reward_breakdown"] = self._bar(means, "Reward breakdown (batch mean per function)")
        points = self._landscape.points()
        if len(points) >= 2:
            charts["charts/reward_landscape_3d"] = self.wandb.Object3D(value_cloud(points, points[:, 2]))
        points = self._components.points()
        if len(points) >= 2:
            # x: step, y: reward function (in the order of the run's reward list), z: score; a colour per function.
            charts["charts/reward_components_3d"] = self.wandb.Object3D(category_cloud(points, points[:, 1]),
                                                                        caption=self._components_caption())
        if len(self._evolution) >= 2:
            points = np.asarray(self._evolution, dtype=np.float64)
            charts["charts/policy_evolution_3d"] = self.wandb.Object3D(value_cloud(points, points[:, 1]))
        charts.update(self._criteria_charts())
        return charts

    def _components_caption(self) -> str:
        colours = [CATEGORY_COLOURS[i % len(CATEGORY_COLOURS)] for i in range(len(self._component_names))]
        return "y axis, in order: " + ", ".join(f"{name} (rgb{c})" for name, c in zip(self._component_names, colours))

    def _criteria_charts(self) -> dict[str, Any]:
        """The rubric criteria's mean scores over time: a heatmap (HTML) and the table it is drawn from."""
        steps = sorted({step for scores in self._criteria.values() for step in scores})
        if len(steps) < 2:
            return {}
        steps = steps[-CRITERIA_COLUMNS:]
        names = sorted(self._criteria)
        values = np.array([[self._criteria[n].get(s, math.nan) for s in steps] for n in names])
        svg = heatmap_svg(names, steps, values, title="Rubric criteria: mean score per logged step")
        rows = [[s, n, self._criteria[n][s]] for n in names for s in steps if s in self._criteria[n]]
        return {"charts/criteria_heatmap": self.wandb.Html(svg, data_is_not_path=True),
                "charts/criteria_over_time": self.wandb.Table(columns=["step", "criterion", "mean"], data=rows)}

    def _bar(self, values: Mapping[str, float], title: str):
        table = self.wandb.Table(columns=["reward_function", "mean"],
                                 data=[[k, float(v)] for k, v in values.items() if v is not None and math.isfinite(v)])
        return self.wandb.plot.bar(table, "reward_function", "mean", title=title)

    def write_samples(self, step, samples) -> None:
        """The samples as a W&B table."""
        if not samples:
            return
        if self._table is None:
            self._table_fns = list(dict.fromkeys(k for s in samples for k in (s.get("rewards") or {})))
            columns = ["step", "prompt", "reasoning", "answer", "ground_truth", *(f"reward/{fn}" for fn in
                       self._table_fns), "total", "advantage", "length", "truncated", "correct", "completion"]
            self._table = self.wandb.Table(columns=columns, log_mode="INCREMENTAL")
        for s in samples:
            # The trainer splits each completion with the same extractor that scored it.
            rewards = s.get("rewards") or {}
            row = [step, _clip(s.get("prompt")), _clip(s.get("reasoning")), _clip(s.get("predicted")),
                   _clip(s.get("answer")),
                   *(json_safe(rewards.get(fn)) for fn in self._table_fns), json_safe(s.get("total")),
                   json_safe(s.get("advantage")), s.get("length"), s.get("truncated"), s.get("correct"),
                   _clip(s.get("completion"), 4 * TEXT_LIMIT)]
            self._table.add_data(*row)
        self.run.log({SAMPLES_TABLE: self._table}, step=step)

    def write_alert(self, alert) -> None:
        """The alert as a W&B alert."""
        level = {"error": self.wandb.AlertLevel.ERROR, "warning": self.wandb.AlertLevel.WARN}.get(
            alert.get("level"), self.wandb.AlertLevel.INFO)
        self.run.alert(title=f"{alert.get('rule', 'alert')} (step {alert.get('step')})",
                       text=str(alert.get("message", "")), level=level)

    def write_final(self, metrics) -> None:
        """The final metrics in the run's summary, and the last charts."""
        self.run.summary.update(json_safe(dict(metrics)))
        data: dict[str, Any] = {}
        means = {k.split("/")[1]: v for k, v in metrics.items()
                 if re.fullmatch(r"final/[^/]+/mean", k) and k != "final/total/mean"}
        if means:
            data["charts/reward_breakdown"] = self._bar(means, "Reward breakdown (whole-run mean per function)")
        criteria = sorted({k.rsplit("/", 1)[0] for k in metrics if k.startswith("final/criteria/")})
        if criteria:
            rows = [[c[len("final/criteria/"):], *(json_safe(metrics.get(f"{c}/{stat}"))
                     for stat in ("mean", "std", "min", "max", "total_samples"))] for c in criteria]
            data["final/rubric_criteria_summary"] = self.wandb.Table(
                columns=["criterion", "mean", "std", "min", "max", "samples"], data=rows)
        if data:
            self.run.log(data)

    def log_checkpoint(self, path, step) -> None:
        """Upload the checkpoint as an artifact, when asked to."""
        if not self.options.log_checkpoints:
            return
        artifact = self.wandb.Artifact(name=f"{self.run.id}-checkpoint", type="model", metadata={"step": step})
        artifact.add_dir(str(path))
        self.run.log_artifact(artifact, aliases=[f"step_{step}", "latest"])

    def log_dataset(self, name, splits, metadata) -> None:
        """The rows the run trains and evaluates on, one JSONL file per split (written here, on W&B's thread)."""
        import tempfile

        artifact = self.wandb.Artifact(name=_artifact_name(name), type="dataset",
                                       metadata=json_safe({**metadata, **{f"{split}_rows": len(rows)
                                                                           for split, rows in splits.items()}}))
        with tempfile.TemporaryDirectory() as tmp:
            for split, rows in splits.items():
                path = Path(tmp) / f"{split}.jsonl"
                with open(path, "w", encoding="utf-8") as fh:
                    for row in rows:
                        fh.write(json.dumps(json_safe(dict(row))) + "\n")
                artifact.add_file(str(path), name=path.name)  # copied into W&B's staging area here
            self.run.log_artifact(artifact)

    def log_model(self, path, step) -> None:
        """The final model (a Hugging Face directory) as a model artifact."""
        artifact = self.wandb.Artifact(name=f"{self.run.id}-model", type="model", metadata={"step": step})
        artifact.add_dir(str(path))
        self.run.log_artifact(artifact, aliases=["final", f"step_{step}"])

    def close(self, status: str) -> None:
        """Finish the W&B run."""
        self.run.finish(exit_code=0 if status == "finished" else 1)


CRITERIA_COLUMNS = 200  # the heatmap shows the most recent logged steps, so a long run's stays readable


class _RecentPoints:
    """The most recent [n, 3] point arrays of a 3D cloud, `limit` points at most (whole steps dropped)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list[np.ndarray] = []
        self.size = 0

    def add(self, points: np.ndarray) -> None:
        self.parts.append(points)
        self.size += len(points)
        while self.size - len(self.parts[0]) >= self.limit:
            self.size -= len(self.parts.pop(0))

    def points(self) -> np.ndarray:
        return np.concatenate(self.parts) if self.parts else np.empty((0, 3))


def _artifact_name(text: str) -> str:
    """W&B artifact names allow letters, digits, dashes, underscores and dots."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.") or "dataset"


# ----------------------------------------------------------------------------- Trackio


@dataclass
class TrackioOptions:
    """The Trackio settings of a run."""

    project: str = "mlx-grpo"
    name: str | None = None  # None: the run directory's name


# Trackio's own switches to a Hugging Face Space or a self-hosted server; this sink stays local.
TRACKIO_REMOTE_ENV = ("TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL")


@contextlib.contextmanager
def _local_and_quiet():
    """Trackio as this sink uses it: no remote switch from the environment, and its own console lines
    (where it logs, how to open its dashboard) held back. Only for the training thread's calls made
    while nothing else prints: redirecting stdout is process-wide."""
    remote = {key: os.environ.pop(key) for key in TRACKIO_REMOTE_ENV if key in os.environ}
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        os.environ.update(remote)


def trackio_store() -> Path:
    """Where Trackio keeps its projects (it reads TRACKIO_DIR once, when imported)."""
    from trackio.utils import TRACKIO_DIR

    return Path(TRACKIO_DIR)


class TrackioSink(Sink):
    """Trackio, local and offline: scalars and the final summary."""

    name = "trackio"

    def __init__(self, options: TrackioOptions):
        import trackio

        self.trackio = trackio
        self.options = options
        self.run = None
        self._last_step = 0

    def start(self, info: RunInfo, run_dir: Path) -> None:
        """Start the Trackio run in its local store."""
        opts = self.options
        config = tracker_config(info)
        with _local_and_quiet():
            # Its system monitors are off: the run's own system metrics are among the scalars.
            self.run = self.trackio.init(project=opts.project, name=opts.name or info.name,
                                         config=json_safe(scrub_secrets(config)),
                                         resume="allow" if info.resumes else "never",
                                         auto_log_cpu=False, auto_log_gpu=False, embed=False)

    def write(self, step, scalars, histograms, rewards) -> None:
        """One step's scalars."""
        self.run.log({k: float(v) for k, v in scalars.items() if v is not None}, step=step)
        self._last_step = max(self._last_step, step)

    def write_final(self, metrics) -> None:
        """The final metrics."""
        self.run.log({k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}, step=self._last_step)

    def close(self, status: str) -> None:
        """Finish the Trackio run."""
        with _local_and_quiet():
            self.trackio.finish()


# ----------------------------------------------------------------------------- background worker


class ThreadedSink(Sink):
    """Runs another sink's calls in order on a worker thread, so a slow sink (W&B: ~1-5 ms per record,
    tens of ms for media) costs the training thread only a queue put.

    An error in the worker is raised by the next call, so SinkSet turns the sink off as usual. When the
    queue is full (the sink fell far behind) records are dropped, never waited for; `close` reports how many.
    """

    def __init__(self, inner: Sink, max_pending: int = 10_000, close_timeout: float = 120.0):
        self.inner = inner
        self.name = inner.name
        self.close_timeout = close_timeout
        self._queue: queue.Queue = queue.Queue(max_pending)
        self._error: BaseException | None = None
        self._dropped = 0
        self._thread = threading.Thread(target=self._work, name=f"mlx-grpo-{inner.name}-sink", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            method, args = item
            if self._error is None:
                try:
                    getattr(self.inner, method)(*args)
                except Exception as exc:  # handed to the training thread by the next call
                    self._error = exc

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _submit(self, method: str, *args) -> None:
        self._raise_error()
        try:
            self._queue.put_nowait((method, args))
        except queue.Full:
            self._dropped += 1

    def start(self, info, run_dir):
        """Queue the call for the sink's thread."""
        # A copy: the run directory's writer sets the status and end time on its own when the run ends.
        self._submit("start", replace(info), run_dir)

    def write(self, step, scalars, histograms, rewards):
        """Queue the call for the sink's thread."""
        # Copies: the trainer may reuse its dicts while the worker still holds them.
        self._submit("write", step, dict(scalars), dict(histograms), rewards)

    def write_samples(self, step, samples):
        """Queue the call for the sink's thread."""
        self._submit("write_samples", step, list(samples))

    def write_alert(self, alert):
        """Queue the call for the sink's thread."""
        self._submit("write_alert", dict(alert))

    def write_final(self, metrics):
        """Queue the call for the sink's thread."""
        self._submit("write_final", dict(metrics))

    def log_checkpoint(self, path, step):
        """Queue the call for the sink's thread."""
        self._submit("log_checkpoint", path, step)

    def log_dataset(self, name, splits, metadata):
        """Queue the call for the sink's thread."""
        # The rows are not copied: the trainer only reads them.
        self._submit("log_dataset", name, splits, dict(metadata))

    def log_model(self, path, step):
        """Queue the call for the sink's thread."""
        self._submit("log_model", path, step)

    def close(self, status):
        """Let the thread finish what is queued, then close the sink."""
        self._queue.put(("close", (status,)))
        self._queue.put(None)
        self._thread.join(self.close_timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"{self.name} did not finish within {self.close_timeout:.0f} s")
        self._raise_error()
        if self._dropped:
            raise RuntimeError(f"{self._dropped} record(s) were dropped because {self.name} fell behind")


# ----------------------------------------------------------------------------- fan-out


def wandb_enabled(flag: bool | None, environ: Mapping[str, str] = os.environ) -> bool:
    """`--wandb` (True) turns W&B on, `--no-wandb` (False) off; no flag (None): on when WANDB_API_KEY is set."""
    return bool(environ.get("WANDB_API_KEY")) if flag is None else flag


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class SinkSet:
    """The run directory and every other sink, written together; a failing sink is turned off with one warning."""

    def __init__(self, rundir: RunDirWriter, sinks: Sequence[Sink] = (), warn: Callable[[str], None] | None = None):
        self.rundir = rundir
        self.sinks = list(sinks)
        self.warn = warn or _stderr
        self.info: RunInfo | None = None
        self._last_step = 0
        self._closed = False

    @property
    def active(self) -> list[str]:
        """The names of the sinks still on."""
        return [sink.name for sink in self.sinks]

    def _each(self, method: str, *args) -> None:
        for sink in list(self.sinks):
            try:
                getattr(sink, method)(*args)
            except Exception as exc:  # any failure of an optional sink: turn it off, keep training
                self._disable(sink, method, exc)

    def _disable(self, sink: Sink, method: str, exc: Exception) -> None:
        self.sinks.remove(sink)
        detail = " ".join(str(exc).split())[:300]
        message = (f"{sink.name} logging failed in {method} ({type(exc).__name__}: {detail}); it is off for "
                   f"the rest of this run, the run directory keeps every metric")
        self.warn(f"mlx-grpo: warning: {message}")
        self.rundir.write_alert({"step": self._last_step, "time": _time.time(), "level": "warning",
                                 "rule": "sink_failed", "metric": "", "value": None, "message": message})
        try:
            sink.close("failed")
        except Exception:  # it already failed once; its own cleanup may fail too
            pass

    def start(self, name: str, config: Mapping[str, Any], versions: Mapping[str, Any] | None = None,
              device: Mapping[str, Any] | None = None, total_steps: int | None = None,
              run_id: str | None = None, resume_step: int | None = None) -> RunInfo:
        """Start the run directory, then each sink."""
        # resume_step only when resuming: stand-in writers (ranks > 0 of a distributed run) take the basic call.
        resume = {} if resume_step is None else {"resume_step": resume_step}
        self.info = self.rundir.start(name=name, config=config, versions=versions, device=device,
                                      total_steps=total_steps, run_id=run_id, **resume)
        # Sinks also learn where the run directory is (W&B keeps its files there by default).
        self._each("start", self.info, self.rundir.path)
        return self.info

    def write(self, step: int, scalars: Mapping[str, float], histograms: Mapping[str, np.ndarray] | None = None,
              rewards: Mapping[str, np.ndarray] | None = None, time: float | None = None) -> None:
        """One record: the run directory first, then each sink."""
        self._last_step = step
        self.rundir.write_metrics(step, scalars, time)
        self._each("write", step, scalars, histograms or {}, rewards)

    def write_samples(self, step: int, samples: Sequence[Mapping[str, Any]], time: float | None = None) -> None:
        """The samples to the run directory and each sink."""
        samples = list(samples)
        self.rundir.write_samples(step, samples, time)
        self._each("write_samples", step, samples)

    def write_alert(self, alert: Any) -> None:
        """The alert to the run directory and each sink."""
        record = json_safe(alert.to_dict() if hasattr(alert, "to_dict") else dict(alert))
        self.rundir.write_alert(record)
        self._each("write_alert", record)

    def write_final(self, metrics: Mapping[str, float]) -> None:
        """The final metrics to the run directory and each sink."""
        self.rundir.write_final_metrics(metrics)
        self._each("write_final", metrics)

    def log_checkpoint(self, path: str | Path, step: int) -> None:
        """Tell each sink a checkpoint was committed."""
        self._each("log_checkpoint", path, step)

    def log_dataset(self, name: str, splits: Mapping[str, Sequence[Mapping[str, Any]]],
                    metadata: Mapping[str, Any]) -> None:
        """Give each sink the run's rows."""
        self._each("log_dataset", name, splits, metadata)

    def log_model(self, path: str | Path, step: int) -> None:
        """Give each sink the final model."""
        self._each("log_model", path, step)

    def flush(self) -> None:
        """Flush the sinks that can."""
        self._each("flush")

    def close(self, status: str = "finished") -> None:
        """Close every sink, then the run directory (once)."""
        if self._closed:
            return
        self._closed = True
        self._each("close", status)
        self.rundir.finish(status)

    def __enter__(self) -> "SinkSet":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close("finished")
        else:
            self.close("interrupted" if issubclass(exc_type, KeyboardInterrupt) else "failed")


def make_sinks(run_dir: str | Path, tensorboard: bool = True, tensorboard_dir: str | Path | None = None,
               flush_secs: int = 2, wandb: WandbOptions | None = None, trackio: TrackioOptions | None = None,
               warn: Callable[[str], None] | None = None, fsync: bool = False,
               purge_step: int | None = None) -> SinkSet:
    """The usual SinkSet: the run directory, TensorBoard (in `run_dir/tensorboard` unless `tensorboard_dir`),
    W&B on a worker thread when `wandb` options are given, and Trackio when `trackio` options are. A sink
    whose library is missing is left out with a warning. `purge_step`: a resumed run's first step
    (TensorBoard hides what came at or after it)."""
    warn = warn or _stderr
    sinks: list[Sink] = []
    if tensorboard:
        try:
            sinks.append(TensorBoardSink(tensorboard_dir or Path(run_dir) / "tensorboard", flush_secs=flush_secs,
                                         purge_step=purge_step))
        except ImportError as exc:
            warn(f"mlx-grpo: warning: TensorBoard logging is off: {exc} (pip install tensorboardX)")
    if wandb is not None:
        try:
            sinks.append(ThreadedSink(WandbSink(wandb)))
        except ImportError as exc:
            warn(f"mlx-grpo: warning: W&B logging is off: {exc} (pip install 'mlx-grpo[wandb]')")
    if trackio is not None:
        try:
            sinks.append(TrackioSink(trackio))
        except ImportError as exc:
            warn(f"mlx-grpo: warning: Trackio logging is off: {exc} (pip install 'mlx-grpo[trackio]')")
    return SinkSet(RunDirWriter(run_dir, fsync=fsync), sinks, warn=warn)

