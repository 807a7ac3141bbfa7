"""`mlx-grpo report RUN [RUN ...] --html`: one self-contained HTML file with the pictures of a run.

The charts a user would otherwise open TensorBoard for — reward per function, accuracy, KL and
entropy, lengths, throughput, memory, the alert timeline — drawn by matplotlib as inline SVG with
text as paths (no fonts to fetch), plus sample completions and the reward report. Several runs
overlay in every chart. The file makes no network request: no scripts, no CDN, no web fonts.
matplotlib is an optional extra (`pip install -e '.[report]'` in the checkout). Imports no mlx.
"""

from __future__ import annotations

import html
import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ...common.errors import UserError, install_hint
from ..metrics.names import (
    ACCEL_PEAK_GB,
    ACCURACY_TRAIN,
    BACKPROP_TOKENS_PER_S,
    ENTROPY,
    EVAL_ACCURACY,
    GEN_TOKENS_PER_S,
    KL,
    LENGTH_MEAN,
    PROCESS_RSS_GB,
    REWARD_MEAN,
    TOOL_CALL_FREQUENCY,
    TOOL_CALLED_FRAC,
    TOOL_FAILURE_FREQUENCY,
    TRUNCATED_FRAC,
    legend_names,
)
from ..rundir.completions import reward_heatmap
from ..rundir.writer import RunInfo, atomic_write_text
from ..smoothing import ema
from .report import load_run
from .reward_report import RewardReport, analyze_run
from .run_data import RunData

# (title, y label, metrics): a metric with `*` stands for every reward function's.
CHARTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("Total reward", "reward", (REWARD_MEAN,)),
    ("Reward per function", "mean reward", ("rewards/*/mean",)),
    # a format reward's line here is format adherence: the share of completions that kept the form
    ("Completions each reward paid", "fraction scored > 0", ("rewards/*/positive_frac",)),
    ("Accuracy", "fraction correct", (ACCURACY_TRAIN, EVAL_ACCURACY)),
    ("Held-out accuracy", "fraction correct", (EVAL_ACCURACY,)),
    ("Tool use", "fraction; calls per trajectory", (TOOL_CALLED_FRAC, TOOL_FAILURE_FREQUENCY, TOOL_CALL_FREQUENCY)),
    ("KL to the reference", "KL", (KL,)),
    ("Entropy", "nats", (ENTROPY,)),
    ("Completion length", "tokens", (LENGTH_MEAN,)),
    ("Truncated completions", "fraction", (TRUNCATED_FRAC,)),
    ("Throughput", "tokens/s", (GEN_TOKENS_PER_S, BACKPROP_TOKENS_PER_S)),
    ("Memory", "GB", (PROCESS_RSS_GB, ACCEL_PEAK_GB, "memory/rollout_peak_gb",
                      "memory/update_peak_gb")),
)
RUN_STYLES = ("-", "--", ":", "-.")
LEVEL_COLOURS = {"info": "#4c8bf5", "warning": "#e8a317", "error": "#d93025"}
SAMPLES_SHOWN = 8


@dataclass
class LoadedRun:
    """A run read for the HTML report: its title, run.json, data and reward report."""

    title: str
    info: RunInfo
    data: RunData
    report: RewardReport


def load_runs(run_dirs: Sequence[str | Path]) -> list[LoadedRun]:
    """Read every named run directory (UserError for one that holds no run)."""
    runs = []
    for run_dir in run_dirs:
        info, metrics, samples, alerts = load_run(run_dir)
        title = info.name or Path(run_dir).resolve().name
        runs.append(LoadedRun(title, info, RunData(metrics, samples), analyze_run(metrics, samples, alerts)))
    return runs


def require_matplotlib() -> None:
    """Checked before anything is printed or written: a missing extra is the first and only line."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise UserError(f"report --html and --svg draw their charts with matplotlib: {install_hint('report')}")


def _pyplot():
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams.update({"svg.fonttype": "path", "font.size": 9, "axes.spines.top": False,
                                "axes.spines.right": False, "svg.hashsalt": "mlx-grpo",
                                # names come from run files: '$...$' in one is text, not mathtext to parse
                                "text.parse_math": False})
    import matplotlib.pyplot as plt

    return plt


def _metric_names(pattern: str, runs: Sequence[LoadedRun]) -> list[str]:
    if "*" not in pattern:
        return [pattern]
    prefix, suffix = pattern.split("*")
    names = {n for run in runs for n in run.data.table.names
             if n.startswith(prefix) and n.endswith(suffix) and "/" not in n[len(prefix):-len(suffix)]}
    return sorted(names - {REWARD_MEAN})


def _svg(fig, tight: bool = True) -> str:
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", bbox_inches="tight" if tight else None)
    text = buffer.getvalue()
    text = re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)  # RDF boilerplate naming web addresses
    return text[text.index("<svg"):]  # drop the XML prolog and DOCTYPE: the SVG sits inside HTML


def chart_svg(plt, title: str, ylabel: str, patterns: Sequence[str], runs: Sequence[LoadedRun],
              smoothing: float = 0.0) -> str | None:
    """One chart as SVG (see chart_figure); None when no run has any of its metrics."""
    fig = chart_figure(plt, title, ylabel, patterns, runs, smoothing)
    if fig is None:
        return None
    svg = _svg(fig, tight=False)  # laid out by chart_figure: every chart's plot the same width on the page
    plt.close(fig)
    return svg


def chart_figure(plt, title: str, ylabel: str, patterns: Sequence[str], runs: Sequence[LoadedRun],
                 smoothing: float = 0.0):
    """One chart, every run and every matching metric as a line; None when no run has any of them.
    `smoothing` > 0 draws TensorBoard's exponential moving average over the raw points, which stay
    faint beneath it. The legend sits under the axes, in columns, every name in full."""
    # A colour per metric, a line style per run: overlaid runs of one metric read as one family. With
    # one metric, each run gets a colour of its own as well (three seeds in one colour were hard to follow).
    lines = []
    names = [name for pattern in patterns for name in _metric_names(pattern, runs)]
    short = dict(zip(names, legend_names(names)))  # answer_check, not rewards/answer_check/mean
    for k, name in enumerate(names):
        for r, run in enumerate(runs):
            steps, values = run.data.series(name)
            if len(values):
                label = short[name] if len(runs) == 1 else f"{run.title}: {short[name]}"
                colour = f"C{(r if len(names) == 1 else k) % 10}"
                lines.append((steps, values, label, colour, RUN_STYLES[r % len(RUN_STYLES)]))
    if not lines:
        return None
    columns = 1 if len(lines) < 2 else 2 if max(len(label) for *_, label, _, _ in lines) > 28 else 3
    legend_rows = -(-len(lines) // columns) if len(lines) > 1 else 0
    # Fixed margins in inches, the legend's rows added below: the plots line up from chart to chart.
    height = 2.9 + (0.3 + 0.19 * legend_rows if legend_rows else 0.0)
    fig = plt.figure(figsize=(6.2, height))
    bottom = 0.55 + (0.3 + 0.19 * legend_rows if legend_rows else 0.0)
    ax = fig.add_axes((0.8 / 6.2, bottom / height, 5.2 / 6.2, (height - bottom - 0.35) / height))
    for steps, values, label, colour, style in lines:
        if smoothing > 0 and len(values) > 1:
            ax.plot(steps, values, linewidth=1.0, color=colour, linestyle=style, alpha=0.25)
            values = ema(values, smoothing)
        ax.plot(steps, values, marker="o" if len(values) < 15 else None, markersize=3, linewidth=1.4, label=label,
                color=colour, linestyle=style)
    ax.set_title(title + (f" (smoothed {smoothing:g})" if smoothing > 0 else ""), loc="left", fontweight="bold")
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    _sane_spans(ax, np.concatenate([np.asarray(s, float) for s, *_ in lines]),
                np.concatenate([np.asarray(v, float) for _, v, *_ in lines]))
    ax.grid(alpha=0.3)
    if len(lines) > 1:
        # Under the axes, not beside them: every chart keeps the same plot width, and names are not cut.
        ax.legend(fontsize=8, frameon=False, loc="upper left", ncol=columns, handlelength=2.6, columnspacing=1.2,
                  bbox_to_anchor=(-0.02, (bottom - 0.5) / height), bbox_transform=fig.transFigure)
    return fig


def _sane_spans(ax, steps: np.ndarray, values: np.ndarray) -> None:
    """Whole-step ticks (steps are integers: no 1.5), and spans a reader can trust: one step gets a step either
    side, not -0.04..0.04; a constant gets a span around its value; data that is never negative starts at 0."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    steps, values = steps[np.isfinite(steps)], values[np.isfinite(values)]
    if len(steps) and steps.min() == steps.max():
        ax.set_xlim(steps.min() - 1, steps.max() + 1)
    if not len(values):
        return
    lo, hi = float(values.min()), float(values.max())
    if hi - lo <= 1e-12 * max(1.0, abs(hi)):
        pad = abs(hi) * 0.5 if hi else 1.0
        lo, hi = lo - pad, hi + pad
        ax.set_ylim(lo, hi)
    if float(values.min()) >= 0 and ax.get_ylim()[0] < 0:
        ax.set_ylim(bottom=0)


def alert_timeline_svg(plt, runs: Sequence[LoadedRun]) -> str | None:
    """Each run's alerts as marks on a step axis, coloured by level."""
    from matplotlib.ticker import MaxNLocator

    if not any(run.report.alerts for run in runs):
        return None
    fig, ax = plt.subplots(figsize=(6.2, 0.5 + 0.45 * len(runs)))
    labelled: set[str] = set()
    for row, run in enumerate(runs):
        for level, colour in LEVEL_COLOURS.items():
            steps = [a.step for a in run.report.alerts if a.level == level]
            if steps:
                ax.scatter(steps, [row] * len(steps), color=colour, s=28, marker="|" if level == "info" else "o",
                           label=None if level in labelled else level)
                labelled.add(level)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_yticks(range(len(runs)), [run.title for run in runs])
    ax.set_ylim(-0.6, len(runs) - 0.4)
    ax.set_xlabel("step")
    ax.set_title("Alerts", loc="left", fontweight="bold")
    ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    svg = _svg(fig)
    plt.close(fig)
    return svg


def _rounded(value: Any) -> Any:
    """A reward as people read it: 7.333, not 7.333333333333333."""
    return f"{value:.4g}" if isinstance(value, float) else value


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _report_section(run: LoadedRun) -> str:
    q = run.report.quality
    parts = "".join(f"<tr><td>{_e(p.name)}</td><td>{p.weight:.0%}</td>"
                    f"<td>{'n/a' if p.score is None else f'{p.score:.0f}'}</td><td>{_e(p.explanation)}</td></tr>"
                    for p in q.parts)
    issues = "".join(f"<li>{_e(i)}</li>" for i in q.issues) or "<li>none found</li>"
    recs = "".join(f"<li>{_e(r)}</li>" for r in q.recommendations)
    return (f"<section><h2>{_e(run.title)}</h2>"
            f"<p class='outcome'><b>What happened:</b> {_e(run.report.outcome.headline())}.</p>"
            f"<h3>Reward functions' {_e(q.headline())}</h3>"
            f"<table><tr><th>part</th><th>weight</th><th>score</th><th>why</th></tr>{parts}</table>"
            f"<h4>Issues</h4><ul>{issues}</ul>" + (f"<h4>Recommendations</h4><ul>{recs}</ul>" if recs else "")
            + f"<p><b>Reward hacking:</b> {_e(run.report.hacking.verdict)}</p></section>")


def _samples_section(run: LoadedRun) -> str:
    samples = run.data.samples[-SAMPLES_SHOWN:]
    if not samples:
        return ""
    rows = "".join(
        f"<tr><td>{_e(s.get('step'))}</td><td><pre>{_e(s.get('prompt'))}</pre></td>"
        f"<td><pre>{_e(s.get('completion'))}</pre></td><td>{_e(s.get('answer'))}</td>"
        f"<td>{_e(_rounded(s.get('total')))}</td><td>{'yes' if s.get('correct') else 'no'}</td></tr>"
        for s in samples if isinstance(s, dict))
    return (f"<section><h3>Sample completions: {_e(run.title)} (last {len(samples)})</h3><table>"
            "<tr><th>step</th><th>prompt</th><th>completion</th><th>answer</th><th>reward</th><th>correct</th></tr>"
            f"{rows}</table></section>")


STYLE = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 24px auto; max-width: 1320px;
       color: #202124; background: #fff; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 28px; } h3 { font-size: 15px; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(620px, 1fr)); gap: 12px; }
.chart { border: 1px solid #e0e0e0; border-radius: 6px; padding: 6px; margin: 0; }
.chart svg { width: 100%; height: auto; }
table { border-collapse: collapse; font-size: 13px; margin: 6px 0; }
td, th { border: 1px solid #e0e0e0; padding: 4px 8px; text-align: left; vertical-align: top; }
pre { margin: 0; white-space: pre-wrap; font-size: 12px; max-width: 460px; }
.outcome { font-size: 15px; background: #f5f7fb; padding: 8px 12px; border-radius: 6px; }
"""


def reward_heatmap_svg(plt, run: LoadedRun) -> str | None:
    """Every kept completion's total reward, step x example (completions/), or None without them."""
    steps, matrix = reward_heatmap(run.data.samples)
    if len(steps) < 2:
        return None
    fig, ax = plt.subplots(figsize=(6.2, 2.8))
    image = ax.imshow(np.ma.masked_invalid(matrix), aspect="auto", interpolation="nearest", cmap="viridis",
                      extent=(steps[0] - 0.5, steps[-1] + 0.5, matrix.shape[0], 0))
    fig.colorbar(image, ax=ax, label="total reward")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(f"Reward of every completion: {run.title}", loc="left", fontweight="bold")
    ax.set_xlabel("step")
    ax.set_ylabel("example (groups by mean, best first)")
    svg = _svg(fig)
    plt.close(fig)
    return svg


def draw_charts(runs: Sequence[LoadedRun], smoothing: float = 0.0) -> list[tuple[str, str]]:
    """(title, SVG) of every chart some run has data for, then each run's reward heatmap, the alert
    timeline last."""
    plt = _pyplot()
    charts = [(title, svg) for title, ylabel, metrics in CHARTS
              if (svg := chart_svg(plt, title, ylabel, metrics, runs, smoothing))]
    for run in runs:
        if (heatmap := reward_heatmap_svg(plt, run)) is not None:
            charts.append((f"Reward heatmap {run.title}" if len(runs) > 1 else "Reward heatmap", heatmap))
    timeline = alert_timeline_svg(plt, runs)
    if timeline is not None:
        charts.append(("Alerts", timeline))
    return charts


def render_html(runs: Sequence[LoadedRun], smoothing: float = 0.0) -> str:
    """The report of one or several runs as one self-contained HTML page."""
    charts = draw_charts(runs, smoothing)
    names = ", ".join(run.title for run in runs)
    body = [f"<h1>mlx-grpo run report: {_e(names)}</h1>",
            "<div class='charts'>" + "".join(f"<figure class='chart' title='{_e(title)}'>{svg}</figure>"
                                             for title, svg in charts) + "</div>"]
    body += [_report_section(run) for run in runs]
    body += [_samples_section(run) for run in runs]
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>mlx-grpo report: {_e(names)}</title><style>{STYLE}</style></head><body>"
            + "\n".join(body) + "</body></html>\n")


def chart_file_name(title: str) -> str:
    """'Held-out accuracy' -> 'held-out-accuracy.svg'."""
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-") + ".svg"


def write_chart_files(run_dirs: Sequence[str | Path], out_dir: str | Path, smoothing: float = 0.0) -> list[Path]:
    """Each chart of the runs (overlaid) as its own SVG file in `out_dir`, for a README or a slide."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for title, svg in draw_charts(load_runs(run_dirs), smoothing):
        path = out / chart_file_name(title)
        atomic_write_text(path, svg)
        paths.append(path)
    return paths


def write_html_report(run_dirs: Sequence[str | Path], out: str | Path | None = None, smoothing: float = 0.0) -> Path:
    """Write the report of one or more runs; the default place is report.html in the first run directory."""
    runs = load_runs(run_dirs)
    path = Path(out) if out is not None else Path(run_dirs[0]) / "report.html"
    atomic_write_text(path, render_html(runs, smoothing))
    return path
