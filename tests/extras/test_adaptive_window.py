"""Adaptive generation window: the budget follows successful lengths, explores, and survives a checkpoint."""

import json

import pytest

from mlx_grpo.common.errors import UserError
from mlx_grpo.config.train_config import AdaptiveWindowConfig, load_config
from mlx_grpo.extras.adaptive_window import WindowController
from mlx_grpo.telemetry.metrics.catalogue import find_entry


def controller(max_window=24, seed=0, **settings):
    return WindowController(AdaptiveWindowConfig(enable=True, **{"epsilon": 0.0, **settings}), max_window, seed)


def test_next_window_is_percentile_of_successful_lengths_plus_margin():
    c = controller(percentile=95, margin=4)
    # lengths 8 8 9 10 12: the 95th percentile interpolates 10 -> 12 at 0.8, 11.6, rounded up to 12
    c.update(c.plan(1), [8, 8, 9, 10, 12], [True] * 5)
    assert c.plan(2).window == 16


def test_only_correct_completions_set_the_window():
    c = controller(percentile=100, margin=2, min_window=1)
    metrics = c.update(c.plan(1), [5, 20, 21], [True, False, False])
    assert c.plan(2).window == 7
    assert metrics["adaptive_window/num_success_samples"] == 1
    assert metrics["adaptive_window/mean_success_length"] == 5
    assert metrics["adaptive_window/success_rate"] == pytest.approx(1 / 3)


def test_window_is_clamped_to_min_window_and_max_window():
    c = controller(max_window=24, min_window=8, percentile=50, margin=4)
    c.update(c.plan(1), [30, 31], [True, True])
    assert c.plan(2).window == 24
    c.update(c.plan(2), [1, 2], [True, True])
    assert c.plan(3).window == 8


def test_a_step_without_success_falls_back_to_the_maximum():
    c = controller(max_window=24, min_window=4, margin=0)
    c.update(c.plan(1), [6, 6], [True, True])
    assert c.plan(2).window == 6
    metrics = c.update(c.plan(2), [6, 6], [False, False])
    assert c.plan(3).window == 24
    assert "adaptive_window/mean_success_length" not in metrics  # no successful length to describe
    assert metrics["adaptive_window/current_window"] == 6


def test_exploration_jumps_to_the_maximum_about_epsilon_of_the_time_reproducibly():
    c = controller(max_window=24, seed=5, epsilon=0.3, min_window=4, margin=0)
    c.update(c.plan(1), [6], [True])
    plans = [c.plan(step) for step in range(2, 1002)]
    explored = [p for p in plans if p.explored]
    assert 240 <= len(explored) <= 360  # binomial(1000, 0.3): mean 300, sd 14.5
    assert all(p.window == 24 for p in explored)
    assert all(p.window == 6 for p in plans if not p.explored)
    same_seed = controller(max_window=24, seed=5, epsilon=0.3)
    assert [same_seed.plan(s).explored for s in range(2, 1002)] == [p.explored for p in plans]
    other_seed = controller(max_window=24, seed=6, epsilon=0.3)
    assert [other_seed.plan(s).explored for s in range(2, 1002)] != [p.explored for p in plans]


def test_exploration_rate_counts_explored_steps_and_epsilon_decays_to_its_floor():
    c = controller(epsilon=0.5, epsilon_decay=0.5, min_epsilon=0.1)
    epsilons, explored = [], 0
    for step in range(1, 6):
        plan = c.plan(step)
        explored += plan.explored
        metrics = c.update(plan, [8], [True])
        epsilons.append(metrics["adaptive_window/epsilon"])
        assert metrics["adaptive_window/explored_step"] == float(plan.explored)
        assert metrics["adaptive_window/exploration_rate"] == pytest.approx(explored / step)
    assert epsilons == pytest.approx([0.5, 0.25, 0.125, 0.1, 0.1])


def test_success_rate_ema_and_cumulative_success_rate():
    c = controller(ema_decay=0.9)
    rates = []
    for step, correct in enumerate([[True, True], [False, False], [True, False, False, True]], 1):
        m = c.update(c.plan(step), [8] * len(correct), correct)
        rates.append((m["adaptive_window/success_rate_ema"], m["adaptive_window/cumulative_success_rate"]))
    # EMA starts at the first rate: 1.0, then 0.9 * 1.0 + 0.1 * 0 = 0.9, then 0.9 * 0.9 + 0.1 * 0.5 = 0.86
    assert [r[0] for r in rates] == pytest.approx([1.0, 0.9, 0.86])
    assert [r[1] for r in rates] == pytest.approx([1.0, 0.5, 4 / 8])


def test_state_round_trips_through_json_and_resumes_the_same_decisions():
    settings = dict(epsilon=0.4, epsilon_decay=0.9, min_window=4, margin=1)
    first = controller(seed=3, **settings)
    for step in range(1, 4):
        first.update(first.plan(step), [5, 7, 9], [True, step % 2 == 0, True])
    resumed = controller(seed=3, **settings)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    for step in range(4, 8):
        plan_a, plan_b = first.plan(step), resumed.plan(step)
        assert plan_a == plan_b
        assert first.update(plan_a, [6, 8], [True, True]) == resumed.update(plan_b, [6, 8], [True, True])


def test_every_metric_name_is_catalogued():
    c = controller()
    metrics = c.update(c.plan(1), [8, 9], [True, False])
    assert len(metrics) == 12
    assert all(find_entry(name) is not None for name in metrics), [n for n in metrics if find_entry(n) is None]


def test_config_refuses_a_minimum_above_the_maximum():
    with pytest.raises(UserError, match="adaptive_window.min_window"):
        load_config(None, {"adaptive_window.enable": True, "adaptive_window.min_window": 30,
                           "max_generation_steps": 24})
    with pytest.raises(UserError, match="adaptive_window.epsilon_decay"):
        load_config(None, {"adaptive_window.epsilon_decay": 0.0})
    assert load_config(None, {"adaptive_window.min_window": 30}).adaptive_window.min_window == 30  # off: unused
