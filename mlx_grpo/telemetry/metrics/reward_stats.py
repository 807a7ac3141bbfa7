"""Reward and throughput statistics of a run, in numpy (no mlx).

Public API:

- `reward_metrics(scores, names, weights, total, group_size) -> dict[str, float]`: one step's reward
  metrics from the per-function score matrix `scores` [F, N] (NaN = the function gave no score),
  the function names and weights, the weighted total [N] and the group size G (the N = B*G
  completions are prompt-major: completions of prompt b are `total[b*G:(b+1)*G]`). Emits
  `rewards/<fn>/{mean,std,min,max,median,q25,q75,contribution_pct,missing_frac,positive_frac}`,
  `rewards/total/{mean,std,min,max,median,q25,q75,variance}` and
  `rewards/{signal_to_noise,entropy,zero_std_group_frac}`. A statistic that does not exist for
  this batch (all scores of a function missing, std 0 for signal-to-noise) is left out.
- `reward_entropy(total) -> float`: the definition behind `rewards/entropy`: Shannon entropy in
  bits of the totals binned into `ENTROPY_BINS` equal-width bins spanning the batch's min..max
  (0 when all totals are equal; at most log2(ENTROPY_BINS)). Binning over the batch's own range
  makes it independent of the reward scale; a 0/1 reward gives exactly the binary entropy of the
  success rate.
- `RunningStats`: count / mean / variance / min / max of a stream of arrays (Chan's parallel
  update, float64), NaN ignored; `.summary(prefix)` gives `{prefix}/{mean,std,min,max,total_samples}`.
- `RewardTracker`: state across steps. `update(step, scores, total, loss=None, extra=None)`
  returns `rewards/<fn>/recent_mean`, `rewards/total/recent_mean` (mean of the last `recent`
  step means) and `rewards/cumulative` (sum of the step means so far), and accumulates epoch and
  run totals. `histograms(step, extra=None)` returns `{name: array}` of the values gathered since
  the previous histogram when `step % hist_every == 0` and at least `hist_min_samples` values are
  waiting (`rewards/<fn>/hist`, `rewards/total/hist`, plus any `extra` arrays passed to `update`
  such as advantages). `end_epoch()` returns the `epoch/*` metrics and starts a new epoch
  (`epoch/api_tokens` comes from the rubric reward, which counts the judge's tokens).
  `final_metrics()` returns `final/<fn>/*` and `final/total/*`.
- `ThroughputTracker(name)`: `update(tokens, seconds)` returns `{name: tokens/seconds,
  name/avg: sum tokens / sum seconds, name/p99: 99th percentile of the per-step values so far}`;
  O(log n) per step (a sorted list), so a long run does not slow logging down.
- `RunningStats`, `RewardTracker` and `ThroughputTracker` have `state_dict()` (plain JSON: lists,
  numbers, None) and `load_state_dict(state)`, so a checkpoint carries them and a resumed run's
  records continue exactly where the interrupted run's stopped.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from typing import Mapping, Sequence

import numpy as np

from .names import REWARD_MEAN, REWARD_MEAN_STDERR, REWARD_RECENT_MEAN, REWARD_STD, SIGNAL_TO_NOISE, ZERO_STD_GROUP_FRAC

ENTROPY_BINS = 10
# Totals closer than this count as equal when deciding that a group has zero spread.
ZERO_STD_TOL = 1e-8


def _describe(prefix: str, values: np.ndarray) -> dict[str, float]:
    q25, median, q75 = np.percentile(values, [25, 50, 75])
    return {
        f"{prefix}/mean": float(values.mean()),
        f"{prefix}/std": float(values.std()),
        f"{prefix}/min": float(values.min()),
        f"{prefix}/max": float(values.max()),
        f"{prefix}/median": float(median),
        f"{prefix}/q25": float(q25),
        f"{prefix}/q75": float(q75),
    }


def reward_entropy(total: np.ndarray) -> float:
    """Entropy (bits) of the batch's finite total rewards over a fixed number of bins; 0 when all are equal
    or none is finite (a run writes null for a total no function could give)."""
    total = total[np.isfinite(total)]
    if total.size == 0:
        return 0.0
    lo, hi = float(total.min()), float(total.max())
    if hi - lo <= ZERO_STD_TOL * max(1.0, abs(lo), abs(hi)):
        return 0.0
    counts, _ = np.histogram(total, bins=ENTROPY_BINS, range=(lo, hi))
    p = counts[counts > 0] / total.size
    return float(-(p * np.log2(p)).sum())


def _check_names(names: Sequence[str]) -> None:
    if "total" in names:
        # `rewards/total/*` is the weighted sum; a function of that name would overwrite it.
        raise ValueError("a reward function may not be named 'total' (reserved for the weighted sum)")


def reward_metrics(
    scores: np.ndarray,
    names: Sequence[str],
    weights: Sequence[float],
    total: np.ndarray,
    group_size: int,
) -> dict[str, float]:
    """Every per-step reward metric of one batch: per function and total, group spread, signal."""
    scores = np.asarray(scores, dtype=np.float64)
    total = np.asarray(total, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.float64)
    if scores.ndim != 2 or scores.shape[0] != len(names) or len(weights) != len(names):
        raise ValueError(f"scores {scores.shape} must be [F, N] with F = {len(names)} names and weights")
    if total.shape != (scores.shape[1],) or total.size == 0 or total.size % group_size:
        raise ValueError(f"total {total.shape} must be [N] with N = B*G > 0, G = {group_size}")
    _check_names(names)

    out: dict[str, float] = {}
    weighted_abs = np.nansum(np.abs(weights[:, None] * scores), axis=1)
    abs_sum = float(weighted_abs.sum())
    for i, name in enumerate(names):
        row = scores[i]
        present = row[~np.isnan(row)]
        prefix = f"rewards/{name}"
        out[f"{prefix}/missing_frac"] = 1.0 - present.size / row.size
        if present.size:
            out.update(_describe(prefix, present))
            out[f"{prefix}/positive_frac"] = float((present > 0).mean())
        if abs_sum > 0:
            out[f"{prefix}/contribution_pct"] = 100.0 * float(weighted_abs[i]) / abs_sum

    out.update(_describe("rewards/total", total))
    std = out[REWARD_STD]
    out["rewards/total/variance"] = std * std
    if std > 0:
        out[SIGNAL_TO_NOISE] = abs(out[REWARD_MEAN]) / std
    out["rewards/entropy"] = reward_entropy(total)
    groups = total.reshape(-1, group_size)
    spread = groups.max(axis=1) - groups.min(axis=1)
    scale = np.maximum(1.0, np.abs(groups).max(axis=1))
    out[ZERO_STD_GROUP_FRAC] = float((spread <= ZERO_STD_TOL * scale).mean())
    if len(groups) > 1:
        out[REWARD_MEAN_STDERR] = group_stderr(groups)
    return out


def group_stderr(groups: np.ndarray) -> float:
    """Standard error of a batch mean over its prompts: the spread of the [B, G] groups' means / sqrt(B).
    The prompts drawn are the batch's sampling noise; a policy that answers each prompt the same way
    every time moves its batch mean by whole groups from one step to the next."""
    means = np.asarray(groups, dtype=np.float64).mean(axis=1)
    return float(means.std(ddof=1) / np.sqrt(len(means)))


class RunningStats:
    """Streaming count, mean, variance, min and max; NaN values are skipped."""

    def __init__(self) -> None:
        self.count = 0
        self.mean = 0.0
        self._m2 = 0.0
        self.min = math.inf
        self.max = -math.inf

    def add(self, values) -> None:
        """Count these values in."""
        arr = np.asarray(values, dtype=np.float64).ravel()
        arr = arr[~np.isnan(arr)]
        if arr.size == 0:
            return
        n_b, mean_b = arr.size, float(arr.mean())
        m2_b = float(((arr - mean_b) ** 2).sum())
        n = self.count + n_b
        delta = mean_b - self.mean
        self.mean += delta * n_b / n
        self._m2 += m2_b + delta * delta * self.count * n_b / n
        self.count = n
        self.min = min(self.min, float(arr.min()))
        self.max = max(self.max, float(arr.max()))

    @property
    def variance(self) -> float:
        """The variance of the values added so far."""
        return self._m2 / self.count if self.count else math.nan

    def state_dict(self) -> dict:
        """The running totals, for a checkpoint."""
        # min/max are infinite until a value arrives; JSON has no infinity, so an empty stream stores None.
        return {"count": self.count, "mean": self.mean, "m2": self._m2,
                "min": self.min if self.count else None, "max": self.max if self.count else None}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore the running totals."""
        self.count, self.mean, self._m2 = int(state["count"]), float(state["mean"]), float(state["m2"])
        self.min = math.inf if state["min"] is None else float(state["min"])
        self.max = -math.inf if state["max"] is None else float(state["max"])

    def summary(self, prefix: str) -> dict[str, float]:
        """Mean, std, min, max and count, named under `prefix`."""
        if not self.count:
            return {f"{prefix}/total_samples": 0.0}
        return {
            f"{prefix}/mean": self.mean,
            f"{prefix}/std": math.sqrt(self.variance),
            f"{prefix}/min": self.min,
            f"{prefix}/max": self.max,
            f"{prefix}/total_samples": float(self.count),
        }


class RewardTracker:
    """Reward state across steps: recent means, cumulative reward, histograms, epochs, final summary."""

    def __init__(self, names: Sequence[str], recent: int = 10, hist_every: int = 10, hist_min_samples: int = 10):
        _check_names(names)
        self.names = list(names)
        self.hist_every = hist_every
        self.hist_min_samples = hist_min_samples
        self._recent = {name: deque(maxlen=recent) for name in [*self.names, "total"]}
        self._cumulative = 0.0
        self._pending: dict[str, list[np.ndarray]] = {}
        self._final = {name: RunningStats() for name in [*self.names, "total"]}
        self._epoch_index = 1
        self._previous_epoch: dict[str, float] = {}
        self._new_epoch()

    def _new_epoch(self) -> None:
        self._epoch_rewards = RunningStats()
        self._epoch_losses = RunningStats()

    def update(self, step: int, scores: np.ndarray, total: np.ndarray, loss: float | None = None,
               extra: Mapping[str, np.ndarray] | None = None) -> dict[str, float]:
        """Record one step; `extra` arrays (e.g. `advantages/hist`) join the next histograms."""
        scores = np.asarray(scores, dtype=np.float64)
        total = np.asarray(total, dtype=np.float64)
        out: dict[str, float] = {}
        for i, name in enumerate(self.names):
            row = scores[i]
            present = row[~np.isnan(row)]
            self._final[name].add(present)
            self._gather(f"rewards/{name}/hist", present)
            if present.size:
                self._recent[name].append(float(present.mean()))
            if self._recent[name]:
                out[f"rewards/{name}/recent_mean"] = float(np.mean(self._recent[name]))
        step_mean = float(total.mean())
        self._recent["total"].append(step_mean)
        out[REWARD_RECENT_MEAN] = float(np.mean(self._recent["total"]))
        self._cumulative += step_mean
        out["rewards/cumulative"] = self._cumulative
        self._final["total"].add(total)
        self._gather("rewards/total/hist", total)
        for name, values in (extra or {}).items():
            self._gather(name, np.asarray(values, dtype=np.float64).ravel())

        self._epoch_rewards.add(total)
        if loss is not None:
            self._epoch_losses.add([loss])
        return out

    def _gather(self, name: str, values: np.ndarray) -> None:
        if values.size and self.hist_every > 0:
            self._pending.setdefault(name, []).append(values)

    def histograms(self, step: int) -> dict[str, np.ndarray]:
        """Arrays gathered since the last histogram, when due; each name needs hist_min_samples values."""
        if self.hist_every <= 0 or step % self.hist_every:  # hist_every <= 0 turns histograms off
            return {}
        out = {}
        for name, parts in list(self._pending.items()):
            values = np.concatenate(parts)
            if values.size >= self.hist_min_samples:
                out[name] = values
                del self._pending[name]
        return out

    def epoch_has_data(self) -> bool:
        """Whether the current epoch has seen any step yet."""
        return bool(self._epoch_rewards.count)

    def end_epoch(self, partial: bool = False) -> dict[str, float]:
        """The epoch's figures; `partial` marks the run's last epoch when the run ended inside it."""
        out = {"epoch/index": float(self._epoch_index), "epoch/num_samples": float(self._epoch_rewards.count),
               "epoch/partial": float(partial)}
        if self._epoch_rewards.count:
            out["epoch/reward/mean"] = self._epoch_rewards.mean
            out["epoch/reward/variance"] = self._epoch_rewards.variance
            if "epoch/reward/mean" in self._previous_epoch:
                out["epoch/reward/trend"] = out["epoch/reward/mean"] - self._previous_epoch["epoch/reward/mean"]
        if self._epoch_losses.count:
            out["epoch/loss/mean"] = self._epoch_losses.mean
            if "epoch/loss/mean" in self._previous_epoch:
                # Positive when the loss went down, so both trends read "positive = better".
                out["epoch/loss/trend"] = self._previous_epoch["epoch/loss/mean"] - out["epoch/loss/mean"]
        self._previous_epoch = out
        self._epoch_index += 1
        self._new_epoch()
        return out

    def final_metrics(self) -> dict[str, float]:
        """The whole run's statistics of each function and the total (final_metrics.json)."""
        out: dict[str, float] = {}
        for name, stats in self._final.items():
            out.update(stats.summary(f"final/{name}"))
        return out

    def state_dict(self) -> dict:
        """The tracker's totals, for a checkpoint."""
        return {
            "names": self.names,
            "recent": {name: list(values) for name, values in self._recent.items()},
            "cumulative": self._cumulative,
            "pending": {name: [part.tolist() for part in parts] for name, parts in self._pending.items()},
            "final": {name: stats.state_dict() for name, stats in self._final.items()},
            "epoch_index": self._epoch_index,
            "previous_epoch": self._previous_epoch,
            "epoch_rewards": self._epoch_rewards.state_dict(),
            "epoch_losses": self._epoch_losses.state_dict(),
        }

    def load_state_dict(self, state: Mapping) -> None:
        """Restore the tracker's totals."""
        if list(state["names"]) != self.names:
            raise ValueError(f"reward functions {list(state['names'])} in the saved state, {self.names} now")
        for name, values in state["recent"].items():
            self._recent[name].clear()
            self._recent[name].extend(float(v) for v in values)
        self._cumulative = float(state["cumulative"])
        self._pending = {name: [np.asarray(part, dtype=np.float64) for part in parts]
                         for name, parts in state["pending"].items()}
        for name, stats in state["final"].items():
            self._final[name].load_state_dict(stats)
        self._epoch_index = int(state["epoch_index"])
        self._previous_epoch = {k: float(v) for k, v in state["previous_epoch"].items()}
        self._epoch_rewards.load_state_dict(state["epoch_rewards"])
        self._epoch_losses.load_state_dict(state["epoch_losses"])


class ThroughputTracker:
    """Per-step rate plus its run average (total/total) and 99th percentile over the steps so far."""

    def __init__(self, name: str):
        self.name = name
        self._tokens = 0.0
        self._seconds = 0.0
        self._sorted: list[float] = []

    def update(self, tokens: float, seconds: float) -> dict[str, float]:
        """Count one step's tokens and seconds; returns its rate with the running average and p99."""
        if not seconds > 0 or not math.isfinite(seconds):
            return {}
        rate = tokens / seconds
        self._tokens += tokens
        self._seconds += seconds
        bisect.insort(self._sorted, rate)
        return {self.name: rate, f"{self.name}/avg": self._tokens / self._seconds,
                f"{self.name}/p99": self.percentile(99.0)}

    def state_dict(self) -> dict:
        """The rates seen so far, for a checkpoint."""
        return {"tokens": self._tokens, "seconds": self._seconds, "rates": self._sorted}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore the rates seen so far."""
        self._tokens, self._seconds = float(state["tokens"]), float(state["seconds"])
        self._sorted = sorted(float(r) for r in state["rates"])

    def percentile(self, q: float) -> float:
        """numpy's default (linear) percentile of the per-step rates."""
        pos = (len(self._sorted) - 1) * q / 100.0
        lo = math.floor(pos)
        hi = min(lo + 1, len(self._sorted) - 1)
        return self._sorted[lo] + (self._sorted[hi] - self._sorted[lo]) * (pos - lo)
