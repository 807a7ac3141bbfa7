"""A StepData of random but plausible values, for tests of what is computed from a step's data."""

from __future__ import annotations

import numpy as np

from mlx_grpo.telemetry.metrics.step_data import StepData, UpdateStats


def make_step_data(n: int = 16, group_size: int = 4, seed: int = 0, levels=None, **overrides) -> StepData:
    rng = np.random.default_rng(seed)
    scores = rng.normal(size=(2, n))
    scores[0, rng.random(n) < 0.3] = np.nan  # "fmt" misses some completions
    weights = [1.0, 2.0]
    lengths = rng.integers(1, 30, size=n).astype(float)
    values = dict(
        step=1, group_size=group_size, reward_names=["fmt", "ans"], reward_weights=weights, scores=scores,
        total=np.nansum(np.array(weights)[:, None] * scores, axis=0), advantages=rng.normal(size=n),
        prompt_lengths=rng.integers(5, 9, size=n).astype(float), prompt_truncated=rng.random(n) < 0.1,
        lengths=lengths, truncated=rng.random(n) < 0.3, correct=rng.random(n) < 0.5,
        difficulty=list(levels) if levels is not None else [None] * n, trained_tokens=int(lengths.sum()),
        update=UpdateStats(loss=0.5, grad_norm=1.5, stats={"kl": 0.01, "kl_penalty": 0.0004, "entropy": 1.2},
                           skipped=0, learning_rate=1e-4, kl_coef=0.04, has_reference=True),
        seconds={"rollout": 1.0, "reward": 0.1, "advantage": 0.01, "ref": 0.2, "update": 0.5, "step": 2.0},
        peak_memory={"rollout": 2**30, "ref": 2**29, "update": 2**31},
    )
    values.update(overrides)
    return StepData(**values)
