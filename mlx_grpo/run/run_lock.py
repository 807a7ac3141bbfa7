"""One process per run directory.

A new run directory is created exclusively (`mkdir` fails when it exists), so two runs started in the
same second with the default name get two directories instead of writing into one. The process that
trains a run then holds an advisory lock (`fcntl.flock` on `<run dir>/.lock`) for its whole life; a
`--resume` takes the same lock before anything loads, so a second process can never write into a run
that is still being trained. The operating system drops the lock when the process ends, however it
ends, so a killed run never leaves a stale lock behind.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from typing import IO

from ..common.errors import UserError
from ..telemetry.rundir.layout import RunPaths


def _unused(path: Path) -> bool:
    """A directory no run ever wrote to: a start killed between its mkdir and its run.json left it."""
    try:
        return path.is_dir() and all(p == RunPaths(path).lock for p in path.iterdir())
    except OSError:
        return False


def create_run_dir(root: Path, name: str) -> tuple[Path, "RunLock"]:
    """`root/name`, or `name-2`, `name-3`... if taken, created (or, when a killed start left it empty,
    taken over) by this call and no other, and locked."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"{root}: cannot create the run directory there ({err.strerror or err}); set "
                        "monitoring_dir to a writable directory") from None
    suffix = 1
    while True:
        path = root / (name if suffix == 1 else f"{name}-{suffix}")
        suffix += 1
        try:
            path.mkdir()
        except FileExistsError:
            if not _unused(path):
                continue
        except OSError as err:
            if err.errno == errno.ENAMETOOLONG:
                raise UserError(f"run_name {name!r} is too long for this file system ({len(name.encode())} bytes "
                                f"in UTF-8); choose a shorter one") from None
            raise UserError(f"{root}: cannot create the run directory there ({err.strerror or err}); set "
                            "monitoring_dir to a writable directory") from None
        try:
            lock = RunLock(path).acquire()
        except UserError:  # another process took it between our mkdir (or look) and now
            continue
        if _unused(path):
            return path, lock
        lock.release()


class RunLock:
    """The lock on one run directory, held from `acquire()` until `release()` or the process ends."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self._file: IO[str] | None = None

    def acquire(self) -> "RunLock":
        try:
            handle = open(RunPaths(self.run_dir).lock, "a+")
        except OSError as err:
            raise UserError(f"{self.run_dir}: cannot open its lock file ({err.strerror or err})") from None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise UserError(f"{self.run_dir}: another process (pid {holder}) is training this run; stop it "
                            "first, or start a new run with another run_name") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._file = handle
        return self

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None
