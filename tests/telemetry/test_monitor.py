"""RewardMonitor, the Python API for hand-written loops, and the example in docs/ALERTS.md."""

from __future__ import annotations

import contextlib
import io
import math
import re
from pathlib import Path

import pytest

from mlx_grpo.telemetry.monitor import RewardMonitor

DOC = Path(__file__).resolve().parents[2] / "docs" / "ALERTS.md"


def test_docs_example_runs_and_says_what_it_claims(capsys):
    code = re.search(r"## Python API.*?```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    exec(compile(code, str(DOC), "exec"), {"__name__": "alerts_example"})
    captured = capsys.readouterr()
    out = captured.out
    assert "total reward is rising" in out
    assert re.search(r"quality \d+/100: consistency \d+, discriminability \d+, stability \d+, coverage \d+", out)
    assert re.search(r"correct: \d+% of the reward, correlation with correct 1\.00", out)
    assert "no sign of reward hacking" in out
    # 4 groups of 4 with a 20% success rate: half of them all wrong at steps 1 and 2, which zero_std_groups names
    assert "alerts: {'warning': 1, 'error': 1}" in out
    assert "step 2 zero_std_groups" in captured.err and "step 90 non_finite" in captured.err  # as they happen


def _step(monitor, step, p_correct, *, n=16, kl=None):
    correct = [i < round(p_correct * n) for i in range(n)]
    rewards = {"answer": [1.0 if ok else 0.0 for ok in correct], "style": [0.5] * n}
    return monitor.track_step(step, rewards, kl=kl, entropy=0.7, correct=correct, lengths=[10 + i for i in range(n)])


def test_track_step_returns_a_canonical_record():
    monitor = RewardMonitor(group_size=4, weights={"style": 2.0}, rules=[])
    record = _step(monitor, 1, 0.5, kl=0.01)
    assert record["step"] == 1 and record["rewards/answer/mean"] == 0.5
    assert record["rewards/total/mean"] == pytest.approx(0.5 + 2 * 0.5)
    assert record["rewards/style/contribution_pct"] == pytest.approx(100 * 16 / (8 + 16))
    assert record["accuracy/train"] == 0.5 and record["policy/kl"] == 0.01 and record["policy/entropy"] == 0.7
    assert record["completions/length/mean"] == pytest.approx(17.5)
    # Prompt-major groups of 4: the first two groups are all correct, the last two all wrong.
    assert record["rewards/zero_std_group_frac"] == 1.0
    assert monitor.reward_names == ["answer", "style"] and len(monitor.samples) == 16


def test_track_step_refuses_mismatched_input():
    monitor = RewardMonitor(["a", "b"], rules=[])
    with pytest.raises(ValueError, match="missing \\['b'\\]"):
        monitor.track_step(1, {"a": [1.0]})
    with pytest.raises(ValueError, match="same, non-zero number"):
        monitor.track_step(1, {"a": [1.0, 0.0], "b": [1.0]})
    with pytest.raises(ValueError, match="groups of 3"):
        RewardMonitor(["a"], group_size=3, rules=[]).track_step(1, {"a": [1.0, 0.0]})


def test_threshold_and_trend_alerts_fire_once_each():
    monitor = RewardMonitor(rules=[], group_size=16)
    monitor.add_threshold_alert("accuracy/train", 0.2, "below", for_steps=2, name="low accuracy")
    # a trend is judged on at least 6 points (medians of its halves and Mann-Kendall)
    monitor.add_trend_alert("rewards/answer/mean", 0.15, "falling", window=6)
    for step in range(1, 21):
        _step(monitor, step, max(0.0, 0.9 - 0.05 * step))
    fired = [(a.step, a.rule) for a in monitor.alerts]
    assert fired == [(6, "rewards/answer/mean falling over 6"), (15, "low accuracy")]
    summary = monitor.alert_summary()
    assert summary["total"] == 2 and summary["by_level"] == {"warning": 2}
    with pytest.raises(ValueError, match="condition must be one of"):
        monitor.add_threshold_alert("x", 1, "over")


def test_check_metrics_uses_the_builtin_rules():
    monitor = RewardMonitor()
    assert monitor.check_metrics(1, {"policy/loss": 0.1}) == []
    alerts = monitor.check_metrics(2, {"policy/loss": math.inf})
    assert [(a.rule, a.level) for a in alerts] == [("non_finite", "error")]


def test_questions_about_the_run_so_far():
    monitor = RewardMonitor(group_size=4)
    with contextlib.redirect_stderr(io.StringIO()):
        for step in range(1, 41):
            _step(monitor, step, 0.25 + 0.5 * step / 40, kl=0.001 * step)
    summary = monitor.summary()
    assert summary["steps"] == 40 and summary["last_step"] == 40
    assert summary["run"]["final/answer/total_samples"] == 640
    assert summary["latest"]["accuracy/train"] == 0.75
    trends = monitor.recent_trends(20)
    assert trends["rewards/answer/mean"].direction == "rising" and trends["policy/kl"].direction == "rising"
    stats = monitor.function_stats("answer")
    assert stats["min"] == 0.0 and stats["max"] == 1.0 and stats["trend"].direction == "rising"
    assert stats["recent_mean"] == pytest.approx(0.7, abs=0.05)
    with pytest.raises(KeyError, match="no reward function named 'nope'"):
        monitor.function_stats("nope")
    importance = monitor.function_importance()
    assert importance["style"].constant and importance["answer"].correct_corr == pytest.approx(1.0)
    quality = monitor.analyze_quality()
    assert 0 <= quality.score <= 100 and any("style" in issue for issue in quality.issues)
    assert not monitor.detect_hacking().suspected
