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
    parser.add_argument("--diverge", action="store_true",
                        help="for two runs: the first step where their metrics part beyond their step-to-step "
                             "noise, and which metric moved first")


def run(args: argparse.Namespace) -> int:
    from ..telemetry.analysis.compare import (
        comparison_json,
        comparison_table,
        expand_run_dirs,
        load_summary,
        table_console,
    )

    paths = expand_run_dirs(args.runs)
    if args.diverge:
        return diverge(paths, args.json)
    summaries = [load_summary(path) for path in paths]
    if args.json:
        print(json.dumps(comparison_json(summaries, args.sort), indent=2))
    else:
        table_console().print(comparison_table(summaries, args.sort))
    return 0


def diverge(paths: list, as_json: bool) -> int:
    """`--diverge`: where two runs part, metric by metric, the earliest first."""
    from dataclasses import asdict

    from ..common.errors import UserError
    from ..telemetry.analysis.divergence import divergence
    from ..telemetry.analysis.report import load_run

    if len(paths) != 2:
        raise UserError(f"--diverge compares exactly two runs; got {len(paths)}")
    (_, a, _, _), (_, b, _, _) = load_run(paths[0]), load_run(paths[1])
    partings = divergence(a, b)
    if as_json:
        print(json.dumps([asdict(p) for p in partings], indent=2))
        return 0
    if not partings:
        print(f"{paths[0].name} and {paths[1].name} do not part beyond their step-to-step noise on any training "
              f"metric they both log (at least 8 common steps needed)")
        return 0
    first = partings[0]
    print(f"{paths[0].name} and {paths[1].name} part at step {first.step}: {first.metric} moved first "
          f"({first.a:.4g} vs {first.b:.4g}, {first.strength:.1f} noise units)")
    for p in partings[1:]:
        print(f"  step {p.step}: {p.metric} ({p.a:.4g} vs {p.b:.4g}, {p.strength:.1f} noise units)")
    return 0
