"""The run's recorder state through a checkpoint: saved as JSON, restored, it carries on exactly as if the run
had never stopped."""

import json

import numpy as np
import pytest
from synthetic_runs import Faults, simulate

from mlx_grpo.rewards.rubric import load_rubric
from mlx_grpo.rewards.rubric_reward import RubricReward
from mlx_grpo.rewards.scoring import RewardFunction
from mlx_grpo.telemetry.alerts.config import RULE_KINDS, rules_from_config
from mlx_grpo.telemetry.alerts.engine import AlertEngine
from mlx_grpo.telemetry.alerts.rules import ThresholdRule
from mlx_grpo.telemetry.metrics.reward_stats import RewardTracker, ThroughputTracker
from mlx_grpo.telemetry.recorder import RunRecorder


def through_json(state):
    """What a checkpoint does to a state: strict JSON out and back."""
    return json.loads(json.dumps(state, allow_nan=False))


def alerts_of(engine, records):
    return [a.to_dict() for a in engine.check_all(records)]


def test_alert_engine_resumes_every_rule_kind_exactly():
    faults = Faults(fault_step=150, nan_loss=True, length_reward=True, kl_blowup=True, grad_spike=True,
                    throughput_drop=True, entropy_collapse=True)
    records, _ = simulate(steps=300, faults=faults)
    rules = rules_from_config({}, defaults=True)
    assert {r.kind for r in rules} == set(RULE_KINDS)  # every kind has state in the checkpoint
    cut = 90
    whole = AlertEngine(rules)
    alerts_of(whole, records[:cut])
    saved = through_json(whole.state_dict())
    expected = alerts_of(whole, records[cut:])
    assert {a["rule"] for a in expected} >= {"non_finite", "kl_drift", "reward_hacking", "grad_norm_spike"}

    resumed = AlertEngine(rules_from_config({}, defaults=True))
    resumed.load_state_dict(saved)
    assert alerts_of(resumed, records[cut:]) == expected
    fresh = AlertEngine(rules_from_config({}, defaults=True))
    assert alerts_of(fresh, records[cut:]) != expected  # so the state is what made the difference


def test_a_changed_rule_starts_fresh_and_unknown_state_types_are_refused():
    rule = ThresholdRule(name="high", metric="x", op=">", value=1.0, for_steps=3)
    engine = AlertEngine([rule])
    alerts_of(engine, [{"step": 1, "x": 2.0}, {"step": 2, "x": 2.0}])
    saved = through_json(engine.state_dict())

    same = AlertEngine([ThresholdRule(name="high", metric="x", op=">", value=1.0, for_steps=3)])
    same.load_state_dict(saved)
    assert [a["step"] for a in alerts_of(same, [{"step": 3, "x": 2.0}])] == [3]  # third step in a row
    changed = AlertEngine([ThresholdRule(name="high", metric="x", op=">", value=1.5, for_steps=3)])
    changed.load_state_dict(saved)
    assert alerts_of(changed, [{"step": 3, "x": 2.0}]) == []  # counting starts again under the new rule

    text = json.dumps(saved).replace('"_Latch"', '"ThresholdRule"')
    with pytest.raises(ValueError, match="unknown alert state type 'ThresholdRule'"):
        AlertEngine([rule]).load_state_dict(json.loads(text))


def tracker_steps(tracker, rng, steps):
    out = []
    for step in steps:
        scores = rng.normal(size=(2, 8))
        scores[1, :3] = np.nan  # a function that sometimes gives no score
        total = np.nansum(scores, axis=0)
        out.append(tracker.update(step, scores, total, loss=float(rng.normal()), extra={"advantages/hist": total}))
        out.append({k: v.tolist() for k, v in tracker.histograms(step).items()})
        if step % 4 == 0:
            out.append(tracker.end_epoch())
    out.append(tracker.final_metrics())
    return out


def test_reward_tracker_resumes_exactly():
    whole = RewardTracker(["a", "b"], hist_every=3)
    tracker_steps(whole, np.random.default_rng(0), range(1, 8))
    saved = through_json(whole.state_dict())
    expected = tracker_steps(whole, np.random.default_rng(1), range(8, 20))
    resumed = RewardTracker(["a", "b"], hist_every=3)
    resumed.load_state_dict(saved)
    assert tracker_steps(resumed, np.random.default_rng(1), range(8, 20)) == expected
    with pytest.raises(ValueError, match="reward functions"):
        RewardTracker(["a"]).load_state_dict(saved)


def test_throughput_tracker_resumes_its_average_and_percentile():
    whole = ThroughputTracker("t")
    for tokens in (100, 300, 200):
        whole.update(tokens, 1.0)
    resumed = ThroughputTracker("t")
    resumed.load_state_dict(through_json(whole.state_dict()))
    assert resumed.update(50, 0.5) == whole.update(50, 0.5)


def test_rubric_reward_resumes_its_summary_and_epoch_tokens(tmp_path):
    path = tmp_path / "rubric.yaml"
    path.write_text("name: r\ncriteria:\n  - name: tags\n    weight: 1\n    scorer: substring\n"
                    "    text: ['<answer>']\n  - name: short\n    weight: 1\n    scorer: length\n    max: 10\n")

    def feed(reward, batches):
        out = []
        for i, completions in enumerate(batches):
            reward(["p"] * len(completions), completions, ["1"] * len(completions))
            out.append(reward.step_metrics(i + 1))
            out.append(reward.take_alerts())
        out.append(reward.end_epoch())
        out.append(reward.summary.to_rows())
        return out

    whole = RubricReward(load_rubric(path))
    feed(whole, [["<answer>1</answer>", "no"], ["x" * 30, "<answer>"]])
    saved = through_json(whole.state_dict())
    later = [["<answer>2</answer>", "yes yes yes yes"]]
    resumed = RubricReward(load_rubric(path))
    resumed.load_state_dict(saved)
    assert feed(resumed, later) == feed(whole, later)
    assert resumed.summary.to_rows()[-1]["samples"] == 6


def test_recorder_keeps_reported_reward_errors_nonfinite_count_and_elapsed_time():
    fns = [RewardFunction("a", lambda *a, **k: [], 1.0, error_reported=True), RewardFunction("b", None, 1.0)]
    recorder = RunRecorder(["a", "b"], [], reward_fns=fns, clock=lambda: 112.5)
    recorder._started, recorder.nonfinite_in_a_row = 100.0, 2
    saved = through_json(recorder.state_dict())
    fresh = [RewardFunction("a", None, 1.0), RewardFunction("b", None, 1.0, error_reported=True)]
    restored = RunRecorder(["a", "b"], [], reward_fns=fresh, clock=lambda: 500.0)
    restored.load_state_dict(saved)
    assert restored.elapsed() == 12.5
    assert [f.error_reported for f in fresh] == [True, False] and restored.nonfinite_in_a_row == 2

