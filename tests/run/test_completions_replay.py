"""Every completion kept (completions/), read back by the report and the dashboard's group view, and
`mlx-grpo replay` re-scoring them under another reward set (issue 26)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mlx_grpo.config.train_config import load_config
from mlx_grpo.telemetry.events import Completions
from mlx_grpo.telemetry.rundir.completions import (
    CompletionsWriter,
    completion_steps,
    groups,
    read_step,
    truncate_completions,
)
from mlx_grpo.telemetry.rundir.layout import RunPaths

SMALL = {"batch_size": 4, "num_generations": 4, "max_generation_steps": 12, "train_size": 64, "eval_every": 0,
         "checkpoint_every": 0, "tensorboard": False, "num_steps": 3}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    from mlx_grpo.run.loop import train

    tmp = tmp_path_factory.mktemp("kept")
    config = load_config(None, {**SMALL, "monitoring_dir": str(tmp / "runs"), "run_name": "kept"})
    return Path(train(config, tmp)["run_dir"])


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_every_completion_of_every_step_is_kept_with_its_scores(run_dir):
    assert completion_steps(run_dir) == [1, 2, 3]
    metrics = {r["step"]: r for r in read_jsonl(run_dir / "metrics.jsonl")}
    for step in (1, 2, 3):
        rows = read_step(run_dir, step)
        assert len(rows) == 16  # B x G, not one per group
        indices = [(r["prompt_index"], r["completion_index"]) for r in rows]
        assert indices == [(g, j) for g in range(4) for j in range(4)]
        assert set(rows[0]) >= {"prompt", "answer", "completion", "rewards", "total", "advantage", "length",
                                "truncated", "correct"}
        assert set(rows[0]["rewards"]) == {"format_exact", "format_approx", "answer_check", "number_check",
                                           "digit_match"}
        assert np.mean([r["total"] for r in rows]) == pytest.approx(metrics[step]["rewards/total/mean"])
        assert np.mean([r["correct"] for r in rows]) == pytest.approx(metrics[step]["accuracy/train"])
        assert np.mean([r["length"] for r in rows]) == pytest.approx(metrics[step]["completions/length/mean"])
        for group in groups(rows).values():  # advantages are each group's own
            assert abs(sum(r["advantage"] for r in group)) < 1e-4
            assert len({r["prompt"] for r in group}) == 1


def test_samples_are_a_selection_of_the_completion_rows_joined_by_step_and_prompt_index(run_dir):
    """One row per completion, made once: each samples.jsonl line is its completions/ row, plus the time."""
    samples = read_jsonl(run_dir / "samples.jsonl")
    assert samples and {s["completion_index"] for s in samples} == {0}
    for sample in samples:
        row = groups(read_step(run_dir, sample["step"]))[sample["prompt_index"]][sample["completion_index"]]
        assert {k: v for k, v in sample.items() if k != "time"} == row
        assert "predicted" in row and "reasoning" in row


def test_the_cap_stops_keeping_completions_and_says_so_once(tmp_path):
    rows = [{"step": 1, "prompt_index": 0, "completion_index": j, "completion": "x" * 50 + str(j)} for j in range(8)]
    CompletionsWriter(tmp_path / "probe", max_mb=0).write(1, rows)
    size = RunPaths(tmp_path / "probe").completions_step(1).stat().st_size
    said = []
    writer = CompletionsWriter(tmp_path, max_mb=1.5 * size / 1e6, warn=said.append)  # one step fits, not two
    writer.handle(Completions(1, rows))
    writer.handle(Completions(2, rows))
    writer.handle(Completions(3, rows))
    assert len(said) == 1 and "MB at step 2" in said[0]  # said once
    assert completion_steps(tmp_path) == [1]
    CompletionsWriter(tmp_path, max_mb=0).write(2, rows)
    assert completion_steps(tmp_path) == [1, 2]


def test_a_damaged_file_yields_its_readable_rows_and_resume_drops_later_steps(tmp_path):
    rows = [{"step": 1, "prompt_index": 0, "completion_index": j, "completion": f"c{j}"} for j in range(200)]
    CompletionsWriter(tmp_path, max_mb=0).write(1, rows)
    path = RunPaths(tmp_path).completions_step(1)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])  # a file cut short
    kept = read_step(tmp_path, 1)
    assert 0 < len(kept) < 200 and kept[0]["completion"] == "c0"
    path.write_bytes(b"not gzip at all")
    assert read_step(tmp_path, 1) == []
    for step in (2, 3, 4):
        CompletionsWriter(tmp_path, max_mb=0).write(step, rows[:2])
    truncate_completions(tmp_path, 2)
    assert completion_steps(tmp_path) == [1, 2]


def test_kept_completions_reach_a_terminal_escaped_and_a_fifo_in_their_place_is_skipped(tmp_path):
    import os

    rows = [{"step": 1, "prompt_index": 0, "completion_index": 0, "completion": "\x1b[2Jgone\x1b]0;title\x07"}]
    CompletionsWriter(tmp_path, max_mb=0).write(1, rows)
    assert read_step(tmp_path, 1)[0]["completion"] == rows[0]["completion"]  # replay re-scores the raw text
    shown = read_step(tmp_path, 1, display=True)[0]["completion"]
    assert "\x1b" not in shown and shown.startswith("\\x1b[2J")
    os.mkfifo(RunPaths(tmp_path).completions_step(2))  # would block a plain open() forever
    assert read_step(tmp_path, 2) == [] and completion_steps(tmp_path) == [1, 2]


def test_keep_completions_false_keeps_none(tmp_path):
    from mlx_grpo.run.loop import train

    config = load_config(None, {**SMALL, "num_steps": 1, "keep_completions": False,
                                "monitoring_dir": str(tmp_path / "runs")})
    assert not (Path(train(config, tmp_path)["run_dir"]) / "completions").exists()


def test_the_group_view_shows_the_g_completions_of_the_selected_prompt(run_dir):
    from rich.console import Console

    from mlx_grpo.tui.samples_view import group_table, sample_group

    sample = read_jsonl(run_dir / "samples.jsonl")[5]
    group = sample_group(run_dir, sample, {})
    assert len(group) == 4 and {r["prompt"] for r in group} == {sample["prompt"]}
    assert group[sample["completion_index"]]["completion"] == sample["completion"]
    console = Console(width=160, record=True)
    console.print(group_table(group, sample))
    text = console.export_text()
    assert "its group: 4 completions" in text and "adv" in text and "▶" in text
    assert all(f"{r['advantage']:.3g}"[:4] in text for r in group)


def test_replay_with_the_same_rewards_changes_nothing_and_without_one_reports_the_changes(run_dir):
    from mlx_grpo.rewards.loading import load_reward_functions
    from mlx_grpo.run.replay import replay

    same = load_reward_functions([(n, 1.0) for n in ("format_exact", "format_approx", "answer_check",
                                                       "number_check", "digit_match")], ".")
    result = replay(run_dir, same, 4, "group")
    assert (result.steps, result.groups, result.completions) == (3, 12, 48)
    assert result.reranked == [] and result.flips == [] and result.mean_abs_advantage_change < 1e-4
    assert result.zero_std_before == result.zero_std_after
    assert result.quality_before.score == pytest.approx(result.quality_after.score)

    only_format = load_reward_functions([("format_exact", 1.0)], ".")
    changed = replay(run_dir, only_format, 4, "group")
    assert changed.zero_std_after >= changed.zero_std_before
    assert changed.reranked or changed.flips or changed.zero_std_after > changed.zero_std_before


def test_replay_command_prints_rankings_and_quality(run_dir):
    result = subprocess.run([sys.executable, "-m", "mlx_grpo.cli", "replay", str(run_dir), "--without", "digit_match",
                             "answer_check"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "replayed 48 completions in 12 groups over 3 steps" in out
    assert "-> format_exact, format_approx, number_check" in out
    assert "groups ranked differently:" in out and "zero-std groups" in out and "reward functions' quality" in out
    bad = subprocess.run([sys.executable, "-m", "mlx_grpo.cli", "replay", str(run_dir), "--without", "nope"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "--without nope: not in the reward set" in bad.stderr
    assert "Traceback" not in bad.stderr


@pytest.mark.anyio
async def test_the_samples_view_shows_the_group_and_the_reward_heatmap_of_a_run_that_kept_completions(run_dir):
    import time

    from screen_text import screen_text

    from mlx_grpo.tui.app import WatchApp

    app = WatchApp([run_dir], refresh=0.1)
    async with app.run_test(size=(160, 60)) as pilot:
        await pilot.press("7")
        deadline = time.monotonic() + 20
        while "its group: 4 completions" not in screen_text(app) and time.monotonic() < deadline:
            await pilot.pause(0.05)
        text = screen_text(app)
        assert "its group: 4 completions of this prompt" in text
        assert "reward heatmap: steps 1-3 x examples" in text


def test_replay_finds_no_sign_flips_in_a_group_without_spread(tmp_path):
    # A group whose completions all scored alike trains on float rounding (float32 mean / (0 + 1e-4)),
    # about -0.005 each: no sign to flip, whatever the replayed rewards say.
    from mlx_grpo.rewards.scoring import RewardFunction
    from mlx_grpo.run.replay import replay

    rows = [{"step": 1, "prompt_index": 0, "completion_index": j, "prompt": "1+1=", "answer": "2",
             "completion": f"c{j}", "rewards": {"same": 1.0}, "total": 1.0, "advantage": -0.0047} for j in range(4)]
    rows += [{"step": 1, "prompt_index": 1, "completion_index": j, "prompt": "2+2=", "answer": "4",
              "completion": f"d{j}", "rewards": {"same": float(j)}, "total": float(j),
              "advantage": [-1.34, -0.45, 0.45, 1.34][j]} for j in range(4)]
    CompletionsWriter(tmp_path, max_mb=0).write(1, rows)
    reversed_order = RewardFunction("reversed", lambda p, c, a, **k: [-float(t[1]) for t in c], 1.0)
    result = replay(tmp_path, [reversed_order], 4, "group")
    assert result.zero_std_before == 1 and result.zero_std_after == 0
    assert [(f.prompt_index, f.completion_index) for f in result.flips] == [(1, 0), (1, 1), (1, 2), (1, 3)]
    assert [c.prompt_index for c in result.reranked] == [0, 1]  # the flat group now has an order


def test_replay_drops_a_custom_reward_by_the_name_its_metrics_use(run_dir, tmp_path, capsys, monkeypatch):
    from mlx_grpo.cli import main

    (tmp_path / "my_rewards.py").write_text("def brevity(completions, **kw):\n    return [-len(c) for c in completions]\n")
    monkeypatch.chdir(tmp_path)
    assert main(["replay", str(run_dir), "--rewards", "answer_check", "my_rewards.py:brevity",
                 "--without", "brevity"]) == 0
    assert main(["replay", str(run_dir), "--rewards", "answer_check", "my_rewards.py:brevity",
                 "--without", "brevty"]) == 2
    assert "not in the reward set (answer_check, brevity)" in capsys.readouterr().err
