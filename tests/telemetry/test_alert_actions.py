"""Alerts in real runs of the shipped model: memory pressure read on each step's peak, and `action: stop`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import mlx_grpo.run.opening as opening_module
from mlx_grpo.cli import main
from mlx_grpo.config.train_config import load_config
from mlx_grpo.planning.machine import accel_memory
from mlx_grpo.run.loop import train
from mlx_grpo.telemetry.rundir.writer import read_run_info

SMALL = {"num_steps": 5, "batch_size": 4, "num_generations": 4, "num_iterations": 1, "train_size": 20, "eval_every": 0,
         "checkpoint_every": 0, "tensorboard": False, "samples_per_step": 1}
MIB = 2**20


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run_with_working_set(tmp_path: Path, monkeypatch, working_set: int) -> Path:
    """A run on a device that reports `working_set` bytes as its recommended working set (Metal does; the CPU
    backend reports none), every other reading MLX's own."""
    monkeypatch.setattr(opening_module, "accel_memory", lambda: {**accel_memory(), "limit": working_set})
    config = load_config(None, {**SMALL, "monitoring_dir": str(tmp_path / "runs")})
    return Path(train(config, tmp_path)["run_dir"])


def test_memory_pressure_is_read_on_the_step_peak_and_raises_its_alert_within_a_few_steps(tmp_path, monkeypatch):
    # The shipped model's steps peak at ~35 MiB (the update) while ~16 MiB stay in use after the step: on a
    # 32 MiB working set the memory after the step looks fine and the step's peak does not.
    run_dir = run_with_working_set(tmp_path / "small", monkeypatch, 32 * MIB)
    records = read_jsonl(run_dir / "metrics.jsonl")
    assert all(r["system/accel_memory_percent"] < 90 for r in records)
    assert all(r["memory/peak_percent"] > 90 for r in records[1:])
    peak = max(r[f"memory/{phase}_peak_gb"] for r in records[1:2] for phase in ("rollout", "ref", "update"))
    # every *_gb figure is in GB of 1e9 bytes, like the memory plan's (they were GiB once)
    assert records[1]["memory/peak_percent"] == pytest.approx(100 * peak * 1e9 / (32 * MIB))
    alerts = [a for a in read_jsonl(run_dir / "alerts.jsonl") if a["rule"] == "accel_memory_high"]
    assert [a["step"] for a in alerts] == [3] and alerts[0]["metric"] == "memory/peak_percent"

    roomy = run_with_working_set(tmp_path / "roomy", monkeypatch, 1024 * MIB)
    assert all(r["memory/peak_percent"] < 10 for r in read_jsonl(roomy / "metrics.jsonl"))
    assert [a for a in read_jsonl(roomy / "alerts.jsonl") if a["level"] != "info"] == []


def test_cpu_backend_reports_no_working_set_so_no_peak_share(tmp_path):
    config = load_config(None, {**SMALL, "num_steps": 2, "monitoring_dir": str(tmp_path / "runs")})
    records = read_jsonl(Path(train(config, tmp_path)["run_dir"]) / "metrics.jsonl")
    assert records and all("memory/peak_percent" not in r and "memory/update_peak_gb" in r for r in records)


def mlx_grpo_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlx_grpo.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_a_rule_with_action_stop_checkpoints_closes_the_logs_and_exits_3_with_the_resume_command(tmp_path, monkeypatch):
    # A rule that holds from the first step fires at step 3 (for_steps 3) and stops the run there.
    (tmp_path / "stop.yaml").write_text(
        "rules:\n"
        "  - {name: stop_at_three, kind: threshold, metric: rewards/total/mean, op: '>', value: -1000,\n"
        "     for_steps: 3, action: stop, hint: stopped on purpose}\n")
    run_dir = tmp_path / "runs" / "stopped"
    flags = ["--num-steps", "6", "--batch-size", "4", "--num-generations", "4", "--eval-every", "0",
             "--checkpoint-every", "0", "--no-tensorboard", "--monitoring-dir", "runs", "--train-size", "64"]
    result = mlx_grpo_cli("train", "--alerts", "stop.yaml", "--run-name", "stopped", *flags, cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    stop_line = [line for line in result.stderr.splitlines() if "action: stop" in line]
    assert stop_line == ["mlx-grpo: alert rule 'stop_at_three' (action: stop) stopped the run after step 3, "
                         "checkpoint saved; continue with: mlx-grpo train --resume runs/stopped"]
    assert "Traceback" not in result.stderr
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")] == [1, 2, 3]
    # built-in warnings may fire too (a 4-row batch's KL is high); the only alert that acted is the stop rule's
    assert [(a["step"], a["rule"], a["action"]) for a in read_jsonl(run_dir / "alerts.jsonl") if "action" in a] == [
        (3, "stop_at_three", "stop")]
    assert read_run_info(run_dir).status == "interrupted"
    assert (run_dir / "checkpoints" / "step_3").is_dir()

    # The command it printed continues the run (in-process: the stop above was the real command's launch);
    # the rule remembers its condition already holds.
    monkeypatch.chdir(tmp_path)
    assert main(stop_line[0].split("continue with: mlx-grpo ")[1].split()) == 0
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")] == [1, 2, 3, 4, 5, 6]
    assert read_run_info(run_dir).status == "finished"


# slow (two subprocess runs, 24 steps): the default set keeps the detection on this run's measured series
# (test_alerts.py::test_measured_collapse_after_a_learning_rate_raise_is_caught_in_two_steps) and `action: stop`
# in a real run (test_a_rule_with_action_stop_checkpoints_closes_the_logs_and_exits_3_with_the_resume_command)
@pytest.mark.slow
def test_an_injected_reward_collapse_is_caught_in_two_steps_and_its_stop_rule_ends_the_run(tmp_path):
    """The shipped model trains 10 healthy steps; resumed with the learning rate raised to 3e-3 its reward
    falls from ~7 to below 0 and accuracy to 0 at once (measured: 7.05, 7.16, then -2.67 at step 12). The
    built-in collapse rules fire on the second collapsed step; redefined with `action: stop`, the reward
    rule ends the run there with a checkpoint and the resume command."""
    (tmp_path / "stop_on_collapse.yaml").write_text(
        "rules:\n"
        "  - {name: reward_collapse, kind: drop, metric: rewards/total/mean, window: 20, min_points: 10,\n"
        "     fall: 0.3, relative: true, min_scale: 1, for_steps: 2, level: error, action: stop}\n")
    run_dir = tmp_path / "runs" / "collapse"
    healthy = mlx_grpo_cli("train", "--alerts", "stop_on_collapse.yaml", "--num-steps", "10", "--batch-size", "8",
                           "--eval-every", "0", "--checkpoint-every", "10", "--no-tensorboard",
                           "--monitoring-dir", "runs", "--run-name", "collapse", cwd=tmp_path)
    assert healthy.returncode == 0, healthy.stderr
    assert all(a["level"] == "info" for a in read_jsonl(run_dir / "alerts.jsonl"))
    broken = mlx_grpo_cli("train", "--resume", "runs/collapse", "--num-steps", "16", "--learning-rate", "3e-3",
                          "--lr-schedule", "constant", cwd=tmp_path)
    assert broken.returncode == 3, broken.stderr
    records = read_jsonl(run_dir / "metrics.jsonl")
    stopped_at = records[-1]["step"]
    collapsed = [r["step"] for r in records if r["rewards/total/mean"] < 0.7 * 7.0]
    assert collapsed[0] > 10 and stopped_at == collapsed[1] <= 14  # the second collapsed step, within a few
    errors = [(a["step"], a["rule"]) for a in read_jsonl(run_dir / "alerts.jsonl") if a["level"] == "error"]
    assert errors == [(stopped_at, "reward_collapse"), (stopped_at, "accuracy_collapse")]
    assert (f"alert rule 'reward_collapse' (action: stop) stopped the run after step {stopped_at}, checkpoint "
            "saved; continue with: mlx-grpo train --resume runs/collapse") in broken.stderr
    assert (run_dir / "checkpoints" / f"step_{stopped_at}").is_dir()
