"""TensorBoard: event files with scalars, histograms, samples, alerts, hparams and the custom layout.

`TensorBoardSink(logdir, flush_secs=2, purge_step=None)`: tensorboardX event files in `logdir` (the run's
`tensorboard/`): all scalars of a step as one event, histograms, samples as a markdown table
(`samples/completions`), alerts (`alerts`), the final metrics, a custom-scalars layout grouping
the chart groups of metrics/charts.py, and the config as hyper-parameters **in the same run**:
tensorboardX's `add_hparams` writes into a new timestamped sub-directory, so this sink writes the
hparams plugin's experiment and session-start summaries into its own event file instead, and the
session-end status when it closes. `purge_step` (a resumed run's first step) hides the events an
interrupted session wrote at or after that step. A write error in tensorboardX's writer thread (a
full disk) is kept and raised by the sink's next call, so SinkSet turns TensorBoard off with a
warning; left alone, the thread would die and the training thread block on its full queue.
"""

from __future__ import annotations

import json
import os
import threading
import time as _time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..events import AlertEvent, Final, Flush, Samples, Scalars, Sink, Start
from ..metrics.charts import tensorboard_layout
from ..metrics.names import ACCURACY_TRAIN, EVAL_ACCURACY, LOSS, REWARD_MEAN, SAMPLES_TABLE
from ..rundir.layout import RunPaths
from ..rundir.writer import RunInfo, json_safe, read_run_info
from .base import _fmt, _md_cell, flatten_config, samples_markdown

# A fixed bin count: tensorboardX's default ("tensorflow" edges) costs ~2.5 ms per histogram, 30 bins ~0.2 ms.
HIST_BINS = 30


HPARAM_METRICS = (REWARD_MEAN, ACCURACY_TRAIN, EVAL_ACCURACY, LOSS)


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
    from ..analysis.compare import differing_keys

    if run_dir is None:
        return values
    here = Path(run_dir)
    try:
        siblings = sorted((p for p in here.parent.iterdir() if p != here and RunPaths(p).run_json.is_file()),
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

    def handle(self, event) -> None:
        """Scalars and histograms, samples as a table, alerts and final metrics as text; a flush on request."""
        if isinstance(event, Start):
            self._start(event.info, event.run_dir)
        elif isinstance(event, Scalars):
            self._write(event.step, event.values, event.histograms)
        elif isinstance(event, Samples):
            self._raise_write_error()
            self.writer.add_text(SAMPLES_TABLE, samples_markdown(event.rows), event.step)
        elif isinstance(event, AlertEvent):
            self._alert(event.record)
        elif isinstance(event, Final):
            self._final(event.metrics)
        elif isinstance(event, Flush):
            self._flush()

    def _start(self, info: RunInfo, run_dir: Path) -> None:
        """Open the event writer and write the layout, the config and the hparams."""
        from tensorboardX.summary import hparams

        self.writer.add_custom_scalars(tensorboard_layout())
        hparam_values = differing_first(flatten_config(info.config), run_dir)
        experiment, session_start, _ = hparams(hparam_values, {name: 0.0 for name in HPARAM_METRICS})
        # tensorboardX's public add_hparams writes these into a new timestamped sub-run (TensorBoard then shows
        # two runs per run); tensorboard's summary_v2.hparams_pb would need the tensorboard package. So its
        # public summary builder, written through the run's own file writer (tensorboardX pinned below 3).
        file_writer = self.writer._get_file_writer()
        file_writer.add_summary(experiment)
        file_writer.add_summary(session_start)
        shown = {**info.to_dict(), "run_dir": str(run_dir)}
        self.writer.add_text("run", "```\n" + json.dumps(json_safe(shown), indent=2) + "\n```", 0)

    def _write(self, step, scalars, histograms) -> None:
        """Scalars and histograms of one step."""
        self._raise_write_error()
        # One event holding every scalar: ~100 add_scalar calls would cost ~10x more per step.
        values = [self._summary.Value(tag=name, simple_value=float(value))
                  for name, value in scalars.items() if value is not None]
        self.writer._get_file_writer().add_summary(self._summary(value=values), step)
        for name, array in histograms.items():
            self.writer.add_histogram(name, np.asarray(array, dtype=np.float64), step, bins=HIST_BINS)
        self._last_step = max(self._last_step, step)

    def _flush(self) -> None:
        """Write what is queued to disk now."""
        if self._guard is not None:
            self._guard.flush_queued()
        else:
            self.writer.flush()
        self._raise_write_error()

    def _alert(self, alert) -> None:
        """The alert as text under `alerts`."""
        self._raise_write_error()
        text = f"**{alert.get('level', 'info')}** `{alert.get('rule', '')}` {_md_cell(alert.get('message'))}"
        self.writer.add_text("alerts", text, int(alert.get("step") or self._last_step))

    def _final(self, metrics) -> None:
        """The final metrics, and the hparams' results."""
        self._raise_write_error()
        self._write(self._last_step, {k: v for k, v in metrics.items() if isinstance(v, (int, float))}, {})
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
