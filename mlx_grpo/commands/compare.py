"""`mlx-grpo compare RUN_DIR...`: a table of the runs' config differences and final metrics (no mlx)."""

from __future__ import annotations

import argparse
import json

from ..telemetry.analysis.compare import SORT_KEYS

USES_MLX = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR",
                        help="run directories, or directories of runs (a sweep directory)")
    parser.add_argument("--sort", choices=SORT_KEYS, help="order the rows, best first (default: as given)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    from ..telemetry.analysis.compare import (comparison_json, comparison_table, expand_run_dirs, load_summary,
                                              table_console)

    summaries = [load_summary(path) for path in expand_run_dirs(args.runs)]
    if args.json:
        print(json.dumps(comparison_json(summaries, args.sort), indent=2))
    else:
        table_console().print(comparison_table(summaries, args.sort))
    return 0
