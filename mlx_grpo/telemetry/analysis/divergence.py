"""Where two runs part: the first step at which a metric of one leaves the other's behind by more than their
step-to-step noise, and which metric did so first (`mlx-grpo compare A B --diverge`). Imports no mlx.

Each metric both runs log at the same steps is compared step by step: the difference b - a, smoothed as the
median of the last `window` steps (one wild step is not a parting), against the noise of the difference,
sqrt(noise_a^2 + noise_b^2) with each run's own step-to-step noise (robust.noise_scale; its spread for a
metric that mostly repeats one value). Running means and sums (`*/recent_mean`, `*/cumulative`) are left
out: already smoothed. The runs part on a
metric at the first step from which that smoothed difference stays beyond `z` noise units for `hold` steps
in a row. Hardware and bookkeeping metrics (timing, throughput, system, memory, tokens) are left out: they
part whenever the machine is busier, which says nothing about training.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping

import numpy as np

from ..metrics.robust import noise_scale

TRAINING_PREFIXES = ("rewards/", "accuracy/", "policy/", "completions/", "advantages/", "eval/", "sampling/")
# Running means and sums are already smoothed: their step-to-step noise understates how far two runs may drift;
# quantiles of a few distinct reward values jump between those values (the mean says the same, less coarsely).
SMOOTHED_SUFFIXES = ("/recent_mean", "/cumulative", "/q25", "/q75", "/median")
MIN_COMMON_STEPS = 8


@dataclass(frozen=True)
class Parting:
    """One metric's parting: the first step of it, the two runs' values there and the gap in noise units."""

    metric: str
    step: int
    a: float
    b: float
    strength: float  # |smoothed b - a| / noise of the difference at that step


def _series(records: Iterable[Mapping], name: str) -> dict[int, float]:
    out = {}
    for r in records:
        step, value = r.get("step"), r.get(name)
        if isinstance(step, int) and isinstance(value, (int, float)) and not isinstance(value, bool) \
                and math.isfinite(value):
            out[step] = float(value)
    return out


def training_metrics(a: list[Mapping], b: list[Mapping]) -> list[str]:
    """The training metrics both runs log."""
    names_a = {k for r in a for k in r if k.startswith(TRAINING_PREFIXES) and not k.endswith(SMOOTHED_SUFFIXES)}
    names_b = {k for r in b for k in r if k.startswith(TRAINING_PREFIXES) and not k.endswith(SMOOTHED_SUFFIXES)}
    return sorted(names_a & names_b)


def parting(name: str, a: list[Mapping], b: list[Mapping], z: float = 3.0, window: int = 3,
            hold: int = 3) -> Parting | None:
    """Where the two runs part on one metric, or None (too few common steps, or they never do)."""
    sa, sb = _series(a, name), _series(b, name)
    steps = sorted(set(sa) & set(sb))
    if len(steps) < MIN_COMMON_STEPS:
        return None
    ya, yb = np.array([sa[s] for s in steps]), np.array([sb[s] for s in steps])
    noise = math.hypot(noise_scale(ya), noise_scale(yb))
    if noise <= 0:  # a metric that mostly repeats a value (a quantile of few distinct rewards): its spread
        noise = float(np.std(np.r_[ya, yb]))
    diff = yb - ya
    smoothed = np.array([np.median(diff[max(0, i - window + 1):i + 1]) for i in range(len(diff))])
    if noise <= 0:  # both runs constant on this metric: any lasting gap is a parting
        noise = 1e-12 * max(1.0, float(np.max(np.abs(np.r_[ya, yb]))))
    beyond = np.abs(smoothed) > z * noise
    for i in range(len(steps) - hold + 1):
        if beyond[i:i + hold].all() and len(set(np.sign(smoothed[i:i + hold]))) == 1:
            return Parting(name, steps[i], float(ya[i]), float(yb[i]), float(abs(smoothed[i]) / noise))
    return None


def divergence(a: list[Mapping], b: list[Mapping], names: list[str] | None = None, **options) -> list[Parting]:
    """Every metric on which the runs part, the earliest first (ties: the larger gap first)."""
    names = training_metrics(a, b) if names is None else names
    found = [p for name in names if (p := parting(name, a, b, **options)) is not None]
    return sorted(found, key=lambda p: (p.step, -p.strength))
