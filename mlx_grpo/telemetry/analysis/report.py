"""The reward report of a run directory: read it, analyse it, write report.json and report.md, print it.

`write_report(run_dir)` is what the trainer calls at the end of a run and what
`mlx-grpo report RUN_DIR` runs. The analysis itself is reward_report.py's and reward_quality.py's, over
run_data.py. Imports no mlx.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ...common.errors import UserError
from ..alerts.alert import Alert
from ..alerts.console import format_alert
from ..rundir.completions import read_all
from ..rundir.jsonl_tail import JsonlTail
from ..rundir.layout import RunPaths
from ..rundir.writer import RunInfo, atomic_write_text, read_run_info
from .reward_report import RewardReport, analyze_run

MAX_LISTED_ALERTS = 20


def _read_jsonl(path: Path) -> list[dict]:
    # A finished file read in one poll; a partial last line (a writer mid-write) is dropped.
    return JsonlTail(path).poll(final=True).records


def load_run(run_dir: str | Path) -> tuple[RunInfo, list[dict], list[dict], list[Alert] | None]:
    """(run.json, metric records, completions (all kept ones, else samples.jsonl's), alerts or None when the
    run wrote no alerts.jsonl)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"run directory not found: {run_dir}")
    metrics_path = RunPaths(run_dir).metrics
    if not metrics_path.is_file():
        raise UserError(f"{metrics_path}: not found; is {run_dir} a run directory?")
    metrics = _read_jsonl(metrics_path)
    if not metrics:
        raise UserError(f"{metrics_path}: no metric records yet")
    # run.json is rewritten atomically; missing or unreadable means foreign: report without it
    run_info = read_run_info(run_dir, display=True) or RunInfo()
    # every completion when the run kept them (completions/), else the few of samples.jsonl
    samples = read_all(run_dir, display=True) or _read_jsonl(RunPaths(run_dir).samples)
    alerts_path = RunPaths(run_dir).alerts
    alerts = [Alert.from_dict(a) for a in _read_jsonl(alerts_path)] if alerts_path.is_file() else None
    return run_info, metrics, samples, alerts


def _fmt(value: Any, spec: str = ".3g") -> str:
    return "n/a" if value is None else format(value, spec)


def render_markdown(report: RewardReport, title: str) -> str:
    """The report as markdown (report.md)."""
    q = report.quality
    lines = [f"# Reward report: {title}", "",
             f"{report.steps} logged steps (steps {report.first_step} to {report.last_step}), "
             f"{report.num_samples} sampled completions, reward functions: "
             f"{', '.join(report.functions) or 'none'}.", "",
             f"**What happened:** {report.outcome.headline()}.", "",
             f"## Reward functions' quality: {_fmt(q.score, '.0f')}/100{_parts_note(report)}", "",
             "How well the reward functions can teach (signal, spread, agreement with correctness); it does not "
             "say whether the task improved: see the line above.", "",
             "| part | weight | score | why |", "|---|---|---|---|"]
    for part in q.parts:
        lines.append(f"| {part.name} | {part.weight:.0%} | {_fmt(part.score, '.0f')} | {part.explanation} |")
    lines += ["", "### Issues", ""]
    lines += [f"- {issue}" for issue in q.issues] or ["- none found"]
    lines += ["", "### Recommendations", ""]
    lines += [f"- {rec}" for rec in q.recommendations] or ["- none"]
    lines += ["", "## Reward functions", "",
              "| function | share of reward | mean | batch std | corr. with correct | corr. with total | "
              "corr. with length | note |", "|---|---|---|---|---|---|---|---|"]
    for fn, info in report.importance.items():
        share = "-" if info.contribution_pct is None else f"{info.contribution_pct:.1f}%"
        note = "constant: adds no signal" if info.constant else ""
        lines.append(f"| {fn} | {share} | {_fmt(info.mean)} | {_fmt(info.std)} | {_fmt(info.correct_corr, '.2f')} | "
                     f"{_fmt(info.total_corr, '.2f')} | {_fmt(info.length_corr, '.2f')} | {note} |")
    lines += ["", "## Trends (first quarter against last quarter)", "",
              "| metric | start | end | change | direction |", "|---|---|---|---|---|"]
    if not report.trends:
        lines.append("| (not enough logged steps yet: 8 needed) | | | | |")
    for trend in report.trends.values():
        rel = f" ({trend.percent})" if trend.percent else ""
        lines.append(f"| {trend.metric} | {trend.start:.4g} | {trend.end:.4g} | {trend.change:+.4g}{rel} | "
                     f"{trend.direction} |")
    lines += ["", "## Correlations between reward functions", ""]
    if report.correlations:
        lines += ["| functions | correlation | measured over | note |", "|---|---|---|---|"]
        for c in report.correlations:
            source = "completions" if c.source == "samples" else "step means"
            lines.append(f"| {c.a} / {c.b} | {c.corr:.2f} | {source} | {c.note} |")
    else:
        lines.append("Not enough data (or fewer than two reward functions).")
    h = report.hacking
    lines += ["", "## Reward hacking", "", f"**{h.verdict}**", ""]
    lines += [f"- {finding}" for finding in h.findings]
    lines += [f"- alert at step {a.step}: {a.message}" for a in h.alerts]
    counts = Counter(a.level for a in report.alerts)
    lines += ["", f"## Alerts ({report.alerts_source})", "",
              f"{counts.get('error', 0)} errors, {counts.get('warning', 0)} warnings, "
              f"{counts.get('info', 0)} info.", ""]
    lines += [f"- step {a.step} **{a.level}** `{a.rule}`: {a.message}" for a in report.alerts[:MAX_LISTED_ALERTS]]
    if len(report.alerts) > MAX_LISTED_ALERTS:
        lines.append(f"- ... and {len(report.alerts) - MAX_LISTED_ALERTS} more")
    return "\n".join(lines) + "\n"


def _parts_note(report: RewardReport) -> str:
    q = report.quality
    return "" if q.parts_scored == len(q.parts) else f" (from {q.parts_scored} of {len(q.parts)} parts)"


def _score_style(score: float | None) -> str:
    if score is None:
        return "dim"
    return "green" if score >= 70 else "yellow" if score >= 40 else "red"


def print_report(report: RewardReport, title: str, console: Console | None = None) -> None:
    """Print the report on the terminal."""
    if console is None:
        from ..output import output_console

        console = output_console()
    _print_quality(report, title, console)
    _print_functions_and_trends(report, console)
    notable = [c for c in report.correlations if c.note]
    if notable:
        console.print(Text("Correlations between reward functions", style="bold"))
        for c in notable:
            console.print(f"  {c.a} / {c.b}: {c.corr:.2f} — {c.note}")
    h = report.hacking
    console.print(Text.assemble(("Reward hacking: ", "bold"), (h.verdict, "red" if h.suspected else "green")))
    for finding in h.findings:
        console.print(f"  • {finding}", highlight=False)
    counts = Counter(a.level for a in report.alerts)
    console.print(Text.assemble(("Alerts ", "bold"), f"({report.alerts_source}): ",
                                f"{counts.get('error', 0)} errors, {counts.get('warning', 0)} warnings, "
                                f"{counts.get('info', 0)} info"))
    for alert in report.alerts[:MAX_LISTED_ALERTS]:
        console.print(format_alert(alert), soft_wrap=True, highlight=False)
    if len(report.alerts) > MAX_LISTED_ALERTS:
        console.print(f"  ... and {len(report.alerts) - MAX_LISTED_ALERTS} more (alerts.jsonl)")


def _print_quality(report: RewardReport, title: str, console: Console) -> None:
    """The panel: what happened, the reward functions' quality by its parts, issues and recommendations."""
    q = report.quality
    parts = Table(show_header=True, header_style="bold", expand=True, box=None)
    parts.add_column("part")
    parts.add_column("weight", justify="right")
    parts.add_column("score", justify="right")
    parts.add_column("why", ratio=1)
    for part in q.parts:
        parts.add_row(part.name, f"{part.weight:.0%}", Text(_fmt(part.score, ".0f"), _score_style(part.score)),
                      part.explanation)
    outcome = Text.assemble(("What happened: ", "bold"), report.outcome.headline())
    score = Text.assemble("Reward functions' quality ",
                          (f"{_fmt(q.score, '.0f')}/100", f"bold {_score_style(q.score)}"),
                          f"{_parts_note(report)}   {report.steps} logged steps, "
                          f"{report.num_samples} sampled completions")
    body: list[Any] = [outcome, score, parts]
    if q.issues:
        body.append(Text("\nIssues", style="bold"))
        body += [Text(f"  • {issue}", style="red") for issue in q.issues]
    if q.recommendations:
        body.append(Text("\nRecommendations", style="bold"))
        body += [Text(f"  → {rec}") for rec in q.recommendations]
    console.print(Panel(Group(*body), title=f"Reward report: {title}", title_align="left"))


def _print_functions_and_trends(report: RewardReport, console: Console) -> None:
    table = Table(title="Reward functions", title_justify="left", header_style="bold")
    for column in ("function", "share", "mean", "batch std", "r(correct)", "r(total)", "r(length)", "note"):
        table.add_column(column, justify="left" if column in ("function", "note") else "right")
    for fn, info in report.importance.items():
        share = "-" if info.contribution_pct is None else f"{info.contribution_pct:.1f}%"
        table.add_row(fn, share, _fmt(info.mean), _fmt(info.std), _fmt(info.correct_corr, ".2f"),
                      _fmt(info.total_corr, ".2f"), _fmt(info.length_corr, ".2f"),
                      Text("constant", "yellow") if info.constant else "")
    console.print(table)

    if report.trends:
        trends = Table(title="Trends (first quarter → last quarter)", title_justify="left", header_style="bold")
        for column in ("metric", "start", "end", "change", "direction"):
            trends.add_column(column, justify="left" if column in ("metric", "direction") else "right")
        for t in report.trends.values():
            rel = f" ({t.percent})" if t.percent else ""
            style = {"rising": "green", "falling": "red"}.get(t.direction, "dim")
            trends.add_row(t.metric, f"{t.start:.4g}", f"{t.end:.4g}", f"{t.change:+.4g}{rel}",
                           Text(t.direction, style))
        console.print(trends)
    else:
        console.print(Text("Trends: not enough logged steps yet (8 needed)", style="dim"))


def build_report(run_dir: str | Path) -> tuple[str, RewardReport]:
    """(run title, report) of a run directory, writing nothing."""
    run_info, metrics, samples, alerts = load_run(run_dir)
    title = run_info.name or Path(run_dir).resolve().name
    return title, analyze_run(metrics, samples, alerts)


def report_json(title: str, report: RewardReport) -> str:
    """The report as JSON text."""
    return json.dumps({"run": title, **report.to_dict()}, indent=2) + "\n"


def save_report(run_dir: str | Path, title: str, report: RewardReport) -> None:
    """Write report.json and report.md into the run directory."""
    run_dir = Path(run_dir)
    atomic_write_text(RunPaths(run_dir).report_json, report_json(title, report))
    atomic_write_text(RunPaths(run_dir).report_md, render_markdown(report, title))


def write_report(run_dir: str | Path) -> RewardReport:
    """Analyse a run directory and write report.json and report.md into it (the trainer calls this at the end)."""
    title, report = build_report(run_dir)
    save_report(run_dir, title, report)
    return report
