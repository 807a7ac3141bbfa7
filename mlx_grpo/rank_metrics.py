"""How each metric combines across data-parallel ranks: one declaration per catalogued name.

In a data-parallel run every rank measures its own share of the batch and produces the same
record of canonical metrics. `combine_records(records)` turns the ranks' records into the one
record of the whole step, by the rule `RULES` declares for each name (first match wins):

- `sum`: counts and totals (`tokens/*`, `*/count`, judge tokens).
- `mean`: a plain mean over ranks. Exact for means over sequences or groups, because every rank
  rolls out the same number of prompts and completions; also used for values every rank holds
  already reduced (`policy/loss`).
- `mean` with a `weight`: each rank's value weighted by another metric of the same rank: token
  means by `tokens/completion_total`, a reward function's statistics by the share of completions it
  scored (`1-rewards/<fn>/missing_frac`), accuracy over truncated completions by
  `completions/clip_ratio`. Exact.
- `std` / `var`: pooled from each rank's std, mean and weight (exact, population statistics).
- `min` / `max`.
- `same`: identical on every rank by construction (learning rate, gradient norm after averaging,
  skipped updates); rank 0's value.
- `ratio`: recomputed from already combined metrics (`throughput/step_tokens_per_s` = all tokens /
  the slowest rank's step seconds); `square`: the square of a combined metric.
- `approx`: no exact combination exists from per-rank summaries (medians, quartiles, p95, the
  binned reward entropy, judge criteria means): the (weighted) mean of the ranks' values, an
  approximation documented in docs/DISTRIBUTED.md.

Timings take the slowest rank (`max`): a step ends when the last rank does. System metrics take
the most loaded machine (`max`; `min` for available memory and the memory limit).
A name no rule matches is averaged over ranks. A metric missing on some ranks is combined over
the ranks that have it. Pure Python, no mlx (tests run it without a distributed launch).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping, Sequence

PLACEHOLDER = re.compile(r"<(\w+)>")


@dataclass(frozen=True)
class Reduce:
    how: str  # sum | mean | min | max | same | std | var | ratio | square
    weight: str | None = None  # mean/std/var: metric weighting each rank ("1-name": one minus it)
    mean: str | None = None  # std/var: the metric holding each rank's mean
    num: str | None = None  # ratio/square: combined metric on top
    den: str | None = None  # ratio: combined metric below
    scale: float = 1.0  # ratio: multiplier (1000 for ms)
    absolute: bool = False  # ratio: |num| / den
    approx: bool = False  # no exact combination; documented as an approximation


SUM, MEAN, MIN, MAX, SAME = Reduce("sum"), Reduce("mean"), Reduce("min"), Reduce("max"), Reduce("same")
APPROX = Reduce("mean", approx=True)
TOKENS = "tokens/completion_total"
SCORED = "1-rewards/<fn>/missing_frac"


def mean_by(weight: str, approx: bool = False) -> Reduce:
    return Reduce("mean", weight=weight, approx=approx)


def pooled_std(mean: str, weight: str | None = None) -> Reduce:
    return Reduce("std", mean=mean, weight=weight)


def ratio(num: str, den: str, scale: float = 1.0, absolute: bool = False) -> Reduce:
    return Reduce("ratio", num=num, den=den, scale=scale, absolute=absolute)


def _stats_rules(prefix: str, mean: Reduce, weight: str | None) -> list[tuple[str, Reduce]]:
    """mean/std/min/max/median/q25/q75 of a sample split across ranks."""
    return [(f"{prefix}/mean", mean), (f"{prefix}/std", pooled_std(f"{prefix}/mean", weight)),
            (f"{prefix}/min", MIN), (f"{prefix}/max", MAX),
            *[(f"{prefix}/{q}", mean_by(weight, approx=True) if weight else APPROX)
              for q in ("median", "q25", "q75")]]


def _summary_rules(prefix: str) -> list[tuple[str, Reduce]]:
    """Whole-run summaries (RunningStats): mean/std/min/max/total_samples."""
    samples = f"{prefix}/total_samples"
    return [(f"{prefix}/mean", mean_by(samples)), (f"{prefix}/std", pooled_std(f"{prefix}/mean", samples)),
            (f"{prefix}/min", MIN), (f"{prefix}/max", MAX), (samples, SUM)]


_MS_PER_TOKEN = {"gen": "rollout", "ref": "ref", "reward": "reward", "advantage": "advantage",
                 "update": "update", "step": "step"}

RULES: tuple[tuple[str, Reduce], ...] = (
    # policy: the update averages loss and gradients across ranks, so these are already global
    ("policy/loss", MEAN),
    ("policy/pg_loss", MEAN),
    ("policy/grad_norm", SAME),
    ("policy/lr", SAME),
    ("policy/kl_coef", SAME),
    ("policy/skipped_updates", SAME),
    ("policy/ratio_std", pooled_std("policy/ratio_mean", TOKENS)),
    ("policy/log_ratio_std", pooled_std("policy/log_ratio_mean", TOKENS)),
    ("policy/ratio_p95", mean_by(TOKENS, approx=True)),
    ("policy/<stat>", mean_by(TOKENS)),  # token means: kl, entropy, clip fractions, ppo_kl, ratio means
    ("advantages/mean", MEAN),
    ("advantages/std", pooled_std("advantages/mean")),
    ("advantages/min", MIN),
    ("advantages/max", MAX),
    # rewards of every completion (the same count on every rank)
    *_stats_rules("rewards/total", MEAN, None),
    ("rewards/total/variance", Reduce("square", num="rewards/total/std")),
    ("rewards/total/recent_mean", MEAN),
    ("rewards/signal_to_noise", ratio("rewards/total/mean", "rewards/total/std", absolute=True)),
    ("rewards/entropy", APPROX),
    ("rewards/zero_std_group_frac", MEAN),
    ("rewards/cumulative", MEAN),
    # one reward function: over the completions it scored
    *_stats_rules("rewards/<fn>", mean_by(SCORED), SCORED),
    ("rewards/<fn>/positive_frac", mean_by(SCORED)),
    ("rewards/<fn>/missing_frac", MEAN),
    ("rewards/<fn>/recent_mean", MEAN),
    ("rewards/<fn>/contribution_pct", APPROX),
    # rollouts
    ("completions/length_mean", MEAN),
    ("completions/length_min", MIN),
    ("completions/length_max", MAX),
    ("completions/clip_ratio", MEAN),
    ("completions/finished_frac", MEAN),
    ("completions/truncated_correct_frac", mean_by("completions/clip_ratio")),
    ("completions/finished_correct_frac", mean_by("completions/finished_frac")),
    ("completions/correct_length_mean", mean_by("accuracy/train")),
    ("prompts/length_mean", MEAN),
    ("prompts/length_min", MIN),
    ("prompts/length_max", MAX),
    ("prompts/clip_ratio", MEAN),
    ("tokens/<kind>", SUM),
    ("accuracy/train", MEAN),
    ("difficulty/<level>/accuracy", mean_by("difficulty/<level>/count")),
    ("difficulty/<level>/count", SUM),
    # held-out evaluation: each rank evaluates its slice of the held-out rows
    ("eval/accuracy", mean_by("eval/num_samples")),
    ("eval/num_samples", SUM),
    ("eval/difficulty/<level>/accuracy", mean_by("eval/difficulty/<level>/count")),
    ("eval/difficulty/<level>/count", SUM),
    # rubric rewards and the judge
    ("criteria/<rubric>/<criterion>/mean", APPROX),
    ("scoring/<criterion>/weight", SAME),
    ("judge/<kind>", SUM),
    # time: a step ends when the slowest rank does; per-token costs are per token of the whole step
    *[(f"timing/{name}_ms_per_token", ratio(f"timing/{phase}_s", TOKENS, scale=1000.0))
      for name, phase in _MS_PER_TOKEN.items()],
    ("timing/<phase>", MAX),
    ("throughput/step_tokens_per_s", ratio("tokens/total", "timing/step_s")),
    ("throughput/<rate>", SUM),  # ranks generate side by side, so their rates add up
    # system: the most loaded machine
    ("system/memory_available_gb", MIN),
    ("system/accel_limit_gb", MIN),
    ("system/<resource>", MAX),
    # epochs and the end of the run
    ("epoch/index", SAME),
    ("epoch/reward_mean", mean_by("epoch/num_samples")),
    ("epoch/reward_variance", Reduce("var", mean="epoch/reward_mean", weight="epoch/num_samples")),
    ("epoch/num_samples", SUM),
    ("epoch/loss_mean", SAME),
    ("epoch/api_tokens", SUM),
    ("epoch/<trend>", MEAN),
    ("final/steps", SAME),
    *_summary_rules("final/criteria/<rubric>/<criterion>"),
    *_summary_rules("final/<fn>"),
    # TinyZero extras
    ("adaptive_window/num_success_samples", SUM),
    ("adaptive_window/mean_success_length", mean_by("adaptive_window/num_success_samples")),
    ("adaptive_window/std_success_length", pooled_std("adaptive_window/mean_success_length",
                                                      "adaptive_window/num_success_samples")),
    ("adaptive_window/median_success_length", mean_by("adaptive_window/num_success_samples", approx=True)),
    ("adaptive_window/p95_success_length", mean_by("adaptive_window/num_success_samples", approx=True)),
    ("adaptive_window/current_window", MAX),
    ("adaptive_window/explored_step", MAX),
    ("adaptive_window/epsilon", SAME),
    ("adaptive_window/<stat>", MEAN),
    ("sgrpo/avg_correct_exit_position", APPROX),
    ("sgrpo/<stat>", MEAN),
    ("sgrpo/exit_<k>/accuracy", MEAN),
)

DEFAULT = MEAN


@lru_cache(maxsize=None)
def _compiled() -> tuple[tuple[re.Pattern, Reduce], ...]:
    out = []
    for pattern, rule in RULES:
        parts = PLACEHOLDER.split(pattern)  # literal, name, literal, name, ...
        regex = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>[^/]+)" for i, p in enumerate(parts))
        out.append((re.compile(f"^{regex}$"), rule))
    return tuple(out)


def rule_for(name: str) -> tuple[Reduce, dict[str, str]] | None:
    """The declared rule of `name` and its placeholder values; None when no rule matches."""
    for regex, rule in _compiled():
        match = regex.match(name)
        if match:
            return rule, match.groupdict()
    return None


def _ref(template: str | None, groups: Mapping[str, str]) -> str | None:
    if template is None:
        return None
    return PLACEHOLDER.sub(lambda m: groups[m.group(1)], template)


def _weights(records: Sequence[Mapping[str, float]], weight: str | None) -> list[float] | None:
    """Each rank's weight, or None (equal weights) when unweighted or some rank lacks the weight."""
    if weight is None:
        return None
    complement = weight.startswith("1-")
    name = weight[2:] if complement else weight
    out = []
    for record in records:
        value = record.get(name)
        if value is None or not math.isfinite(value):
            return None
        out.append(1.0 - value if complement else float(value))
    return out if sum(out) > 0 else None


def _mean(values: Sequence[float], weights: Sequence[float] | None) -> float:
    if weights is None:
        return sum(values) / len(values)
    return sum(w * v for w, v in zip(weights, values)) / sum(weights)


def _pooled_var(records, name: str, rule: Reduce, groups) -> float:
    mean_name = _ref(rule.mean, groups)
    weight_name = _ref(rule.weight, groups)
    means = [r.get(mean_name) for r in records]
    if any(m is None for m in means):  # no per-rank mean to pool with: approximate by averaging
        stds = [r[name] if rule.how == "var" else r[name] ** 2 for r in records]
        return _mean(stds, _weights(records, weight_name))
    weights = _weights(records, weight_name)
    grand = _mean(means, weights)
    within = [r[name] if rule.how == "var" else r[name] ** 2 for r in records]
    spread = [v + (m - grand) ** 2 for v, m in zip(within, means)]
    return _mean(spread, weights)


def _combine_one(name: str, rule: Reduce, groups, records) -> float:
    values = [float(r[name]) for r in records]
    if rule.how == "sum":
        return sum(values)
    if rule.how in ("min", "max"):
        if any(math.isnan(v) for v in values):
            return math.nan
        return min(values) if rule.how == "min" else max(values)
    if rule.how == "same":
        return values[0]
    if rule.how == "var":
        return _pooled_var(records, name, rule, groups)
    if rule.how == "std":
        return math.sqrt(max(0.0, _pooled_var(records, name, rule, groups)))
    return _mean(values, _weights(records, _ref(rule.weight, groups)))


def combine_records(records: Sequence[Mapping[str, float | None]]) -> dict[str, float]:
    """One record from every rank's record (rank order), by the rules of `RULES`."""
    names: dict[str, None] = {}
    for record in records:
        names.update(dict.fromkeys(record))
    out: dict[str, float] = {}
    derived: list[tuple[str, Reduce, dict, list]] = []
    for name in names:
        present = [r for r in records if r.get(name) is not None]
        if not present:
            out[name] = None  # a value was measured but not finite on every rank
            continue
        found = rule_for(name)
        rule, groups = found if found is not None else (DEFAULT, {})
        if rule.how in ("ratio", "square"):
            derived.append((name, rule, groups, present))
        else:
            out[name] = _combine_one(name, rule, groups, present)
    for name, rule, groups, present in derived:
        num = out.get(_ref(rule.num, groups))
        den = out.get(_ref(rule.den, groups)) if rule.how == "ratio" else None
        if num is None or (rule.how == "ratio" and not den):
            out[name] = _mean([float(r[name]) for r in present], None)  # inputs absent: average the ranks
        elif rule.how == "square":
            out[name] = num * num
        else:
            out[name] = rule.scale * (abs(num) if rule.absolute else num) / den
    return out
