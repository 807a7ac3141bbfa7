"""The check every rollout that keeps frozen-block states must pass (frozen_prefix.py): a row's kept states,
prompt then completion, against the last frozen block's output in one full forward over the same tokens."""

from __future__ import annotations

import mlx.core as mx

from mlx_grpo import frozen_prefix


def kept_state_error(model, rollout, row: int) -> float:
    """Largest |kept - full forward| over row `row`'s positions (every token but the completion's last is fed)."""
    tokens = rollout.prompts[row] + rollout.completions[row][:-1]
    with frozen_prefix.recording(model) as recorded:
        model(mx.array([tokens]))
    kept = mx.concatenate([rollout.prefix.prompt[row], rollout.prefix.completion[row]])
    assert kept.shape == recorded[0][0].shape, (kept.shape, recorded[0][0].shape)
    return mx.abs(kept - recorded[0][0]).max().item()
