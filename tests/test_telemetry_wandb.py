"""The W&B sink in offline mode (no network), and runs without W&B installed."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from mlx_grpo.telemetry.reward_stats import RewardTracker, reward_metrics
from mlx_grpo.telemetry.sinks import WandbOptions, make_sinks, wandb_enabled

pytest.importorskip("wandb")

NAMES = ["format_exact", "answer_check"]


@pytest.fixture
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_home"))
    return tmp_path


def sample(step, i):
    return {"prompt": f"{step}+{i}=?", "completion": f"<reasoning>add</reasoning><answer>{step + i}</answer>",
            "reasoning": "add", "predicted": str(step + i), "answer": str(step + i), "rewards": {"format_exact": 1.0, "answer_check": None}, "total": 1.0,
            "advantage": 0.25, "length": 9, "truncated": False, "correct": True}


def test_offline_wandb_run_completes_with_scalars_tables_charts_alerts_and_artifacts(offline):
    checkpoint = offline / "ckpt" / "step_4"
    checkpoint.mkdir(parents=True)
    (checkpoint / "weights.txt").write_text("w")
    warnings = []
    options = WandbOptions(project="mlx-grpo-test", name="offline-check", tags=["test"], notes="n", chart_every=2,
                           log_checkpoints=True)
    sinks = make_sinks(offline / "run", wandb=options, warn=warnings.append)
    sinks.start(name="run", config={"learning_rate": 1e-4, "api_key": "never-logged-123"}, total_steps=4)
    tracker = RewardTracker(NAMES, hist_every=2)
    rng = np.random.default_rng(0)
    for step in range(1, 5):
        scores = rng.integers(0, 2, size=(2, 8)).astype(float)
        total = scores.sum(axis=0)
        scalars = reward_metrics(scores, NAMES, [1.0, 1.0], total, group_size=4)
        scalars.update(tracker.update(step, scores, total, loss=0.1))
        scalars["policy/kl"] = 0.01 * step
        sinks.write(step, scalars, tracker.histograms(step), rewards=total)
        sinks.write_samples(step, [sample(step, 0), sample(step, 1)])
        if step == 4:
            sinks.log_checkpoint(checkpoint, step)
    sinks.write_alert({"step": 4, "level": "warning", "rule": "kl_rising", "metric": "policy/kl", "value": 0.04,
                       "message": "KL keeps rising"})
    sinks.write_final(tracker.final_metrics())
    sinks.close()

    assert warnings == [] and sinks.active == ["tensorboard", "wandb"]
    runs = list((offline / "wandb_home" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    run_dir = runs[0]
    log = next(run_dir.glob("run-*.wandb")).read_bytes()
    for text in (b"rewards/total/mean", b"rewards/answer_check/recent_mean", b"KL keeps rising", b"-checkpoint",
                 b"offline-check", b"final/total/mean"):
        assert text in log, text
    assert b"never-logged-123" not in log
    media = run_dir / "files" / "media"
    tables = sorted((media / "table" / "samples").glob("completions_*.table.json"))
    # Incremental table: each log adds that step's rows, so the whole history is kept.
    rows = [row for path in tables for row in json.loads(path.read_text())["data"]]
    assert len(tables) == 4 and sorted(r[0] for r in rows) == [1, 1, 2, 2, 3, 3, 4, 4]
    columns = json.loads(tables[0].read_text())["columns"]
    assert columns[:5] == ["step", "prompt", "reasoning", "answer", "ground_truth"]
    assert {"reward/format_exact", "reward/answer_check", "advantage"} <= set(columns)
    assert rows[0][2] == "add" and rows[0][3] == "1"
    assert list((media / "object3D" / "charts").glob("reward_landscape_3d_*.pts.json"))
    assert list((media / "object3D" / "charts").glob("policy_evolution_3d_*.pts.json"))
    assert list((media / "table" / "charts").glob("reward_breakdown_table_*.table.json"))
    assert json.loads((offline / "run" / "run.json").read_text())["status"] == "finished"


def test_without_wandb_installed_training_logs_locally_with_one_warning(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` raise ImportError
    warnings = []
    sinks = make_sinks(tmp_path / "run", wandb=WandbOptions(), warn=warnings.append)
    sinks.start(name="run", config={})
    sinks.write(1, {"policy/loss": 1.0})
    sinks.close()
    assert sinks.active == ["tensorboard"]
    assert len(warnings) == 1 and "W&B logging is off" in warnings[0]
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") == 1


def test_wandb_is_on_by_flag_or_api_key():
    assert wandb_enabled(True, {}) and not wandb_enabled(False, {"WANDB_API_KEY": "k"})
    assert wandb_enabled(None, {"WANDB_API_KEY": "k"}) and not wandb_enabled(None, {})
