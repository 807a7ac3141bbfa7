"""What one training step produced, as data, and the one function that names it: `step_record`.

The trainer's step returns a `StepData` of raw per-completion arrays, the update's results and the
phase timings; under data parallelism the ranks' arrays are gathered into one `StepData` of the
global batch first. `step_record` then computes every per-step metric of the record once, from
whole arrays, so a metric means the same with one process or many. Pure numpy, no mlx.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from ...common.units import GB
from .names import (
    ACCURACY_TRAIN,
    ACCURACY_TRAIN_STDERR,
    EVAL_ACCURACY,
    EVAL_NUM_SAMPLES,
    EVAL_SECONDS,
    FINISHED_CORRECT_FRAC,
    FINISHED_FRAC,
    GEN_MS_PER_TOKEN,
    GRAD_NORM,
    KL,
    LEARNING_RATE,
    LOSS,
    MFU,
    PROMPT_TRUNCATED_FRAC,
    REPETITION_RATE,
    REWARD_BIMODALITY,
    SOLVED_GROUP_FRAC,
    STEP_TOKENS_PER_S,
    TOKENS_TOTAL,
    TRUNCATED_CORRECT_FRAC,
    TRUNCATED_FRAC,
)
from .reward_stats import group_stderr, reward_metrics

# grpo.policy_stats' statistics whose record names put the statistic last (policy/ratio/mean, like rewards/<fn>/mean).
UPDATE_STAT_NAMES = {"ratio_mean": "ratio/mean", "ratio_std": "ratio/std", "ratio_p95": "ratio/p95",
                     "log_ratio_mean": "log_ratio/mean", "log_ratio_std": "log_ratio/std"}

# The phases a step is timed in, in order (timing/<phase>_s, timing/<phase>_ms_per_token).
PHASES = ("rollout", "reward", "advantage", "ref", "update")


@dataclass
class UpdateStats:
    """The update's outcome: loss and gradient norm of the global batch, token means of its statistics."""

    loss: float
    grad_norm: float
    stats: dict[str, float]  # kl, entropy, clip fractions... averaged over the batch's completion tokens
    skipped: int  # optimiser steps refused because the loss or gradient was not finite
    learning_rate: float
    kl_coef: float
    has_reference: bool


@dataclass
class StepData:
    """One step: N = B*G completions (all ranks' when gathered), the update, and timings."""

    step: int
    group_size: int
    reward_names: list[str]
    reward_weights: list[float]
    scores: np.ndarray  # [F, N] per-function scores, NaN = no score
    total: np.ndarray  # [N] weighted total reward
    advantages: np.ndarray  # [N] each completion's group advantage
    prompt_lengths: np.ndarray  # [N] prompt tokens of each sequence
    prompt_truncated: np.ndarray  # [N] bool: prompt cut to max_prompt_length
    lengths: np.ndarray  # [N] completion tokens
    truncated: np.ndarray  # [N] bool: reached the generation budget without EOS
    correct: np.ndarray | None  # [N] bool; None: the run has no correctness check (accuracy n/a)
    difficulty: list  # [N] the dataset's difficulty level of each prompt, None when it has none
    trained_tokens: int  # completion tokens the update trained on (S-GRPO trains on its own exits)
    update: UpdateStats
    seconds: dict[str, float]  # phase -> seconds (PHASES, plus "step"): the slowest rank's
    peak_memory: dict[str, float] = field(default_factory=dict)  # phase -> peak bytes during it
    component_metrics: dict[str, float] = field(default_factory=dict)  # named by their own modules
    texts: list[str] = field(default_factory=list)  # [N] every completion's text
    reasoning: list = field(default_factory=list)  # [N] its reasoning, read by the task's answer format
    predicted: list = field(default_factory=list)  # [N] its answer, read the same way (None: none found)
    prompt_texts: list[str] = field(default_factory=list)  # [B] the step's prompts, one per group
    answers: list = field(default_factory=list)  # [B] their expected answers
    new_errors: list[str] = field(default_factory=list)  # reward-function failures first seen this step
    entropy_dump: dict[str, np.ndarray] | None = None
    # [N] multi-turn runs: each trajectory's turns, answer and tool counts (multiturn/episodes.py), else None
    trajectories: list[dict] | None = None
    flops: float = 0.0  # the step's floating-point work, from the model's shape (mlx_grpo/planning/roofline.py)
    peak_flops_per_s: float = 0.0  # the machine's measured fp32 matmul FLOP/s (0: unknown, no perf/mfu)
    # [M] the advantages the update used, when they are not `advantages`: S-GRPO trains on the serial groups
    # of its exits, not on the sampled completions (whose group advantages the completions table keeps)
    update_advantages: np.ndarray | None = None

    @property
    def trained_advantages(self) -> np.ndarray:
        """What the update weighted its sequences by: advantages/* and the histogram describe these."""
        return self.advantages if self.update_advantages is None else self.update_advantages

    @property
    def completion_tokens(self) -> int:
        """Tokens generated in the step."""
        return int(self.lengths.sum())


def _stats(prefix: str, values: np.ndarray) -> dict[str, float]:
    return {f"{prefix}/mean": float(values.mean()), f"{prefix}/min": float(values.min()),
            f"{prefix}/max": float(values.max())}


def outcome_metrics(data: StepData) -> dict[str, float]:
    """Lengths, tokens, truncation and correctness of the step's completions."""
    lengths = np.asarray(data.lengths, dtype=float)
    truncated = np.asarray(data.truncated, dtype=bool)
    finished = ~truncated
    prompt_lengths = np.asarray(data.prompt_lengths, dtype=float)
    out = {f"completions/{k}": v for k, v in _stats("length", lengths).items()}
    out[TRUNCATED_FRAC] = float(truncated.mean())
    out[FINISHED_FRAC] = float(finished.mean())
    if finished.any():  # the completions that ended by themselves (TRL's *_terminated_length)
        out.update({f"completions/{k}": v for k, v in _stats("terminated_length", lengths[finished]).items()})
    if data.correct is not None:  # without a correctness check, accuracy is left out (n/a), never 0%
        correct = np.asarray(data.correct, dtype=bool)
        if truncated.any():
            out[TRUNCATED_CORRECT_FRAC] = float(correct[truncated].mean())
        if finished.any():
            out[FINISHED_CORRECT_FRAC] = float(correct[finished].mean())
        if correct.any():
            out["completions/correct_length/mean"] = float(lengths[correct].mean())
        out[ACCURACY_TRAIN] = float(correct.mean())
        if correct.size % data.group_size == 0:
            groups = correct.reshape(-1, data.group_size)
            out[SOLVED_GROUP_FRAC] = float(groups.all(axis=1).mean())
            if len(groups) > 1:
                out[ACCURACY_TRAIN_STDERR] = group_stderr(groups)
        out.update(difficulty_metrics(data.difficulty, correct))
    out.update({f"prompts/{k}": v for k, v in _stats("length", prompt_lengths).items()})
    out[PROMPT_TRUNCATED_FRAC] = float(np.asarray(data.prompt_truncated, dtype=bool).mean())
    out["tokens/prompt_total"] = float(prompt_lengths.sum())
    out["tokens/completion_total"] = float(lengths.sum())
    out[TOKENS_TOTAL] = out["tokens/prompt_total"] + out["tokens/completion_total"]
    return out


_WORD = re.compile(r"\w+|[^\w\s]")  # words and single punctuation marks: "</answer>" is 4 of them
REPETITION_N = 3  # n-grams of 3 words


def repetition_rate(text: str, n: int = REPETITION_N) -> float | None:
    """The share of a text's word n-grams that repeat one seen earlier in it (0: no n-gram twice; 0.9: the text
    loops); None below n + 1 words."""
    words = _WORD.findall(text)
    if len(words) <= n:
        return None
    grams = list(zip(*(words[i:] for i in range(n))))
    return 1.0 - len(set(grams)) / len(grams)


def text_metrics(texts: Sequence[str]) -> dict[str, float]:
    """`completions/repetition_rate`: the mean over the step's completions of `repetition_rate` (left out when
    none is long enough to have one)."""
    rates = [r for r in map(repetition_rate, texts) if r is not None]
    return {REPETITION_RATE: float(np.mean(rates))} if rates else {}


def bimodality(values: np.ndarray) -> float | None:
    """Sarle's bimodality coefficient of a sample, (skew^2 + 1) / (excess kurtosis + 3 (n-1)^2 / ((n-2)(n-3))),
    with the sample-size corrected skewness and kurtosis: 1/3 for a normal sample, 5/9 for a uniform one, near
    1 for two well separated clusters. None below 4 values or without spread."""
    x = np.asarray(values, dtype=float)
    n = x.size
    if n < 4:
        return None
    d = x - x.mean()
    m2 = float(np.mean(d * d))
    if m2 <= 1e-12 * max(1.0, float(np.mean(x * x))):
        return None
    g1 = float(np.mean(d ** 3)) / m2 ** 1.5
    g2 = float(np.mean(d ** 4)) / m2 ** 2 - 3.0
    skew = g1 * np.sqrt(n * (n - 1)) / (n - 2)
    kurt = (n - 1) / ((n - 2) * (n - 3)) * ((n + 1) * g2 + 6)
    return float((skew * skew + 1) / (kurt + 3 * (n - 1) ** 2 / ((n - 2) * (n - 3))))


def difficulty_metrics(levels: Sequence, correct: Sequence[bool]) -> dict[str, float]:
    """`difficulty/<level>/accuracy` and `/count` for every level present (None levels are skipped)."""
    by_level: dict[str, list[bool]] = defaultdict(list)
    for level, ok in zip(levels, correct):
        if level is not None:
            by_level[str(level)].append(bool(ok))
    out: dict[str, float] = {}
    for level, oks in sorted(by_level.items()):
        out[f"difficulty/{level}/accuracy"] = float(np.mean(oks))
        out[f"difficulty/{level}/count"] = float(len(oks))
    return out


def update_metrics(update: UpdateStats) -> dict[str, float]:
    """The update's loss, gradient, learning rate, clipping and ratio statistics, by name."""
    out = {LOSS: update.loss, GRAD_NORM: update.grad_norm, LEARNING_RATE: update.learning_rate,
           "policy/kl_coef": update.kl_coef, "policy/skipped_updates": float(update.skipped),
           **{f"policy/{UPDATE_STAT_NAMES.get(k, k)}": v for k, v in update.stats.items()}}
    if not update.has_reference:  # no reference policy: there is no KL to report
        out.pop(KL, None)
        out.pop("policy/kl_penalty", None)
    return out


def timing_metrics(data: StepData) -> dict[str, float]:
    """Phase seconds, milliseconds per completion token, and the whole step's tokens per second."""
    trained = max(1, data.trained_tokens)
    out = {f"timing/{phase}_s": data.seconds[phase] for phase in (*PHASES, "step") if phase in data.seconds}
    out[GEN_MS_PER_TOKEN] = 1000 * data.seconds["rollout"] / max(1, data.completion_tokens)
    for phase in ("update", "ref", "reward", "advantage", "step"):
        out[f"timing/{phase}_ms_per_token"] = 1000 * data.seconds[phase] / trained
    out[STEP_TOKENS_PER_S] = (trained + float(np.sum(data.prompt_lengths))) / data.seconds["step"]
    if data.flops > 0 and data.peak_flops_per_s > 0:
        out[MFU] = data.flops / data.seconds["step"] / data.peak_flops_per_s
    return out


def memory_metrics(data: StepData) -> dict[str, float]:
    """The peak memory of each phase of this step, in GB (mlx_grpo/common/units.py)."""
    return {f"memory/{phase}_peak_gb": peak / GB for phase, peak in data.peak_memory.items()}


def peak_share_metrics(peak_memory: Mapping[str, float], working_set_gb: float | None) -> dict[str, float]:
    """The step's highest phase peak as a percentage of the device's working set (none where it is unknown).

    Measured on the peak, not after the step: by then the KV cache and activations are freed."""
    if not peak_memory or not working_set_gb:
        return {}
    return {"memory/peak_percent": 100.0 * max(peak_memory.values()) / GB / working_set_gb}


def step_record(data: StepData) -> dict[str, float]:
    """Every per-step metric of the step, computed once from the whole batch's arrays."""
    adv = np.asarray(data.trained_advantages, dtype=float)
    return {
        **update_metrics(data.update),
        "advantages/mean": float(adv.mean()), "advantages/std": float(adv.std()),
        "advantages/min": float(adv.min()), "advantages/max": float(adv.max()),
        **reward_metrics(data.scores, data.reward_names, data.reward_weights, data.total, data.group_size),
        **outcome_metrics(data),
        **text_metrics(data.texts),
        **({REWARD_BIMODALITY: b} if (b := bimodality(data.total)) is not None else {}),
        **timing_metrics(data),
        **memory_metrics(data),
        **data.component_metrics,
    }


def eval_record(correct: Sequence[bool], levels: Sequence, seconds: float,
                sampled: Sequence[Sequence[bool]] = ()) -> dict[str, float]:
    """Held-out greedy accuracy (overall and per difficulty level) of every evaluated row; with `sampled`
    (each row's N sampled answers, right or not), mean@N and pass@N."""
    out = {EVAL_SECONDS: seconds, EVAL_NUM_SAMPLES: float(len(correct))}
    if len(correct):  # an empty held-out set has no accuracy, not 0%
        out[EVAL_ACCURACY] = float(np.mean(np.asarray(correct, dtype=bool)))
    if len(sampled):
        right = np.asarray(sampled, dtype=bool)  # [rows, N]
        n = right.shape[1]
        out[f"eval/mean@{n}"] = float(right.mean())
        out[f"eval/pass@{n}"] = float(right.any(axis=1).mean())
    difficulty = difficulty_metrics(levels, correct)
    out.update({k.replace("difficulty/", "eval/difficulty/"): v for k, v in difficulty.items()})
    return out
