"""Ctrl-C, SIGTERM and SIGHUP during training: finish the step, write a checkpoint, close the logs, exit 130.

SIGHUP is what a run gets when its terminal closes or an ssh session drops: it is a request to
stop, like SIGTERM, not a reason to lose the step (Python's default would end the process at once).

`StopRequest` is a context manager the run loop holds around its steps. The first SIGINT, SIGTERM
or SIGHUP only records the request (`requested` becomes the signal's name) and says what happens
next; the loop checks `requested` after each step, writes a checkpoint and stops with status
"interrupted". A second signal raises KeyboardInterrupt at once, wherever the loop is: the run
stops without a new checkpoint and the last complete one stays as it was (checkpoints are
renamed into place whole). After the second signal the previous handlers are back, so a third
one gets Python's default behaviour.

Handlers are installed only in the main thread (the only place Python delivers signals) and
restored on exit, so `train()` called from a notebook or another thread behaves as before.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from ..checkpoint import latest_checkpoint
from ..telemetry.rundir.layout import RunPaths, checkpoint_step
from .resume import resume_command

SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
EXIT_INTERRUPTED = 130  # the shell's code for a process ended by Ctrl-C


class StopRequest:
    def __init__(self) -> None:
        self.requested: str | None = None
        self._previous: dict[int, Any] = {}
        # CPython runs a Python handler once for signals that arrive together while native code (MLX)
        # runs, so two quick Ctrl-C would look like one; the wakeup pipe gets one byte per signal.
        self._wakeup: tuple[int, int] | None = None
        self._previous_wakeup = -1

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
            read, write = os.pipe()
            os.set_blocking(read, False)
            os.set_blocking(write, False)
            self._wakeup = (read, write)
            self._previous_wakeup = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._restore()

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            # None: the handler was set outside Python; the default is the closest we can restore.
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        self._previous.clear()
        if self._wakeup is not None:
            signal.set_wakeup_fd(self._previous_wakeup)
            for fd in self._wakeup:
                os.close(fd)
            self._wakeup = None

    def _arrived(self) -> int:
        """How many of our signals arrived since the last look (at least the one being handled)."""
        if self._wakeup is None:
            return 1
        try:
            data = os.read(self._wakeup[0], 4096)
        except BlockingIOError:
            data = b""
        return max(1, sum(1 for byte in data if byte in SIGNALS))

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested is None and self._arrived() < 2:
            self.requested = signal.Signals(signum).name
            try:
                print(f"mlx-grpo: {self.requested}: finishing this step and writing a checkpoint "
                      "(press Ctrl-C again to stop at once)", file=sys.stderr, flush=True)
            except OSError:  # the terminal is gone (SIGHUP): the run still checkpoints and closes
                pass
            return
        self.requested = self.requested or signal.Signals(signum).name
        self._restore()
        raise KeyboardInterrupt


def stopped_message(run_dir: Path, step: int, checkpoint_saved: bool) -> str:
    """Where an interrupted run stopped, what is saved, and the exact command to continue."""
    if checkpoint_saved:
        return f"interrupted after step {step}, checkpoint saved; continue with: {resume_command(run_dir)}"
    latest = latest_checkpoint(RunPaths(run_dir).checkpoints)
    if latest is None:
        return (f"stopped during step {step} with no checkpoint yet; "
                f"{resume_command(run_dir)} starts the run over")
    saved_step = checkpoint_step(latest)
    return (f"stopped during step {step}; the last checkpoint is step {saved_step}; "
            f"continue from it with: {resume_command(run_dir)}")


def report_stop(run_dir: Path, step: int, checkpoint_saved: bool) -> None:
    # Plain stderr, one line: a console would wrap the command, and it must paste as is.
    print(f"mlx-grpo: {stopped_message(run_dir, step, checkpoint_saved)}", file=sys.stderr, flush=True)
