"""`mlx-grpo metrics`: print the metric catalogue, or where each seed document's metrics went.

Default: a table of every canonical metric. `--seed-map`: the seed mapping instead. `--json`: the
same data as JSON (for scripts). `--group NAME` keeps one group of the catalogue.
"""

from __future__ import annotations

import argparse
import json

from ..errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--seed-map", action="store_true",
                        help="print, for every metric named in the seed documents, the metric that answers it")
    parser.add_argument("--group", help="only this group of the catalogue (e.g. rewards, policy, system)")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from ..telemetry import catalogue

    if args.seed_map:
        rows = catalogue.seed_map_json()
        if args.json:
            print(json.dumps(rows, indent=2))
            return 0
        table = Table(title="Seed metrics and the canonical metrics that answer them", show_lines=False)
        for column in ("seed", "seed metric", "canonical", "note"):
            table.add_column(column, overflow="fold")
        for row in rows:
            table.add_row(row["seed"], row["name"], "\n".join(row["answers"]) or "[dim]none[/dim]", row["note"])
        Console().print(table)
        return 0

    rows = catalogue.catalogue_json()
    if args.group is not None:
        known = catalogue.groups()
        if args.group not in known:
            raise UserError(f"--group {args.group}: unknown group; groups are {', '.join(known)}")
        rows = [row for row in rows if row["group"] == args.group]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = Table(title=f"Metric catalogue ({len(rows)} entries)")
    table.add_column("name", style="bold", overflow="fold", no_wrap=True)
    for column in ("unit", "kind", "when", "description"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(row["name"], row["unit"], row["kind"], row["when"], row["description"])
    Console().print(table)
    return 0
