"""`mlx-grpo report --html`: one self-contained file with every chart, runs overlaid, and nothing fetched."""

import re

from synthetic_runs import Faults, simulate, write_run_dir

from mlx_grpo.cli import main


def _runs(tmp_path):
    metrics, samples = simulate(60, 0, Faults())
    metrics = [{**r, "system/process_rss_gb": 1.5 + 0.001 * r["step"]} for r in metrics]
    healthy = write_run_dir(tmp_path / "healthy", metrics, samples, name="healthy")
    hacked = write_run_dir(tmp_path / "hacked", *simulate(60, 1, Faults(length_reward=True, fault_step=30)),
                           name="hacked")
    return healthy, hacked


def test_html_report_draws_every_chart_for_several_runs_and_fetches_nothing(tmp_path, capsys):
    healthy, hacked = _runs(tmp_path)
    out = tmp_path / "both.html"
    assert main(["report", str(healthy), str(hacked), "--html", str(out), "--no-write"]) == 0
    text = out.read_text()
    charts = re.findall(r"<figure class='chart' title='([^']+)'>\s*<svg", text)
    assert charts == ["Total reward", "Reward per function", "Completions each reward paid", "Accuracy",
                      "Held-out accuracy", "KL to the reference", "Entropy",
                      "Completion length", "Truncated completions", "Throughput", "Memory", "Alerts"]
    assert "healthy: rewards/total/mean" in text and "hacked: rewards/total/mean" in text  # overlaid
    assert "What happened:" in text and "Reward functions' quality" in text and "Sample completions" in text
    # Nothing the browser would fetch: no scripts, stylesheets, images, fonts or frames by URL.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)
    assert "@import" not in text and not re.search(r"url\((?!#)", text) and "<script" not in text  # url(#id): local
    assert f"wrote {out}" in capsys.readouterr().out


def test_html_report_goes_into_the_run_directory_by_default(tmp_path):
    healthy, _ = _runs(tmp_path)
    assert main(["report", str(healthy), "--html"]) == 0
    assert (healthy / "report.html").is_file() and (healthy / "report.json").is_file()


def test_svg_writes_each_chart_as_its_own_file_with_runs_overlaid(tmp_path, capsys):
    healthy, hacked = _runs(tmp_path)
    out = tmp_path / "charts"
    assert main(["report", str(healthy), str(hacked), "--svg", str(out), "--no-write"]) == 0
    files = sorted(p.name for p in out.iterdir())
    assert "accuracy.svg" in files and "total-reward.svg" in files and "alerts.svg" in files
    assert not any(name.endswith(".tmp") for name in files)
    text = (out / "total-reward.svg").read_text()
    assert text.startswith("<svg") and text.rstrip().endswith("</svg>")
    assert "healthy: rewards/total/mean" in text and "hacked: rewards/total/mean" in text
    # one metric, two runs: a colour per run (matplotlib's first two), not one colour for both
    assert "stroke: #1f77b4" in text and "stroke: #ff7f0e" in text
    assert f"to {out}" in capsys.readouterr().out


def test_legends_sit_under_the_axes_with_every_name_and_smoothing_is_optional(tmp_path):
    from mlx_grpo.telemetry.analysis.html_report import CHARTS, _pyplot, chart_figure, load_runs

    healthy, hacked = _runs(tmp_path)
    runs = load_runs([healthy, hacked])
    plt = _pyplot()
    title, ylabel, metrics = next(c for c in CHARTS if c[0] == "Reward per function")
    fig = chart_figure(plt, title, ylabel, metrics, runs)
    fig.canvas.draw()
    ax = fig.axes[0]
    legend = ax.get_legend()
    labels = [t.get_text() for t in legend.get_texts()]
    functions = sorted({n.split("/")[1] for n in runs[0].data.table.names
                        if n.startswith("rewards/") and n.endswith("/mean") and n != "rewards/total/mean"})
    assert labels and all(f"{run}: {fn}" in labels for run in ("healthy", "hacked") for fn in functions)
    renderer = fig.canvas.get_renderer()
    assert legend.get_window_extent(renderer).y1 < ax.get_window_extent(renderer).y0  # under, not beside
    assert legend.get_texts()[0].get_fontsize() >= 8
    plain = len(ax.get_lines())
    plt.close(fig)
    smoothed = chart_figure(plt, title, ylabel, metrics, runs, smoothing=0.9)
    assert len(smoothed.axes[0].get_lines()) == 2 * plain  # raw (faint) and smoothed
    assert "(smoothed 0.9)" in smoothed.axes[0].get_title(loc="left")
    plt.close(smoothed)


def test_sample_rewards_are_rounded(tmp_path):
    from mlx_grpo.telemetry.analysis.html_report import _samples_section, load_runs

    metrics, samples = simulate(10, 0, Faults())
    samples[-1]["total"] = 22 / 3
    run = load_runs([write_run_dir(tmp_path / "r", metrics, samples, name="r")])[0]
    section = _samples_section(run)
    assert "7.333" in section and "7.3333333" not in section


def test_without_matplotlib_report_html_says_so_before_printing_or_writing_anything(tmp_path, capsys,
                                                                                   monkeypatch):
    import sys

    healthy, _ = _runs(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real_find_spec(name, *a))
    assert main(["report", str(healthy), "--html"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "matplotlib" in captured.err and "[report]" in captured.err
    assert not (healthy / "report.json").exists()


def test_a_short_run_gets_whole_step_ticks_and_spans_a_reader_can_trust(tmp_path):
    """A 4-step run (review 3): ticks at 1.0, 1.5, 2.0, a single held-out point over -0.04..0.04 and a constant 0
    fraction over -0.04..0.04 were drawn; now ticks are whole steps, one point gets a step either side and a
    never-negative constant starts at 0."""
    from mlx_grpo.telemetry.analysis.html_report import CHARTS, _pyplot, chart_figure, load_runs

    metrics, samples = simulate(4, 0, Faults())
    metrics = [{**r, "completions/truncated_frac": 0.0} for r in metrics]
    metrics[-1]["eval/accuracy"] = 0.5
    for r in metrics[:-1]:
        r.pop("eval/accuracy", None)
    runs = load_runs([write_run_dir(tmp_path / "short", metrics, samples, name="short")])
    plt = _pyplot()
    for title in ("Total reward", "Held-out accuracy", "Truncated completions"):
        _, ylabel, names = next(c for c in CHARTS if c[0] == title)
        fig = chart_figure(plt, title, ylabel, names, runs)
        fig.canvas.draw()
        ax = fig.axes[0]
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks), (title, ticks)
        low, high = ax.get_ylim()
        if title == "Held-out accuracy":
            assert ax.get_xlim()[1] - ax.get_xlim()[0] >= 2 and low >= 0 and high - low >= 0.5
        if title == "Truncated completions":
            assert low == 0 and high >= 0.5
        plt.close(fig)
