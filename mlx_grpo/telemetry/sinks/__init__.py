"""Where metric records go: the run directory always, TensorBoard unless turned off, W&B and Trackio when asked.

Public API (the sink seam is `base.Sink`; each sink has its own module: tensorboard.py, wandb.py,
trackio.py):

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

import numpy as np

from ..rundir.writer import RunDirWriteError, RunDirWriter, RunInfo, json_safe
from ..terminal import terminal_safe
from ...errors import install_hint
from .base import Sink
from .tensorboard import TensorBoardSink
from .wandb import WandbOptions, WandbSink
from .trackio import TrackioOptions, TrackioSink


# ----------------------------------------------------------------------------- TensorBoard


# ----------------------------------------------------------------------------- Trackio


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



def _stderr(message: str) -> None:
    print(terminal_safe(message), file=sys.stderr, flush=True)


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
        try:
            self.rundir.write_final_metrics(metrics)
        except RunDirWriteError as err:  # a full disk: run.json's final status matters more
            self.warn(f"mlx-grpo: warning: {err}")
        self._each("write_final", metrics)

    @property
    def out_of_space(self) -> str | None:
        """Set once a run-directory write needed the space set aside for the end (see RunDirWriter)."""
        return self.rundir.out_of_space

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
    return SinkSet(RunDirWriter(run_dir, fsync=fsync), sinks, warn=warn)

