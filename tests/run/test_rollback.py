"""Alert actions that act (issue 26): rollback to the last checkpoint from before the problem, with the rule's
remedy, at most max_rollbacks times; the collapse rules stop a default run; on_alert: warn keeps reports only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlx_grpo.config.train_config import load_config
from mlx_grpo.telemetry.alerts.config import default_rules, with_on_alert

SMALL = {"batch_size": 4, "num_generations": 4, "max_generation_steps": 12, "train_size": 64, "eval_every": 0,
         "checkpoint_every": 0, "num_steps": 8, "beta": 0.04}

KL_RULE = ("rules:\n"
           "  - {name: kl_spike, kind: threshold, metric: policy/kl, op: '>', value: 5, level: error,\n"
           "     cooldown: 0, action: rollback, remedy: {learning_rate: 0.5, beta: 2}}\n")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def inject_kl(monkeypatch, steps: set[int], kl: float = 50.0) -> None:
    """A KL spike at `steps`: the record's policy/kl as a runaway policy would report it."""
    from mlx_grpo.telemetry import recorder

    real = recorder.step_record

    def spiked(data):
        record = real(data)
        if data.step in steps:
            record["policy/kl"] = kl
        return record

    monkeypatch.setattr(recorder, "step_record", spiked)


def run(tmp_path, **overrides) -> tuple[dict, Path]:
    from mlx_grpo.run.loop import train

    (tmp_path / "kl.yaml").write_text(KL_RULE)
    config = load_config(None, {**SMALL, "alerts_file": str(tmp_path / "kl.yaml"),
                                "monitoring_dir": str(tmp_path / "runs"), **overrides})
    result = train(config, tmp_path)
    return result, Path(result["run_dir"])


@pytest.fixture(scope="module")
def rolled_back(tmp_path_factory):
    """A run whose step 4 reports a KL spike, under a rule that rolls back."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        inject_kl(monkeypatch, {4})
        return run(tmp_path_factory.mktemp("rollback"))


def test_a_kl_spike_rolls_back_once_applies_the_remedy_and_the_run_finishes(rolled_back):
    result, run_dir = rolled_back
    assert result["status"] == "finished"
    records = {r["step"]: r for r in read_jsonl(run_dir / "metrics.jsonl")}
    assert sorted(records) == list(range(1, 9))  # the steps go on: none is repeated
    # step_0's optimiser state came back with the weights, so step 5 is where step 1 was on the schedule, halved
    assert records[5]["policy/lr"] == pytest.approx(records[1]["policy/lr"] / 2, rel=1e-3)
    assert records[5]["policy/kl_coef"] == pytest.approx(0.08)
    events = [a for a in read_jsonl(run_dir / "alerts.jsonl") if a["rule"] == "rollback"]
    assert len(events) == 1 and events[0]["step"] == 4 and events[0]["action"] == "rollback"
    assert "rolled back to step_0 after 'kl_spike' at step 4" in events[0]["message"]
    assert "learning rate 5e-05 -> 2.5e-05, beta 0.04 -> 0.08" in events[0]["message"]
    # the weights went back: step 5 samples from the starting policy, so its KL to the reference is ~0
    assert records[5]["policy/kl"] < records[4]["policy/kl"]
    # the event in the report and TensorBoard
    from mlx_grpo.telemetry.analysis.report import build_report

    _, report = build_report(run_dir)
    assert any(a.rule == "rollback" for a in report.alerts)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events_file = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"tensors": 0}).Reload()
    texts = [t.tensor_proto.string_val[0].decode() for t in events_file.Tensors("alerts/text_summary")]
    assert any("rollback" in t and "rolled back to step_0" in t for t in texts)
    # a resume keeps the remedied learning rate: the checkpoint carries the rollbacks' factors
    state = json.loads((run_dir / "checkpoints" / "step_8" / "state.json").read_text())
    assert state["rollbacks"] == 1 and state["remedy"] == {"learning_rate": 0.5, "beta": 2.0}


@pytest.mark.anyio
async def test_the_rollback_shows_in_the_dashboards_alerts_view(rolled_back):
    import time

    from screen_text import screen_text

    from mlx_grpo.tui.app import WatchApp

    app = WatchApp([rolled_back[1]], refresh=0.1)
    async with app.run_test(size=(200, 40)) as pilot:
        await pilot.press("6")
        deadline = time.monotonic() + 20
        while "rolled back to step_0" not in screen_text(app) and time.monotonic() < deadline:
            await pilot.pause(0.05)
        assert "rolled back to step_0 after 'kl_spike' at step 4" in screen_text(app)


def test_rollbacks_are_capped_then_the_rule_stops_the_run(tmp_path, monkeypatch):
    inject_kl(monkeypatch, {3, 5})
    result, run_dir = run(tmp_path, max_rollbacks=1)
    assert result["status"] == "interrupted" and result["stopped_by_alert"] == "kl_spike"
    assert [a["step"] for a in read_jsonl(run_dir / "alerts.jsonl") if a["rule"] == "rollback"] == [3]
    assert max(r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")) == 5


def test_a_second_spike_after_a_rollback_is_seen_and_with_no_rollback_left_stops_the_run(tmp_path, monkeypatch):
    # T1: the rule's cooldown (50 steps) outlived the rollback, so the second spike was silent and the run
    # trained on; the rollback now re-arms the rules as they were at the checkpoint it went back to
    inject_kl(monkeypatch, {3, 5})
    (tmp_path / "kl.yaml").write_text(KL_RULE.replace("cooldown: 0", "cooldown: 50"))
    from mlx_grpo.run.loop import train

    config = load_config(None, {**SMALL, "alerts_file": str(tmp_path / "kl.yaml"), "max_rollbacks": 1,
                                "monitoring_dir": str(tmp_path / "runs")})
    result = train(config, tmp_path)
    run_dir = Path(result["run_dir"])
    assert result["status"] == "interrupted" and result["stopped_by_alert"] == "kl_spike"
    assert [a["step"] for a in read_jsonl(run_dir / "alerts.jsonl") if a["rule"] == "kl_spike"] == [3, 5]
    assert max(r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")) == 5


def test_built_in_actions_by_on_alert():
    rules = default_rules()
    stops = {r.name for r in rules if r.action == "stop"}
    assert stops == {"reward_collapse", "accuracy_collapse", "accel_memory_high", "system_memory_high"}
    assert all(r.action == "none" for r in with_on_alert(rules, "warn"))
    rolling = {r.name for r in with_on_alert(rules, "rollback") if r.action == "rollback"}
    assert rolling == {"non_finite", "kl_drift", "kl_high", "reward_collapse", "accuracy_collapse",
                       "heldout_accuracy_drop"}
    assert next(r for r in rules if r.name == "kl_drift").remedy.to_state() == {"learning_rate": 0.5, "beta": 2.0}


def test_a_remedy_of_something_else_is_refused_with_the_key(tmp_path):
    from mlx_grpo.common.errors import UserError
    from mlx_grpo.telemetry.alerts.config import load_alert_rules

    (tmp_path / "bad.yaml").write_text("rules:\n  - {name: r, kind: threshold, metric: m, op: '>', value: 1,\n"
                                      "     action: rollback, remedy: {temperature: 2}}\n")
    with pytest.raises(UserError, match=r"rules\[0\] \(r\): key 'remedy' may change learning_rate and beta"):
        load_alert_rules(tmp_path / "bad.yaml")


@pytest.mark.slow
def test_learning_rate_1e3_collapses_the_default_run_and_the_collapse_rule_stops_it(tmp_path):
    # Measured: held-out 32% before the first update, sampled accuracy 27% at step 1, 0% at steps 2 and 3;
    # accuracy_collapse (from the start: step 1's 27%, below the held-out 32%) fires at step 3 and stops the run,
    # exit 3.
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "mlx_grpo.cli", "train", "--learning-rate", "1e-3",
                             "--num-steps", "30", "--run-name", "lr1e3", "--no-tensorboard"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert result.returncode == 3, result.stderr
    assert ("mlx-grpo: alert rule 'accuracy_collapse' (action: stop) stopped the run after step 3, checkpoint saved; "
            "continue with: mlx-grpo train --resume runs/lr1e3") in result.stderr
    records = read_jsonl(tmp_path / "runs" / "lr1e3" / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2, 3] and "eval/accuracy" in records[0]
    assert (tmp_path / "runs" / "lr1e3" / "checkpoints" / "step_3").is_dir()
