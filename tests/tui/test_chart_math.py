"""Chart math: smoothing, min/max bucketing and the braille canvas."""

from __future__ import annotations

import numpy as np
import pytest

from mlx_grpo.telemetry.smoothing import ema
from mlx_grpo.tui.braille import Layer, render_cells
from mlx_grpo.tui.chart import legend_names
from mlx_grpo.tui.downsample import bucketize


def ema_loop(x, w, start=None):
    out, y = [], (x[0] if start is None else start)
    for v in x:
        y = w * y + (1 - w) * v
        out.append(y)
    return np.array(out)


@pytest.mark.parametrize("weight", [0.0, 0.6, 0.9, 0.99, 0.999])
def test_ema_matches_the_recurrence_over_long_series(weight):
    x = np.random.default_rng(0).normal(size=20_000).cumsum()
    np.testing.assert_allclose(ema(x, weight), ema_loop(x, weight), rtol=0, atol=1e-9 * np.abs(x).max())


def test_ema_continued_from_a_previous_value_equals_one_pass():
    x = np.random.default_rng(1).normal(size=5000)
    whole = ema(x, 0.9)
    head = ema(x[:3000], 0.9)
    tail = ema(x[3000:], 0.9, start=float(head[-1]))
    np.testing.assert_allclose(np.concatenate((head, tail)), whole, atol=1e-12)


def test_buckets_keep_a_single_spike_among_100k_points():
    xs = np.arange(100_000, dtype=float)
    ys = np.zeros(100_000)
    ys[54_321] = 7.0
    b = bucketize(xs, ys, 0.0, 99_999.0, 80)
    assert len(b.columns) == 80
    assert b.hi.max() == 7.0 and np.count_nonzero(b.hi) == 1
    assert b.columns[np.argmax(b.hi)] == int(54_321 / 100_000 * 80)


def test_buckets_of_few_points_leave_empty_columns_out():
    b = bucketize(np.array([0.0, 10.0]), np.array([1.0, 2.0]), 0.0, 10.0, 20)
    assert b.columns.tolist() == [0, 19]


def test_smoothed_layer_owns_the_cells_it_crosses():
    flat = bucketize(np.arange(10.0), np.full(10, 0.5), 0.0, 9.0, 10)
    noisy = bucketize(np.arange(10.0), np.tile([0.0, 1.0], 5), 0.0, 9.0, 10)
    chars, owners = render_cells([Layer(noisy, "#333333", z=0), Layer(flat, "#ffffff", z=1)], 5, 2, 0.0, 1.0)
    flat_alone, _ = render_cells([Layer(flat, "#ffffff", z=1)], 5, 2, 0.0, 1.0)
    for row in range(2):
        for col in range(5):
            if owners[row][col] == 1:  # where the smoothed line is, only its dots are drawn
                assert chars[row][col] == flat_alone[row][col]
    assert any(o == 0 for row in owners for o in row)  # raw points still show elsewhere


def test_legend_names_drop_what_all_lines_share():
    assert legend_names(["rewards/a/mean", "rewards/b/mean"]) == ["a", "b"]
    assert legend_names(["accuracy/train", "eval/accuracy"]) == ["accuracy/train", "eval/accuracy"]
    assert legend_names(["policy/kl"]) == ["policy/kl"]
    assert legend_names(["timing/step_s", "timing/rollout_s"]) == ["step_s", "rollout_s"]
