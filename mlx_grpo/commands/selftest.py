"""`mlx-grpo selftest`: prove the product on this machine in a few minutes; one report file to send back."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

USES_MLX = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", metavar="FILE", default="mlx-grpo-selftest.json",
                        help="the report to send back: JSON with a readable summary (default: %(default)s)")
    parser.add_argument("--skip", default="", metavar="CHECKS",
                        help="comma-separated checks to leave out (e.g. learning,bench for a quicker run)")
    parser.add_argument("--log", metavar="FILE", default="mlx-grpo-selftest.log",
                        help="where the training runs' own output goes (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    from ..common.errors import UserError
    from ..selftest import CHECKS, run_selftest

    skip = {name.strip() for name in args.skip.split(",") if name.strip()}
    if unknown := sorted(skip - set(CHECKS)):
        raise UserError(f"--skip: unknown check '{unknown[0]}'; choose from {', '.join(CHECKS)}")
    out = sys.stdout
    print(f"mlx-grpo selftest: {len(CHECKS) - len(skip)} checks, a few minutes; training output goes to {args.log}",
          file=out, flush=True)
    with open(args.log, "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        report = run_selftest(Path.cwd(), skip, say=lambda line: print(line, file=out, flush=True))
    Path(args.out).write_text(json.dumps(report, indent=2, default=float) + "\n")
    print("\n".join(report["summary"][:3]), file=out)
    print(f"report: {args.out} (send this file back)", file=out)
    return 0 if report["passed"] else 1
