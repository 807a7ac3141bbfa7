"""`mlx-grpo report RUN_DIR`: the reward report of a run, printed and written into the run directory."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (holds metrics.jsonl)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON instead of tables")
    parser.add_argument("--no-write", dest="write", action="store_false",
                        help="do not write report.json and report.md into the run directory")


def run(args: argparse.Namespace) -> int:
    from ..telemetry.report import build_report, print_report, report_json, save_report

    title, report = build_report(args.run_dir)
    if args.write:
        save_report(args.run_dir, title, report)
    if args.json:
        print(report_json(title, report), end="")
    else:
        print_report(report, title)
        if args.write:
            print(f"wrote {args.run_dir.rstrip('/')}/report.json and report.md")
    return 0
