"""Adaptive generation window: the token budget of each step's rollout, learned from successes.

A completion is *successful* when its answer is correct (the `accuracy/train` criterion).
After every step the next budget is a high percentile of the successful completions'
lengths plus a margin, clamped to [min_window, max_window]: the rollout stops paying
for tokens that correct answers never need. With probability epsilon a step explores
instead and generates with the full max_window, so the controller can notice that
longer completions have started to succeed. A step with no successful completion has
nothing to measure, so the next step falls back to max_window.

Exploration draws from a generator seeded by (seed, step), so the decision of a step
does not depend on how many steps ran before it in this process: a resumed run
replays the same choices. Pure Python and numpy, no mlx.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

from ..config.train_config import AdaptiveWindowConfig


@dataclass(frozen=True)
class WindowPlan:
    """The budget one step generates with, and whether that step explored."""

    window: int
    explored: bool
    epsilon: float


@dataclass
class ControllerState:
    """Everything the controller carries between steps (JSON-serialisable)."""

    window: int  # budget for the next non-exploring step
    epsilon: float  # exploration probability for the next step
    success_rate_ema: float | None = None  # None until the first step
    steps: int = 0
    explored_steps: int = 0
    successes: int = 0
    samples: int = 0


class WindowController:
    def __init__(self, settings: AdaptiveWindowConfig, max_window: int, seed: int):
        self.settings = settings
        self.max_window = max_window
        self.seed = seed
        self._state = ControllerState(window=max_window, epsilon=settings.epsilon)

    def plan(self, step: int) -> WindowPlan:
        """The budget for `step`: the learned window, or max_window when this step explores."""
        epsilon = self._state.epsilon
        explored = random.Random(f"adaptive_window:{self.seed}:{step}").random() < epsilon
        return WindowPlan(self.max_window if explored else self._state.window, explored, epsilon)

    def next_window(self, success_lengths: np.ndarray) -> int:
        """percentile + margin of the successful lengths, clamped; max_window when there are none."""
        if success_lengths.size == 0:
            return self.max_window
        target = math.ceil(float(np.percentile(success_lengths, self.settings.percentile))) + self.settings.margin
        return int(min(self.max_window, max(self.settings.min_window, target)))

    def update(self, plan: WindowPlan, lengths: Sequence[float], correct: Sequence[bool]) -> dict[str, float]:
        """Record one step's outcome, choose the next window; returns the step's adaptive_window/* metrics."""
        s = self.settings
        state = self._state
        lengths_arr = np.asarray(lengths, dtype=float)
        success = np.asarray(correct, dtype=bool)
        success_lengths = lengths_arr[success]
        rate = float(success.mean()) if success.size else 0.0
        state.success_rate_ema = rate if state.success_rate_ema is None else (
            s.ema_decay * state.success_rate_ema + (1.0 - s.ema_decay) * rate)
        state.steps += 1
        state.explored_steps += int(plan.explored)
        state.successes += int(success.sum())
        state.samples += int(success.size)
        state.window = self.next_window(success_lengths)
        state.epsilon = max(s.min_epsilon, state.epsilon * s.epsilon_decay)

        out = {
            "adaptive_window/current_window": float(plan.window),
            "adaptive_window/num_success_samples": float(success_lengths.size),
            "adaptive_window/success_rate": rate,
            "adaptive_window/success_rate_ema": state.success_rate_ema,
            "adaptive_window/exploration_rate": state.explored_steps / state.steps,
            "adaptive_window/epsilon": plan.epsilon,
            "adaptive_window/cumulative_success_rate": state.successes / max(1, state.samples),
            "adaptive_window/explored_step": float(plan.explored),
        }
        if success_lengths.size:  # length statistics exist only when something succeeded
            out.update({
                "adaptive_window/mean_success_length": float(success_lengths.mean()),
                "adaptive_window/median_success_length": float(np.median(success_lengths)),
                "adaptive_window/std_success_length": float(success_lengths.std()),
                "adaptive_window/p95_success_length": float(np.percentile(success_lengths, 95)),
            })
        return out

    def state_dict(self) -> dict:
        return asdict(self._state)

    def load_state_dict(self, state: dict) -> None:
        self._state = ControllerState(**state)
