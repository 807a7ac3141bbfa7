"""The W&B sink in offline mode (no network), and runs without W&B installed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from run_writer import start_sinks

from mlx_grpo.telemetry.events import AlertEvent, Artifact, Final, Samples, Scalars
from mlx_grpo.telemetry.metrics.reward_stats import RewardTracker, reward_metrics
from mlx_grpo.telemetry.rundir.writer import read_run_info
from mlx_grpo.telemetry.sinks import make_sinks
from mlx_grpo.telemetry.sinks.wandb import WandbOptions
from mlx_grpo.telemetry.sinks.wandb_charts import chart_interval, heatmap_svg

pytest.importorskip("wandb")

NAMES = ["format_exact", "answer_check"]


@pytest.fixture
def offline(monkeypatch, tmp_path):
    import wandb

    wandb.teardown()  # W&B reads WANDB_DIR once per process: a fresh setup so this test's files land in its tmp_path
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
    start_sinks(sinks, offline / "run", config={"learning_rate": 1e-4, "api_key": "never-logged-123"}, total_steps=4)
    tracker = RewardTracker(NAMES, hist_every=2)
    rng = np.random.default_rng(0)
    for step in range(1, 5):
        scores = rng.integers(0, 2, size=(2, 8)).astype(float)
        total = scores.sum(axis=0)
        scalars = reward_metrics(scores, NAMES, [1.0, 1.0], total, group_size=4)
        scalars.update(tracker.update(step, scores, total, loss=0.1))
        scalars["policy/kl"] = 0.01 * step
        scalars["criteria/math/shows_work/mean"] = 0.2 * step
        scalars["criteria/math/final_answer/mean"] = 1.0 - 0.1 * step
        sinks.handle(Scalars(step, scalars, tracker.histograms(step), {"total": total, **dict(zip(NAMES, scores))}))
        sinks.handle(Samples(step, [sample(step, 0), sample(step, 1)]))
        if step == 4:
            sinks.handle(Artifact("checkpoint", step=step, path=checkpoint))
    sinks.handle(AlertEvent({"step": 4, "level": "warning", "rule": "kl_rising", "metric": "policy/kl", "value": 0.04,
                             "message": "KL keeps rising"}))
    sinks.handle(Final(tracker.final_metrics()))
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
    # Reward components: every completion's score per function, a colour per function, at steps 2 and 4.
    clouds = sorted((media / "object3D" / "charts").glob("reward_components_3d_*.pts.json"))
    assert len(clouds) == 2
    points = np.array(json.loads(clouds[-1].read_text()))
    assert points.shape == (4 * 2 * 8, 6)  # 4 steps x 2 functions x 8 completions
    assert len({tuple(p[3:]) for p in points}) == 2  # one colour per function
    # The rubric criteria over time: a heatmap page and its data.
    heatmap = sorted((media / "html" / "charts").glob("criteria_heatmap_*.html"))[-1].read_text()
    assert "shows_work" in heatmap and "final_answer" in heatmap and heatmap.count("<rect") >= 8
    criteria = json.loads(sorted((media / "table" / "charts").glob("criteria_over_time_*.table.json"))[-1].read_text())
    assert criteria["columns"] == ["step", "criterion", "mean"] and len(criteria["data"]) == 8
    assert read_run_info(offline / "run").status == "finished"


def test_a_run_stopped_early_draws_its_charts_at_its_last_step(offline):
    # T12: charts were drawn at every chart_every-th step and the last planned one only, so a run stopped
    # after step 3 of 200 had none
    warnings = []
    sinks = make_sinks(offline / "run", wandb=WandbOptions(project="mlx-grpo-test", name="stopped", chart_every=10),
                       warn=warnings.append)
    start_sinks(sinks, offline / "run", total_steps=200)
    tracker = RewardTracker(NAMES)
    rng = np.random.default_rng(0)
    for step in range(1, 4):
        scores = rng.integers(0, 2, size=(2, 8)).astype(float)
        total = scores.sum(axis=0)
        scalars = {**reward_metrics(scores, NAMES, [1.0, 1.0], total, group_size=4),
                   **tracker.update(step, scores, total), "policy/kl": 0.01}
        sinks.handle(Scalars(step, scalars, rewards={"total": total, **dict(zip(NAMES, scores))}))
    sinks.close()
    assert warnings == []
    media = next((offline / "wandb_home" / "wandb").glob("offline-run-*")) / "files" / "media"
    clouds = list((media / "object3D" / "charts").glob("reward_landscape_3d_3_*.pts.json"))
    assert len(clouds) == 1


def test_without_wandb_installed_training_logs_locally_with_one_warning(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` raise ImportError
    warnings = []
    sinks = make_sinks(tmp_path / "run", wandb=WandbOptions(), warn=warnings.append)
    start_sinks(sinks, tmp_path / "run")
    sinks.handle(Scalars(1, {"policy/loss": 1.0}))
    sinks.close()
    assert sinks.active == ["tensorboard"]
    assert len(warnings) == 1 and "W&B logging is off" in warnings[0]
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") == 1


def test_chart_interval_is_a_setting_or_about_ten_redraws_per_run():
    assert chart_interval(7, 1000) == 7
    assert [chart_interval(0, n) for n in (5, 10, 200, 5000)] == [1, 1, 20, 500]
    assert chart_interval(0, None) == 50


def test_heatmap_svg_labels_rows_and_steps_and_greys_missing_cells():
    svg = heatmap_svg(["a<b", "c"], [10, 20, 30], np.array([[0.0, 0.5, 1.0], [np.nan, 1.0, 0.0]]), title="t")
    assert svg.startswith("<svg") and "a&lt;b" in svg and ">30<" in svg
    assert svg.count('fill="#dddddd"') == 1  # criterion c was not logged at step 10
    assert "#440154" in svg and "#fde725" in svg  # the scale's two ends


def test_a_real_run_logs_dataset_charts_and_final_model_offline_and_a_failing_wandb_never_stops_it(
        offline, monkeypatch):
    from mlx_lm import load

    from mlx_grpo.config.train_config import load_config
    from mlx_grpo.run.loop import train
    from mlx_grpo.telemetry.sinks.wandb import WandbSink

    monkeypatch.delenv("WANDB_DIR")  # W&B's files go into the run directory, as by default
    settings = {"num_steps": 4, "batch_size": 4, "num_generations": 4, "eval_every": 0, "checkpoint_every": 0,
                "tensorboard": False, "wandb": True, "monitoring_dir": str(offline / "runs"), "train_size": 64}
    result = train(load_config(None, {**settings, "run_name": "logged", "wandb_log_model": True}), offline)
    assert result["status"] == "finished"
    run_dir = Path(result["run_dir"])
    wandb_run = next((run_dir / "wandb").glob("offline-run-*"))
    log = next(wandb_run.glob("run-*.wandb")).read_bytes()
    assert b"arithmetic-seed0" in log and b"-model" in log  # the dataset and the final model artifacts
    # 4 steps: the charts are redrawn every step (about ten times per run, at most once a step).
    assert len(list((wandb_run / "files" / "media" / "object3D" / "charts").glob("reward_components_3d_*"))) == 4
    model, _ = load(str(run_dir / "final_model"))  # the logged model is a complete mlx-lm model directory
    assert model is not None

    def broken(self, name, splits, metadata):
        raise ConnectionError("W&B is unreachable")

    monkeypatch.setattr(WandbSink, "_log_dataset", broken)
    result = train(load_config(None, {**settings, "run_name": "broken"}), offline)
    assert result["status"] == "finished"
    run_dir = Path(result["run_dir"])
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 4
    alerts = [json.loads(line) for line in (run_dir / "alerts.jsonl").read_text().splitlines()]
    # W&B runs on its own thread: the failure surfaces at the next call and turns W&B off, nothing more.
    assert any(a["rule"] == "sink_failed" and "W&B is unreachable" in a["message"] for a in alerts)


def test_wandb_is_opt_in_and_an_api_key_in_the_environment_alone_never_turns_it_on(monkeypatch, tmp_path):
    import mlx_grpo.run.loop as run_module
    import mlx_grpo.run.opening as opening_module
    from mlx_grpo.config.train_config import load_config

    class Stop(Exception):
        pass

    requested = []

    def fake_make_sinks(run_dir, **kwargs):
        requested.append(kwargs.get("wandb"))
        raise Stop

    monkeypatch.setattr(opening_module, "make_sinks", fake_make_sinks)
    monkeypatch.setenv("WANDB_API_KEY", "0123456789abcdef0123456789abcdef01234567")
    settings = {"num_steps": 1, "batch_size": 2, "num_generations": 2, "monitoring_dir": str(tmp_path / "runs"),
                "train_size": 64}
    for extra in ({}, {"wandb": True}, {"report_to": "wandb"}):
        with pytest.raises(Stop):
            run_module.train(load_config(None, {**settings, **extra}), tmp_path)
    assert requested[0] is None  # the key alone: no W&B
    assert isinstance(requested[1], WandbOptions) and isinstance(requested[2], WandbOptions)


SECRET_RUN = """
import sys
from mlx_grpo.telemetry.events import Scalars, Start
from mlx_grpo.telemetry.rundir.writer import new_run_info
from mlx_grpo.telemetry.sinks import make_sinks
from mlx_grpo.telemetry.sinks.wandb import WandbOptions
secret, typed, out = sys.argv[1], sys.argv[2], sys.argv[3]
options = WandbOptions(project="mlx-grpo-test", name="secrets", tags=[typed, "ok"], notes=f"key {secret}", dir=out)
sinks = make_sinks(out + "/run", wandb=options)
info = new_run_info(out + "/run", "run", {"system_prompt": f"use token {typed}"}, total_steps=1)
sinks.handle(Start(info, out + "/run"))
sinks.handle(Scalars(1, {"rewards/total/mean": 1.0}))
sinks.close("finished")
"""


def test_secrets_in_notes_tags_and_the_command_line_never_reach_wandb(offline):
    import os
    import subprocess

    secret, typed = "sk-openaiSECRET0123456789abcdef", "hf_HFSECRETabcdefghijklmnopqrstu"
    # a fresh process: W&B keeps settings per process, and its metadata records this command line
    env = {**os.environ, "OPENAI_API_KEY": secret}
    done = subprocess.run([sys.executable, "-c", SECRET_RUN, secret, typed, str(offline / "out")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    written = b"".join(p.read_bytes() for p in (offline / "out").rglob("*") if p.is_file())
    assert any((offline / "out").rglob("*.wandb"))  # W&B did write its files
    assert secret.encode() not in written and typed.encode() not in written
