"""Reward statistics against hand-computed numbers; the reward and throughput trackers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mlx_grpo.telemetry.metrics.reward_stats import (
    RewardTracker,
    RunningStats,
    ThroughputTracker,
    reward_entropy,
    reward_metrics,
)

NAMES = ["fmt", "ans"]


def hand_batch():
    # 2 prompts x G=2. fmt is missing on the last completion; weights 2 and 0.5.
    scores = np.array([[1.0, 0.0, 1.0, np.nan],
                       [0.0, 0.0, 2.0, 2.0]])
    weights = [2.0, 0.5]
    total = np.nansum(np.array(weights)[:, None] * scores, axis=0)  # [2, 0, 3, 1]
    return scores, weights, total


def test_per_function_and_total_statistics_match_hand_computation():
    scores, weights, total = hand_batch()
    m = reward_metrics(scores, NAMES, weights, total, group_size=2)
    # fmt scored [1, 0, 1]: one of four missing.
    assert m["rewards/fmt/mean"] == pytest.approx(2 / 3)
    assert m["rewards/fmt/std"] == pytest.approx(math.sqrt(2 / 9))
    assert (m["rewards/fmt/min"], m["rewards/fmt/max"], m["rewards/fmt/median"]) == (0.0, 1.0, 1.0)
    assert m["rewards/fmt/q25"] == pytest.approx(0.5) and m["rewards/fmt/q75"] == pytest.approx(1.0)
    assert m["rewards/fmt/missing_frac"] == 0.25
    assert m["rewards/fmt/positive_frac"] == pytest.approx(2 / 3)
    # ans scored [0, 0, 2, 2].
    assert (m["rewards/ans/mean"], m["rewards/ans/std"]) == (1.0, 1.0)
    assert (m["rewards/ans/q25"], m["rewards/ans/q75"]) == (0.0, 2.0)
    assert m["rewards/ans/missing_frac"] == 0.0
    # |weighted| sums: fmt 2*(1+0+1) = 4, ans 0.5*(0+0+2+2) = 2.
    assert m["rewards/fmt/contribution_pct"] == pytest.approx(100 * 4 / 6)
    assert m["rewards/ans/contribution_pct"] == pytest.approx(100 * 2 / 6)
    # total [2, 0, 3, 1].
    assert m["rewards/total/mean"] == 1.5
    assert m["rewards/total/variance"] == pytest.approx(1.25)
    assert m["rewards/total/std"] == pytest.approx(math.sqrt(1.25))
    assert (m["rewards/total/q25"], m["rewards/total/median"], m["rewards/total/q75"]) == \
        pytest.approx((0.75, 1.5, 2.25))
    assert m["rewards/signal_to_noise"] == pytest.approx(1.5 / math.sqrt(1.25))
    # Four totals in four different bins of ten over 0..3: log2(4) bits.
    assert m["rewards/entropy"] == pytest.approx(2.0)
    assert m["rewards/zero_std_group_frac"] == 0.0


def test_entropy_of_a_binary_reward_is_the_binary_entropy_of_its_rate():
    total = np.array([1.0, 0.0, 0.0, 0.0] * 4)
    assert reward_entropy(total) == pytest.approx(-(0.25 * math.log2(0.25) + 0.75 * math.log2(0.75)))
    assert reward_entropy(np.full(8, 3.0)) == 0.0
    # Rescaling rewards does not change it.
    spread = np.array([0.0, 0.1, 0.5, 0.9, 1.0])
    assert reward_entropy(spread) == pytest.approx(reward_entropy(100 * spread - 7))


def test_zero_std_groups_are_counted():
    scores = np.array([[1.0, 1.0, 0.0, 2.0, 5.0, 5.0]])
    m = reward_metrics(scores, ["f"], [1.0], scores[0], group_size=2)
    assert m["rewards/zero_std_group_frac"] == pytest.approx(2 / 3)


def test_all_zero_rewards_leave_out_undefined_statistics():
    scores = np.zeros((2, 4))
    m = reward_metrics(scores, NAMES, [1.0, 1.0], np.zeros(4), group_size=2)
    assert "rewards/signal_to_noise" not in m
    assert "rewards/fmt/contribution_pct" not in m
    assert m["rewards/entropy"] == 0.0 and m["rewards/zero_std_group_frac"] == 1.0
    assert m["rewards/fmt/positive_frac"] == 0.0


def test_a_function_with_every_score_missing_reports_only_missing_frac():
    scores = np.array([[np.nan] * 4, [1.0, 0.0, 1.0, 0.0]])
    m = reward_metrics(scores, NAMES, [1.0, 1.0], np.nansum(scores, axis=0), group_size=2)
    assert m["rewards/fmt/missing_frac"] == 1.0
    assert m["rewards/fmt/contribution_pct"] == 0.0
    assert sorted(k for k in m if k.startswith("rewards/fmt/")) == ["rewards/fmt/contribution_pct",
                                                                   "rewards/fmt/missing_frac"]
    assert all(math.isfinite(v) for v in m.values())


def test_bad_shapes_and_a_function_named_total_are_rejected():
    with pytest.raises(ValueError, match="reserved"):
        reward_metrics(np.zeros((1, 4)), ["total"], [1.0], np.zeros(4), 2)
    with pytest.raises(ValueError, match="B\\*G"):
        reward_metrics(np.zeros((1, 5)), ["f"], [1.0], np.zeros(5), 2)


def test_tracker_recent_mean_uses_the_last_ten_steps_and_cumulative_sums_step_means():
    tracker = RewardTracker(["f"])
    for step in range(1, 13):
        out = tracker.update(step, np.full((1, 4), float(step)), np.full(4, float(step)))
    assert out["rewards/total/recent_mean"] == pytest.approx(np.mean(range(3, 13)))
    assert out["rewards/f/recent_mean"] == pytest.approx(np.mean(range(3, 13)))
    assert out["rewards/cumulative"] == pytest.approx(sum(range(1, 13)))


def test_recent_mean_skips_steps_where_a_function_scored_nothing():
    tracker = RewardTracker(["f"])
    tracker.update(1, np.array([[2.0, 2.0]]), np.array([2.0, 2.0]))
    out = tracker.update(2, np.array([[np.nan, np.nan]]), np.array([0.0, 0.0]))
    assert out["rewards/f/recent_mean"] == 2.0
    assert out["rewards/total/recent_mean"] == 1.0


def test_epoch_aggregates_and_trends():
    tracker = RewardTracker(["f"])
    tracker.update(1, np.array([[1.0, 1.0]]), np.array([1.0, 1.0]), loss=0.5)
    tracker.update(2, np.array([[3.0, 3.0]]), np.array([3.0, 3.0]), loss=0.3)
    first = tracker.end_epoch()
    assert first == pytest.approx({"epoch/index": 1, "epoch/num_samples": 4, "epoch/partial": 0,
                                   "epoch/reward/mean": 2.0, "epoch/reward/variance": 1.0, "epoch/loss/mean": 0.4})
    tracker.update(3, np.array([[4.0, 4.0]]), np.array([4.0, 4.0]), loss=0.2)
    second = tracker.end_epoch()
    assert second["epoch/index"] == 2
    assert second["epoch/reward/trend"] == pytest.approx(2.0)
    assert second["epoch/loss/trend"] == pytest.approx(0.2)  # loss went down: positive
    assert second["epoch/reward/variance"] == 0.0


def test_histograms_wait_for_their_step_and_ten_samples():
    tracker = RewardTracker(["f"], hist_every=5, hist_min_samples=10)
    seen = {}
    for step in range(1, 11):
        tracker.update(step, np.full((1, 2), float(step)), np.full(2, float(step)), extra={"advantages/hist": [0.0]})
        seen[step] = tracker.histograms(step)
    assert [step for step, h in seen.items() if h] == [5, 10]
    assert sorted(seen[5]["rewards/total/hist"]) == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    assert "advantages/hist" not in seen[5]  # 5 values: too few, they wait for the next histogram
    assert len(seen[10]["advantages/hist"]) == 10
    assert sorted(seen[10]["rewards/f/hist"]) == [6, 6, 7, 7, 8, 8, 9, 9, 10, 10]


def test_final_metrics_cover_the_whole_run_and_skip_missing_scores():
    tracker = RewardTracker(NAMES)
    tracker.update(1, np.array([[1.0, np.nan], [0.0, 4.0]]), np.array([1.0, 4.0]))
    tracker.update(2, np.array([[3.0, 5.0], [np.nan, np.nan]]), np.array([3.0, 5.0]))
    final = tracker.final_metrics()
    assert final["final/fmt/total_samples"] == 3 and final["final/fmt/mean"] == 3.0
    assert final["final/fmt/std"] == pytest.approx(np.std([1.0, 3.0, 5.0]))
    assert (final["final/fmt/min"], final["final/fmt/max"]) == (1.0, 5.0)
    assert final["final/ans/total_samples"] == 2 and final["final/ans/mean"] == 2.0
    assert final["final/total/total_samples"] == 4 and final["final/total/mean"] == pytest.approx(3.25)


def test_running_stats_merge_matches_numpy_over_many_batches():
    rng = np.random.default_rng(1)
    batches = [rng.normal(1e3, 2.0, size=n) for n in (1, 7, 100, 3)]
    stats = RunningStats()
    for batch in batches:
        stats.add(batch)
    everything = np.concatenate(batches)
    assert stats.count == everything.size
    assert stats.mean == pytest.approx(everything.mean())
    assert stats.variance == pytest.approx(everything.var(), rel=1e-9)


def test_throughput_tracker_average_is_tokens_over_seconds_and_p99_matches_numpy():
    tracker = ThroughputTracker("throughput/gen_tokens_per_s")
    tracker.update(100, 1.0)
    out = tracker.update(400, 2.0)
    assert out["throughput/gen_tokens_per_s"] == 200.0
    assert out["throughput/gen_tokens_per_s/avg"] == pytest.approx(500 / 3)
    assert out["throughput/gen_tokens_per_s/p99"] == pytest.approx(np.percentile([100.0, 200.0], 99))
    rng = np.random.default_rng(0)
    rates = []
    for tokens, seconds in zip(rng.integers(1, 1000, 300), rng.uniform(0.1, 2.0, 300)):
        out = tracker.update(float(tokens), float(seconds))
        rates.append(tokens / seconds)
    assert out["throughput/gen_tokens_per_s/p99"] == pytest.approx(np.percentile([100.0, 200.0, *rates], 99))
    assert tracker.update(10, 0.0) == {}
