"""Output of report, metrics, bench and compare when piped: each table at the full width of its content
(rich falls back to 80 columns without a terminal); the training progress line at 80 columns."""

from __future__ import annotations

import io

from rich.console import Console

from mlx_grpo.cli import main
from synthetic_runs import simulate, write_run_dir


def test_metrics_piped_keeps_every_description_whole_on_its_row(capsys):
    from mlx_grpo.telemetry.metrics.catalogue import catalogue_json

    assert main(["metrics"]) == 0  # capsys is not a terminal, like `| less`
    lines = capsys.readouterr().out.splitlines()
    for row in catalogue_json():
        assert any(row["name"] in line and row["description"] in line for line in lines), row["name"]
    assert max(len(line) for line in lines) > 200  # was folded into 80 columns (a 4-character description)


def test_report_and_compare_piped_keep_their_rows_whole(tmp_path, capsys):
    from mlx_grpo.telemetry.analysis.reward_report import analyze_run  # noqa: F401  (the report's own analysis)
    from mlx_grpo.telemetry.analysis.report import build_report

    runs = []
    for seed, name in ((0, "a" * 120 + "-learning-rate-5e-5"), (1, "b" * 120 + "-learning-rate-1e-4")):
        metrics, samples = simulate(steps=40, seed=seed)
        runs.append(str(write_run_dir(tmp_path / name, metrics, samples, name=name)))
    assert main(["report", runs[0], "--no-write"]) == 0
    out = capsys.readouterr().out
    _, report = build_report(runs[0])
    for part in report.quality.parts:
        assert part.explanation in out, part.name  # one line each, never folded at 80 columns
    assert main(["compare", *runs]) == 0
    out = capsys.readouterr().out
    for run in runs:
        assert any(run.rsplit("/", 1)[1] in line for line in out.splitlines())


def test_a_terminal_still_gets_tables_at_its_own_width():
    from mlx_grpo.telemetry.output import output_console

    console = output_console(file=io.StringIO(), force_terminal=True, width=90)
    assert not console.fitted and console.width == 90


def test_the_progress_line_keeps_reward_and_accuracy_at_80_columns():
    from mlx_grpo.console import TrainingConsole

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
