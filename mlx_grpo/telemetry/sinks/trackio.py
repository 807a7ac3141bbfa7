"""Trackio, local and offline: scalars and the final summary.

`TrackioOptions` and `TrackioSink(options)`: Trackio (imported only here, at construction; a missing
`trackio` raises ImportError), local and offline: its SQLite store (TRACKIO_DIR, by default
~/.cache/huggingface/trackio, where `trackio show` looks), never a Space or server, even when
TRACKIO_SPACE_ID / TRACKIO_SERVER_URL are set. `trackio.init` with the project, the run directory's name
(the same trackio run again when the run is resumed) and the run config; the same scalars at every
logged step, the final metrics at the last step; `trackio.finish` on close. It runs on the training
thread: trackio's `log` only queues for trackio's own writer thread (~0.3 ms for a step's 130 scalars), and
init and finish print trackio's own lines, which are held back there. `trackio_store()` is where the
store is, for the start-up line.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

from ...common.secrets import scrub_secrets
from ..events import Final, Scalars, Sink, Start
from ..rundir.writer import RunInfo, json_safe
from .base import tracker_config


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
        self._failure: str | None = None  # what trackio's writer thread warned about, raised by the next call

    def _catch_flush_failures(self) -> None:
        """Trackio writes from its own thread and reports a failed write (a full or read-only store) only as a
        UserWarning there; this keeps it, so the next call raises it and SinkSet turns the sink off with the
        usual warning and sink_failed alert, instead of the run saying 'no warnings or errors'."""
        shown = self._shown = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if "trackio failed to" in str(message):
                self._failure = self._failure or " ".join(str(message).split())[:300]
                return
            shown(message, category, filename, lineno, file, line)

        warnings.showwarning = show

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise OSError(self._failure)

    def handle(self, event) -> None:
        """The run's start, each step's scalars and the final metrics; nothing else."""
        if isinstance(event, Start):
            self._start(event.info)
        elif isinstance(event, Scalars):
            self._log(event.values, event.step)
            self._last_step = max(self._last_step, event.step)
        elif isinstance(event, Final):
            self._log(event.metrics, self._last_step)

    def _log(self, values, step: int) -> None:
        self._raise_failure()
        self.run.log({k: float(v) for k, v in values.items() if isinstance(v, (int, float))}, step=step)

    def _start(self, info: RunInfo) -> None:
        """Start the Trackio run in its local store."""
        opts = self.options
        config = tracker_config(info)
        # The store must be writable before anything is queued for it (trackio would only warn later).
        store = trackio_store()
        store.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=store, prefix=".mlx-grpo-write-check-"):
            pass
        self._catch_flush_failures()
        with _local_and_quiet():
            # Its system monitors are off: the run's own system metrics are among the scalars.
            self.run = self.trackio.init(project=opts.project, name=opts.name or info.name,
                                         config=json_safe(scrub_secrets(config)),
                                         resume="allow" if info.resumes else "never",
                                         auto_log_cpu=False, auto_log_gpu=False, embed=False)

    def close(self, status: str) -> None:
        """Finish the Trackio run."""
        with _local_and_quiet():
            self.trackio.finish()
        if getattr(self, "_shown", None) is not None:
            warnings.showwarning, self._shown = self._shown, None
        self._raise_failure()
