"""Output of report, metrics, bench and compare when piped: each table at its natural width up to 120 columns,
long cells wrapped inside their column, no trailing padding (rich falls back to 80 columns without a terminal,
and the width of the widest cell made 1,800-character lines); the training progress line at 80 columns."""

from __future__ import annotations

import io

from rich.console import Console
from synthetic_runs import simulate, write_run_dir

from mlx_grpo.cli import main


def test_metrics_piped_keeps_every_description_whole_on_its_row(capsys):
    from mlx_grpo.telemetry.metrics.catalogue import catalogue_json

    assert main(["metrics"]) == 0  # capsys is not a terminal, like `| less`
    out = capsys.readouterr().out
    lines = out.splitlines()
    words = set(out.replace("│", " ").split())
    for row in catalogue_json():
        assert any(row["name"] in line for line in lines), row["name"]
        # wrapped in its column, never cut (a word longer than the column is folded across lines)
        assert {w for w in row["description"].split() if len(w) < 16} <= words, row["name"]
    assert max(len(line) for line in lines) == 120  # was 1,821 (the widest cell), before that 80 (folded)
    assert all(line == line.rstrip() for line in lines)  # no padding to the table's width


def test_report_and_compare_piped_keep_their_rows_whole(tmp_path, capsys):
    from mlx_grpo.telemetry.analysis.report import build_report
    from mlx_grpo.telemetry.analysis.reward_report import analyze_run  # noqa: F401  (the report's own analysis)

    runs = []
    for seed, name in ((0, "a" * 120 + "-learning-rate-5e-5"), (1, "b" * 120 + "-learning-rate-1e-4")):
        metrics, samples = simulate(steps=40, seed=seed)
        runs.append(str(write_run_dir(tmp_path / name, metrics, samples, name=name)))
    assert main(["report", runs[0], "--no-write"]) == 0
    out = capsys.readouterr().out
    _, report = build_report(runs[0])
    flat = " ".join(" ".join(line.replace("│", " ").split()) for line in out.splitlines())
    for part in report.quality.parts:
        assert {w for w in part.explanation.split() if len(w) < 16} <= set(flat.split()), part.name  # wrapped
    assert max(len(line) for line in out.splitlines()) <= 120
    assert main(["compare", *runs]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 120 and all(row == row.rstrip() for row in out.splitlines())
    for run in runs:  # a long name wraps in its cell: every piece of it is there, in order
        assert run.rsplit("/", 1)[1] in "".join(line.split("│")[1].strip() if "│" in line else ""
                                                for line in out.splitlines()) or run.rsplit("/", 1)[1][:100] in out


def test_a_terminal_still_gets_tables_at_its_own_width():
    from mlx_grpo.telemetry.output import output_console

    console = output_console(file=io.StringIO(), force_terminal=True, width=90)
    assert not console.fitted and console.width == 90


def test_the_progress_line_keeps_reward_and_accuracy_at_80_columns():
    from mlx_grpo.run.console import TrainingConsole

    for width in (80, 100, 200):
        terminal = Console(file=io.StringIO(), width=width, force_terminal=True, color_system=None)
        bar = TrainingConsole(200, 0, console=terminal)
        bar.step(190, {"rewards/total/mean": 10.266, "accuracy/train": 0.65,
                       "throughput/step_tokens_per_s": 1269.0}, 10)
        screen = Console(file=io.StringIO(), width=width, color_system=None)
        screen.print(bar.progress.get_renderable())
        line = screen.file.getvalue().rstrip("\n")
        assert "\n" not in line and "…" not in line, (width, line)
        assert "step 190/200" in line and "reward +10.266" in line and "acc 65%" in line, (width, line)
        assert "eta" in line
