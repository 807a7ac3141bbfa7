"""What the server reads off a run directory before it lists, reads or signals it: a plain run name, entries
that stay inside, the lock's holder and its start time, the newest checkpoint, the console log's last line."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path
from typing import Any

from ..common.errors import UserError
from ..common.terminal import terminal_safe
from ..common.user_files import open_regular
from ..telemetry.rundir.layout import LOCK, RUN_JSON, RunPaths, checkpoint_step

MAX_RUNS = 100  # runs list_runs returns at most; `skip` pages on
MAX_ENTRIES = 10_000  # directory entries looked at for links out of a run

def _check_run_name(name: Any) -> None:
    """A run name is one plain path component, as `train` takes it: refused before anything is written."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name \
            or any(ord(c) < 32 or ord(c) == 127 for c in name) or len(name.encode()) > 200:
        raise UserError(f"run_name {terminal_safe(str(name))!r}: expected a plain name (one folder name, no '/', no "
                        "'..', no control characters)")


def _entries(folder: Path) -> list[Path]:
    """At most MAX_ENTRIES entries of a folder (none when it cannot be listed)."""
    out = []
    try:
        with os.scandir(folder) as it:
            for entry in it:
                out.append(Path(entry.path))
                if len(out) >= MAX_ENTRIES:
                    break
    except OSError:
        pass
    return out


def _is_run(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode) and stat.S_ISREG(os.lstat(path / RUN_JSON).st_mode)
    except OSError:
        return False


def _mtime(path: Path) -> float:
    try:
        return os.lstat(path).st_mtime
    except OSError:
        return 0.0


def _link_out(run_dir: Path) -> str | None:
    """The first entry of the run directory (or of its completions/ and checkpoints/) that is a symbolic link
    leading out of it, relative to it; None when there is none."""
    base = Path(os.path.realpath(run_dir))
    for folder in (run_dir, RunPaths(run_dir).completions, RunPaths(run_dir).checkpoints):
        for entry in _entries(folder):
            if entry.is_symlink():
                target = Path(os.path.realpath(entry))
                if target != base and base not in target.parents:
                    return str(entry.relative_to(run_dir))
    return None


def _lock_holder(run_dir: Path) -> int | None:
    """The pid written in the run's `.lock` when a process holds that lock; None when no one does."""
    try:
        fd = os.open(run_dir / LOCK, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                return None
            text = os.read(fd, 32).decode("ascii", "replace").strip()
            return int(text) if text.isdigit() else None
        fcntl.flock(fd, fcntl.LOCK_UN)  # we got it: no process holds the lock
        return None
    finally:
        os.close(fd)


def _start_time(pid: int) -> float | None:
    """When process `pid` started (Unix seconds); None when it cannot be told."""
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _checkpoint_step(path: Path) -> int | None:
    """The step of a checkpoint directory, a real one (not a file, not a symbolic link)."""
    step = checkpoint_step(path)
    return step if step is not None and path.is_dir() and not path.is_symlink() else None


def _last_line(log: Path) -> str:
    try:
        with open_regular(log) as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 4096))
            lines = [line for line in f.read().decode("utf-8", "replace").splitlines() if line.strip()]
    except OSError:
        return "(no console output)"
    return terminal_safe(lines[-1]) if lines else "(no console output)"


