"""Verdicts from robust statistics (issue 34): Theil-Sen, Mann-Kendall, change points, and the words built on
them: trend labels that do not call a collapse "flat" (T5), alert percentages that are the change they name
(T10), an early collapse seen (T4), held-out accuracy watched (T15)."""

from __future__ import annotations

import numpy as np
import pytest

from mlx_grpo.telemetry.alerts.config import default_rules
from mlx_grpo.telemetry.alerts.engine import AlertEngine
from mlx_grpo.telemetry.analysis.robust import (change_point, mann_kendall, percent_change, theil_sen, verdict)
from mlx_grpo.telemetry.analysis.reward_report import trend_of


def test_theil_sen_keeps_the_slope_through_wild_points():
    x = np.arange(50.0)
    y = 2.0 * x + 1.0
    y[::5] = -500.0  # a fifth of the points are garbage
    slope, intercept = theil_sen(x, y)
    assert slope == pytest.approx(2.0, abs=0.05)
    assert abs(np.polyfit(x, y, 1)[0] - 2.0) > 0.5  # least squares is dragged off


def test_mann_kendall_tells_a_trend_from_noise():
    rng = np.random.default_rng(0)
    p_up, tau_up = mann_kendall(np.arange(30.0) + rng.normal(0, 3, 30))
    assert p_up < 1e-3 and tau_up > 0.5
    p_noise, _ = mann_kendall(rng.normal(0, 1, 30))
    assert p_noise > 0.05
    assert mann_kendall(np.ones(20)) == (1.0, 0.0)


def test_change_point_finds_a_level_shift_and_not_one_in_noise():
    rng = np.random.default_rng(1)
    y = np.r_[rng.normal(8, 0.3, 10), rng.normal(-3, 0.3, 10)]
    cp = change_point(y)
    assert cp is not None and cp.index == 10 and cp.before > 7 and cp.after < -2
    assert change_point(rng.normal(0, 1, 200)) is None


# review 3's run F (lr 1e-2, on_alert: rollback): the mean total reward of its 12 steps
F_REWARD = [7.80, -3.09, -3.12, 8.88, -2.74, -2.99, -2.41, -3.08, -2.85, -2.60, -2.95, -2.70]


def test_a_fall_from_8_to_minus_3_is_falling_not_flat():
    # T5: the old first-vs-last-quarter noise test called this (and -100% falls) "flat"
    records = [{"step": i + 1, "rewards/total/mean": v} for i, v in enumerate(F_REWARD)]
    trend = trend_of(records, "rewards/total/mean")
    assert trend.direction == "falling"
    accuracy = [{"step": i + 1, "accuracy/train": v} for i, v in
                enumerate([0.23, 0.0, 0.0, 0.45, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])]
    assert trend_of(accuracy, "accuracy/train").direction == "falling"


def test_flat_is_only_said_of_a_series_that_did_not_move():
    rng = np.random.default_rng(2)
    steps = np.arange(1, 201)
    assert verdict(steps, 8.5 + rng.normal(0, 0.25, 200)).direction == "flat"
    # moved a lot, but back and forth: not "flat", and not a trend either
    wild = np.r_[rng.normal(5, 3, 10), rng.normal(8, 3, 10)][rng.permutation(20)]
    wild[-5:] += 4
    v = verdict(np.arange(20), wild)
    assert v.direction in ("unclear", "rising")
    assert verdict(steps, 5 + 0.02 * steps + rng.normal(0, 0.3, 200)).direction == "rising"


def test_percent_change_is_the_change():
    assert percent_change(0.0, 0.2344) == "-100%"
    assert percent_change(0.5, 0.25) == "+100%"
    assert percent_change(0.3, 0.0) == "+0.3"


def _fire(records, rules=None):
    return AlertEngine(rules or default_rules()).check_all(records)


def test_an_accuracy_collapse_says_minus_100_percent():
    # T10: it said "-94%" (the fall divided by min_scale 0.25) for a fall from 0.2344 to 0
    records = [{"step": 0, "eval/accuracy": 0.32},
               {"step": 1, "accuracy/train": 0.2344}, {"step": 2, "accuracy/train": 0.0},
               {"step": 3, "accuracy/train": 0.0}]
    [alert] = [a for a in _fire(records) if a.rule == "accuracy_collapse"]
    assert alert.step == 3 and "(-100%, step 1)" in alert.message


def test_a_reward_collapse_in_the_first_steps_is_seen():
    # T4: reward 7.8 then -3.0 for 14 steps raised nothing; a task with no correctness check was unprotected
    records = [{"step": 1, "rewards/total/mean": 7.8}] + [{"step": s, "rewards/total/mean": -3.0}
                                                          for s in range(2, 16)]
    fired = [a for a in _fire(records) if a.rule == "reward_collapse"]
    assert [a.step for a in fired] == [3] and fired[0].action == "stop"
    assert "-138%" in fired[0].message


def test_a_healthy_noisy_start_does_not_collapse():
    rng = np.random.default_rng(3)
    records = [{"step": s, "rewards/total/mean": 5.0 + 0.02 * s + rng.normal(0, 0.4)} for s in range(1, 60)]
    assert not [a for a in _fire(records) if a.rule == "reward_collapse"]


def test_held_out_accuracy_falling_is_named():
    # T15: review 3's D3, held-out 32% -> 12.5% at step 20, raised nothing
    records = [{"step": 0, "eval/accuracy": 0.32}, {"step": 10, "eval/accuracy": 0.28},
               {"step": 20, "eval/accuracy": 0.125}, {"step": 30, "eval/accuracy": 0.20}]
    fired = [a for a in _fire(records) if a.rule == "heldout_accuracy_drop"]
    assert [a.step for a in fired] == [20]
    assert "-61%" in fired[0].message
    rising = [{"step": s, "eval/accuracy": v} for s, v in zip(range(0, 201, 20),
                                                               [0.32, 0.4, 0.45, 0.5, 0.55, 0.5, 0.6, 0.65, 0.7,
                                                                0.72, 0.74])]
    assert not [a for a in _fire(rising) if a.rule == "heldout_accuracy_drop"]
