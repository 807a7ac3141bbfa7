"""`mlx-grpo watch [RUN_DIR ...]`: the live terminal dashboard (or, with --web, in a browser).

Imports no mlx, at import time or when it runs: it works in a venv that only watches.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from ..common.errors import UserError, install_hint

# Each --web session is a dashboard process (~0.3 s of CPU to open, tens of MB).
DEFAULT_MAX_SESSIONS = 4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dirs", nargs="*", metavar="RUN_DIR",
                        help="run directories to watch, overlaid in one dashboard (default: the newest run under "
                             "./runs/); a directory that does not exist yet is waited for")
    parser.add_argument("--refresh", type=float, default=1.0, metavar="SECONDS",
                        help="seconds between reads of the run directory (default 1; +/- change it live)")
    parser.add_argument("--web", action="store_true",
                        help="serve the dashboard on http://localhost:PORT with textual-serve instead of the terminal; "
                             "open the address it prints (it carries a token; other sites' pages are refused)")
    parser.add_argument("--port", type=int, default=8000, help="port for --web (default 8000)")
    parser.add_argument("--max-sessions", type=int, default=DEFAULT_MAX_SESSIONS, metavar="N",
                        help=f"--web: dashboards open at once, one process each (default {DEFAULT_MAX_SESSIONS})")


def run(args: argparse.Namespace) -> int:
    from mlx_grpo.telemetry.rundir.reader import resolve_run_dirs

    if not 0 < args.refresh <= 3600:
        raise UserError(f"--refresh must be between 0 and 3600 seconds, got {args.refresh}")
    run_dirs = resolve_run_dirs(args.run_dirs)
    if args.web:
        return _serve(run_dirs, args)
    from ..tui.app import WatchApp

    WatchApp(run_dirs, refresh=args.refresh).run()
    return 0


def _serve(run_dirs: list[Path], args: argparse.Namespace) -> int:
    if not 0 < args.port < 65536:
        raise UserError(f"--port must be between 1 and 65535, got {args.port}")
    if args.max_sessions < 1:
        raise UserError(f"--max-sessions must be at least 1, got {args.max_sessions}")
    try:
        from ..tui.web import WatchServer
    except ImportError as err:  # textual-serve (and aiohttp) are the [web] extra: most installs never serve
        raise UserError(f"watch --web serves the dashboard with textual-serve, which is not installed ({err.name}): "
                        f"{install_hint('web')}") from None

    # Each browser tab gets its own dashboard process running this same command.
    command = shlex.join([sys.executable, "-m", "mlx_grpo.cli", "watch", "--refresh", str(args.refresh),
                          *(str(d.resolve()) for d in run_dirs)])
    server = WatchServer(command, port=args.port, max_sessions=args.max_sessions)
    try:
        server.serve()
    except OSError as err:
        raise UserError(f"cannot serve on localhost:{args.port}: {err.strerror or err}; pick another --port") from None
    return 0
