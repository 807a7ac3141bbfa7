"""The rollout's log-probs against the update's first pass: sampling/logp_diff/* and sampling/importance_ratio/*."""

from __future__ import annotations

import re

import numpy as np
import pytest

from mlx_grpo.telemetry.metrics.catalogue import find_entry
from mlx_grpo.telemetry.metrics.charts import tensorboard_layout
from mlx_grpo.telemetry.metrics.other_names import OTHER_NAMES
from mlx_grpo.update import sampler_logprobs, sampling_mismatch

NAMES = ("sampling/logp_diff/mean", "sampling/logp_diff/max", "sampling/importance_ratio/min",
         "sampling/importance_ratio/mean", "sampling/importance_ratio/max")


def test_mismatch_over_the_completion_tokens_only():
    sampler = sampler_logprobs([[-1.0, -2.0], [-0.5]], 3)
    assert sampler.tolist() == [[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]]
    update = np.array([[-1.1, -2.0, -9.0], [-0.3, -9.0, -9.0]])  # -9: padding, never counted
    mask = np.array([[1, 1, 0], [1, 0, 0]])
    out = sampling_mismatch(update, sampler, mask)
    assert out["sampling/logp_diff/mean"] == pytest.approx((0.1 + 0 + 0.2) / 3)
    assert out["sampling/logp_diff/max"] == pytest.approx(0.2)
    assert out["sampling/importance_ratio/min"] == pytest.approx(np.exp(-0.1))
    assert out["sampling/importance_ratio/max"] == pytest.approx(np.exp(0.2))
    assert sampling_mismatch(update, sampler, np.zeros((2, 3))) == {}


def test_a_real_run_reads_below_1e_4_nats_on_the_cpu(default_run):
    records = [r for r in default_run[1] if "rewards/total/mean" in r]
    assert records and all(r["sampling/logp_diff/max"] < 1e-4 for r in records)
    assert all(abs(r["sampling/importance_ratio/mean"] - 1) < 1e-4 for r in records)


def test_catalogued_charted_and_answering_trls_names():
    patterns = [p for section in tensorboard_layout().values() for chart in section.values() for p in chart[1]]
    for name in NAMES:
        assert find_entry(name) is not None and any(re.match(p, name) for p in patterns), name
    trl = {o.name: o.answers for o in OTHER_NAMES if o.source == "trl"}
    assert trl["sampling/sampling_logp_difference/max"] == ("sampling/logp_diff/max",)
    assert trl["sampling/importance_sampling_ratio/min"] == ("sampling/importance_ratio/min",)
