"""Where a run's records go: the run directory always, TensorBoard unless turned off, W&B and Trackio when asked,
every completion (completions/) when kept.

Every sink is a `base.Sink`: `handle(event)` and `close(status)`, the events being base.py's small types
(Start, Scalars, Samples, Completions, AlertEvent, Final, Artifact, Flush). Each sink has its own module:
tensorboard.py, wandb.py, trackio.py; the run directory's writers are rundir/writer.py and rundir/completions.py.

- `ThreadedSink(inner, max_pending=10000, close_timeout=120, lossless=False)`: runs a sink on a worker thread
  (make_sinks wraps W&B and the completions writer in one): the training thread only queues; errors surface
  on the next call; a full queue drops events instead of blocking, and `close` reports the count. A
  `lossless` one (the completions writer: run data) waits instead of dropping, and a `Flush` (a checkpoint)
  waits until everything queued is written, so a checkpoint never gets ahead of the run's files.
- `SinkSet(rundir, sinks=(), warn=None)`: what the recorder and the run talk to, itself a sink. It hands each
  event to the run directory's writer first (its errors propagate: the local record is the contract; None
  writes nothing, as on ranks other than 0) and then to the other sinks. A sink that raises is turned off for
  the rest of the run: one warning (to `warn`, default stderr) and one `sink_failed` alert in alerts.jsonl;
  training and the run directory carry on. `active` names the sinks still on; `out_of_space` says when the
  run directory needed its reserve. As a context manager it closes with `finished`, `interrupted`
  (KeyboardInterrupt) or `failed`.
- `make_sinks(run_dir, tensorboard=True, tensorboard_dir=None, flush_secs=2, wandb=None, trackio=None,
  warn=None, fsync=False, purge_step=None, completions_max_mb=None, extra=()) -> SinkSet`: the usual set; a
  sink whose library is not installed is left out with a warning.
- `start_run(sinks, name, config, **fields) -> RunInfo`: a loop of your own starts its SinkSet with this:
  run.json written (`new_run_info`'s fields: versions, device, total_steps, run_id, resume_step), then every
  sink told.
- `base.samples_markdown(samples) -> str`, `base.flatten_config(config) -> dict`: the formatting the sinks share.
"""

from __future__ import annotations

import queue
import sys
import threading
import time as _time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ...common.errors import install_hint
from ...common.terminal import terminal_safe
from ..events import AlertEvent, Completions, Final, Flush, Samples, Scalars, Sink, Start
from ..rundir.completions import CompletionsWriter
from ..rundir.layout import RunPaths
from ..rundir.writer import RunDirWriteError, RunDirWriter, RunInfo, json_safe, new_run_info
from .tensorboard import TensorBoardSink
from .trackio import TrackioOptions, TrackioSink
from .wandb import WandbOptions, WandbSink


class ThreadedSink(Sink):
    """Runs another sink's events in order on a worker thread, so a slow sink (W&B: ~1-5 ms per record,
    tens of ms for media) costs the training thread only a queue put.

    An error in the worker is raised by the next call, so SinkSet turns the sink off as usual. When the
    queue is full (the sink fell far behind) events are dropped, never waited for; `close` reports how many.
    `lossless`: a full queue is waited for instead, and a Flush waits until the queue is written.
    """

    def __init__(self, inner: Sink, max_pending: int = 10_000, close_timeout: float = 120.0,
                 lossless: bool = False):
        self.inner = inner
        self.name = inner.name
        self.close_timeout = close_timeout
        self.lossless = lossless
        self._queue: queue.Queue = queue.Queue(max_pending)
        self._error: BaseException | None = None
        self._dropped = 0
        self._thread = threading.Thread(target=self._work, name=f"mlx-grpo-{inner.name}-sink", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                method, arg = item
                if self._error is None:
                    try:
                        getattr(self.inner, method)(arg)
                    except Exception as exc:  # handed to the training thread by the next call
                        self._error = exc
            finally:
                self._queue.task_done()

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def handle(self, event: Any) -> None:
        """Queue the event for the sink's thread (a flush is waited for only by a lossless sink: otherwise the
        thread writes in order)."""
        self._raise_error()
        if isinstance(event, Flush):
            if self.lossless:
                self._queue.join()
                self._raise_error()
            return
        if self.lossless:
            self._queue.put(("handle", _detached(event)))
            return
        try:
            self._queue.put_nowait(("handle", _detached(event)))
        except queue.Full:
            self._dropped += 1

    def close(self, status: str) -> None:
        """Let the thread finish what is queued, then close the sink."""
        self._queue.put(("close", status))
        self._queue.put(None)
        self._thread.join(self.close_timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"{self.name} did not finish within {self.close_timeout:.0f} s")
        self._raise_error()
        if self._dropped:
            raise RuntimeError(f"{self._dropped} record(s) were dropped because {self.name} fell behind")


def _detached(event: Any) -> Any:
    """The event with its mappings copied: the trainer may reuse its dicts while the worker still holds them
    (the rows of a dataset are not copied: the trainer only reads them). The run directory's writer sets the
    status and end time on its RunInfo when the run ends: the worker gets a copy."""
    if isinstance(event, Start):
        return replace(event, info=replace(event.info))
    if isinstance(event, Scalars):
        return replace(event, values=dict(event.values), histograms=dict(event.histograms))
    if isinstance(event, (Samples, Completions)):
        return replace(event, rows=list(event.rows))
    if isinstance(event, AlertEvent):
        return replace(event, record=dict(event.record))
    if isinstance(event, Final):
        return replace(event, metrics=dict(event.metrics))
    return event


def _stderr(message: str) -> None:
    print(terminal_safe(message), file=sys.stderr, flush=True)


class SinkSet(Sink):
    """The run directory and every other sink, sent each event together; a failing sink is turned off with one
    warning."""

    name = "sinks"

    def __init__(self, rundir: RunDirWriter | None, sinks: Sequence[Sink] = (),
                 warn: Callable[[str], None] | None = None):
        self.rundir = rundir
        self.sinks = list(sinks)
        self.warn = warn or _stderr
        self._last_step = 0
        self._closed = False

    @property
    def active(self) -> list[str]:
        """The names of the sinks still on."""
        return [sink.name for sink in self.sinks]

    @property
    def out_of_space(self) -> str | None:
        """Set once a run-directory write needed the space set aside for the end (see RunDirWriter)."""
        return self.rundir.out_of_space if self.rundir is not None else None

    def handle(self, event: Any) -> None:
        """The event to the run directory first, then to each sink."""
        if isinstance(event, Scalars):
            self._last_step = event.step
        if isinstance(event, AlertEvent):
            event = AlertEvent(json_safe(event.record))
        if self.rundir is not None:
            try:
                self.rundir.handle(event)
            except RunDirWriteError as err:
                if not isinstance(event, Final):
                    raise
                self.warn(f"mlx-grpo: warning: {err}")  # a full disk: run.json's final status matters more
        for sink in list(self.sinks):
            try:
                sink.handle(event)
            except Exception as exc:  # any failure of an optional sink: turn it off, keep training
                self._disable(sink, type(event).__name__.lower(), exc)

    def _disable(self, sink: Sink, doing: str, exc: Exception) -> None:
        self.sinks.remove(sink)
        detail = " ".join(str(exc).split())[:300]
        message = (f"{sink.name} logging failed in {doing} ({type(exc).__name__}: {detail}); it is off for "
                   f"the rest of this run, the run directory keeps every metric")
        self.warn(f"mlx-grpo: warning: {message}")
        if self.rundir is not None:
            self.rundir.handle(AlertEvent({"step": self._last_step, "time": _time.time(), "level": "warning",
                                           "rule": "sink_failed", "metric": "", "value": None, "message": message}))
        try:
            sink.close("failed")
        except Exception:  # it already failed once; its own cleanup may fail too
            pass

    def close(self, status: str = "finished") -> None:
        """Close every sink, then the run directory (once)."""
        if self._closed:
            return
        self._closed = True
        for sink in list(self.sinks):
            try:
                sink.close(status)
            except Exception as exc:
                self._disable(sink, "close", exc)
        if self.rundir is not None:
            self.rundir.close(status)

    def __enter__(self) -> "SinkSet":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close("finished")
        else:
            self.close("interrupted" if issubclass(exc_type, KeyboardInterrupt) else "failed")


def make_sinks(run_dir: str | Path, tensorboard: bool = True, tensorboard_dir: str | Path | None = None,
               flush_secs: int = 2, wandb: WandbOptions | None = None, trackio: TrackioOptions | None = None,
               warn: Callable[[str], None] | None = None, fsync: bool = False, purge_step: int | None = None,
               completions_max_mb: float | None = None, extra: Sequence[Sink] = ()) -> SinkSet:
    """The usual SinkSet: the run directory, TensorBoard (in `run_dir/tensorboard` unless `tensorboard_dir`),
    W&B on a worker thread when `wandb` options are given, Trackio when `trackio` options are, every
    completion when `completions_max_mb` is given (0: no cap), and the `extra` sinks. A sink whose library is
    missing is left out with a warning. `purge_step`: a resumed run's first step (TensorBoard hides what came
    at or after it)."""
    warn = warn or _stderr
    sinks: list[Sink] = []
    if completions_max_mb is not None:
        # on a worker thread: compressing and writing a step's file would otherwise cost the step ~2-8 ms
        sinks.append(ThreadedSink(CompletionsWriter(run_dir, completions_max_mb, warn=warn), lossless=True))
    if tensorboard:
        try:
            sinks.append(TensorBoardSink(tensorboard_dir or RunPaths(run_dir).tensorboard, flush_secs=flush_secs,
                                         purge_step=purge_step))
        except ImportError as exc:
            warn(f"mlx-grpo: warning: TensorBoard logging is off: {exc} (pip install tensorboardX)")
        except OSError as exc:  # a tensorboard_dir that cannot be created: the run directory is the record
            warn(f"mlx-grpo: warning: TensorBoard logging is off: cannot write {exc.filename or tensorboard_dir} "
                 f"({exc.strerror or exc}); set tensorboard_dir to a writable directory")
    if wandb is not None:
        try:
            sinks.append(ThreadedSink(WandbSink(wandb)))
        except ImportError as exc:
            warn(f"mlx-grpo: warning: W&B logging is off: {exc} ({install_hint('wandb')})")
    if trackio is not None:
        try:
            sinks.append(TrackioSink(trackio))
        except ImportError as exc:
            warn(f"mlx-grpo: warning: Trackio logging is off: {exc} ({install_hint('trackio')})")
    return SinkSet(RunDirWriter(run_dir, fsync=fsync), [*sinks, *extra], warn=warn)


def start_run(sinks: SinkSet, name: str, config: Mapping[str, Any], **fields: Any) -> RunInfo:
    """Start a run on a SinkSet of `make_sinks`: its run.json (`new_run_info` with `fields`), then every sink."""
    info = new_run_info(sinks.rundir.path, name, config, **fields)
    sinks.handle(Start(info, sinks.rundir.path))
    return info
