"""`mlx-grpo metrics`: the metric catalogue, and other tools' names for the same metrics.

Default: a table of every canonical metric. `NAME`: look one name up, ours or another tool's
(`mlx-grpo metrics frac_reward_zero_std`). `--other-names`: every TRL / verl / Tunix / TensorBoard-guide
name and ours. `--json`: the same data as JSON (for scripts). `--group NAME` keeps one group.
`--write PATH`: the whole catalogue as markdown (the repository's METRICS.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..common.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="a metric name to look up: ours, or another tool's "
                                                "(e.g. frac_reward_zero_std, actor/pg_clipfrac)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--other-names", action="store_true",
                        help="list other tools' metric names (TRL, verl, Tunix, TensorBoard guide) and ours")
    parser.add_argument("--group", help="only this group of the catalogue (e.g. rewards, policy, system)")
    parser.add_argument("--write", metavar="PATH", help="write the catalogue and other tools' names as markdown "
                                                        "(METRICS.md) to PATH")


def metrics_markdown() -> str:
    """The text of METRICS.md: the catalogue, then other tools' names for its metrics."""
    from ..telemetry.metrics import catalogue, other_names

    return "\n".join(catalogue.render_markdown() + other_names.render_markdown())


def _lookup(name: str) -> list[dict]:
    from ..telemetry.metrics import catalogue, other_names

    rows = []
    entry = catalogue.find_entry(name)
    if entry is not None:
        rows.append({"name": name, "ours": entry.name, "tool": "mlx-grpo", "note": entry.description})
    for m in other_names.lookup(name):
        rows.append({"name": m.name, "ours": ", ".join(m.answers) or "none", "tool": other_names.SOURCES[m.source],
                     "note": m.note})
    if not rows:
        raise UserError(f"no metric named '{name}', ours or another tool's; `mlx-grpo metrics` lists ours and "
                        "`mlx-grpo metrics --other-names` the others")
    return rows


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    from ..telemetry.metrics import catalogue, other_names
    from ..telemetry.output import output_console

    if args.write is not None:
        Path(args.write).write_text(metrics_markdown(), encoding="utf-8")
        return 0
    if args.name is not None:
        rows = _lookup(args.name)
        if args.json:
            print(json.dumps(rows, indent=2))
            return 0
        table = Table(title=f"{args.name}")
        for column in ("tool", "name", "ours", "note"):
            table.add_column(column, overflow="fold")
        for row in rows:
            table.add_row(row["tool"], row["name"], row["ours"], row["note"])
        output_console().print(table)
        return 0

    if args.other_names:
        rows = other_names.other_names_json()
        if args.json:
            print(json.dumps(rows, indent=2))
            return 0
        table = Table(title="Other tools' metric names and ours", show_lines=False)
        for column in ("tool", "their name", "ours", "note"):
            table.add_column(column, overflow="fold")
        for row in rows:
            table.add_row(row["source"], row["name"], "\n".join(row["answers"]) or "[dim]none[/dim]", row["note"])
        output_console().print(table)
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
    output_console().print(table)
    return 0
