"""`mlx-grpo selftest`: prove the product on this machine in a few minutes; one report file to send back."""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import os
import sys
from pathlib import Path
from typing import Iterator

USES_MLX = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", metavar="FILE", default="mlx-grpo-selftest.json",
                        help="the report to send back: JSON with a readable summary, rewritten after every check "
                             "(default: %(default)s)")
    parser.add_argument("--skip", default="", metavar="CHECKS",
                        help="comma-separated checks to leave out (e.g. learning,bench for a quicker run)")
    parser.add_argument("--quick", action="store_true",
                        help="leave out the two checks that train: the real model (SmolLM2, a 93 MB download "
                             "on first use) and learning (under 2 minutes on a 2-core CPU)")
    parser.add_argument("--log", metavar="FILE", default="mlx-grpo-selftest.log",
                        help="where the training runs' own output goes (default: %(default)s)")


def writable(path: Path, what: str) -> None:
    """One line naming the file when the report or log cannot be written here (a read-only directory)."""
    from ..common.errors import UserError

    try:
        with open(path, "a"):
            pass
    except OSError as err:
        raise UserError(f"selftest cannot write its {what} '{path}' ({err.strerror}): run it from a writable "
                        f"directory, or give --out/--log a path there") from None


def write_atomically(path: Path, report: dict) -> None:
    """The whole report or the previous one, never half of it: a process killed mid-write leaves a report."""
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(report, indent=2, default=float) + "\n")
    os.replace(part, path)


@contextlib.contextmanager
def native_stderr_to(log) -> Iterator[None]:
    """File descriptor 2 into `log` for the run: what native code writes there (MLX before 0.32 writes
    "[METAL] Command buffer execution failed: ..." just before it aborts) lands in the log and its tail in
    the report, not on the terminal only."""
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        log.flush()
        os.dup2(saved, 2)
        os.close(saved)


def run(args: argparse.Namespace) -> int:
    from ..planning.tf32 import full_float32

    tf32_at_start = full_float32()  # before MLX's first matmul reads it: an M5 compares full float32
    from ..common.errors import UserError
    from ..measuring.selftest import CHECKS, QUICK_SKIP, run_selftest

    skip = {name.strip() for name in args.skip.split(",") if name.strip()}
    if unknown := sorted(skip - set(CHECKS)):
        raise UserError(f"--skip: unknown check '{unknown[0]}'; choose from {', '.join(CHECKS)}")
    if args.quick:
        skip |= set(QUICK_SKIP)
    out_path, log_path = Path(args.out), Path(args.log)
    writable(out_path, "report")
    writable(log_path, "log")
    out = sys.stdout
    print(f"mlx-grpo selftest: {len(CHECKS) - len(skip)} checks, a few minutes; training output goes to {args.log}; "
          f"{args.out} is rewritten after every check (if this stops early, send both files)", file=out, flush=True)
    with open(log_path, "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log), \
            native_stderr_to(log):
        # a native abort (Metal out of memory, the GPU watchdog) ends the process past Python's handlers:
        # the Python stack of every thread still goes into the log
        faulthandler.enable(file=log, all_threads=True)
        try:
            report = run_selftest(Path.cwd(), skip, say=lambda line: print(line, file=out, flush=True),
                                  write=lambda doc: write_atomically(out_path, doc), log=log_path,
                                  out_name=args.out, tf32_at_start=tf32_at_start)
        finally:
            faulthandler.disable()
    print("\n".join(report["summary"][:5]), file=out)
    print(report["summary"][-1], file=out)
    return 0 if report["passed"] else 1
