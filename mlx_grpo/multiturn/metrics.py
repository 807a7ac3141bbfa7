"""What a step's trajectories say about tool use and turns, as metrics (names in the catalogue's `tools/` and
`multiturn/` groups; TRL's `tools/call_frequency` and `tools/failure_frequency` keep TRL's meaning)."""

from __future__ import annotations

from collections import Counter

import numpy as np

from ..telemetry.metrics.names import TOOL_CALL_FREQUENCY, TOOL_CALLED_FRAC, TOOL_FAILURE_FREQUENCY
from .trajectories import Trajectory

TURNS_MEAN = "multiturn/turns_mean"
MODEL_TOKENS_MEAN = "multiturn/model_tokens_mean"
ENVIRONMENT_TOKENS_MEAN = "multiturn/environment_tokens_mean"
ENVIRONMENT_REWARD_MEAN = "multiturn/environment_reward_mean"
ENDED_FRAC = "multiturn/ended_frac"


def trajectory_metrics(trajectories: list[Trajectory], model_mask: list[list[int]]) -> dict[str, float]:
    calls = [len(t.calls) for t in trajectories]
    all_calls = [call for t in trajectories for call in t.calls]
    model_tokens = [sum(mask) for mask in model_mask]
    out = {
        TOOL_CALL_FREQUENCY: float(np.mean(calls)),
        TOOL_FAILURE_FREQUENCY: (sum(failed for _, failed in all_calls) / len(all_calls)) if all_calls else 0.0,
        TOOL_CALLED_FRAC: float(np.mean([c > 0 for c in calls])),
        TURNS_MEAN: float(np.mean([t.turns for t in trajectories])),
        MODEL_TOKENS_MEAN: float(np.mean(model_tokens)),
        ENVIRONMENT_TOKENS_MEAN: float(np.mean([len(m) - k for m, k in zip(model_mask, model_tokens)])),
        ENVIRONMENT_REWARD_MEAN: float(np.mean([t.reward for t in trajectories])),
        ENDED_FRAC: float(np.mean([t.done for t in trajectories])),
    }
    made, failed = Counter(name for name, _ in all_calls), Counter(name for name, bad in all_calls if bad)
    for name, count in made.items():
        out[f"tools/{name}/calls"] = float(count)
        out[f"tools/{name}/failures"] = float(failed[name])
    return out
