"""S-GRPO: serial groups of early exits with decaying rewards (see docs/TRAINING_EXTRAS.md).

For every sampled completion (a *path*) the reasoning span is the tokens before its
first `</reasoning>`; when that span is shorter than num_exits tokens, the whole
completion before its first `<answer>` (all of it when there is none) instead. On the
default task the reasoning is empty, so exits fall on the tags themselves. Exit k of K
keeps the first ceil(k * L / K) tokens of a span of L tokens (exit K keeps all of it),
appends the tags that close the reasoning and open the answer (`</reasoning><answer>`,
or `<answer>` when the kept prefix already closed the reasoning), and lets the policy
write the answer, sampled at the run's temperature, until `</answer>`, end-of-sequence
or max_answer_tokens.

A correct answer at exit k earns decay ** (k - 1), a wrong one 0, so the earliest
correct exit is worth the most. The K exits of one path are its serial group: their
advantages are the group-relative advantages of those K rewards, and the update trains
on the K sequences prompt + prefix + forced tags + answer (the forced tags included,
which is what teaches the policy to close its reasoning where an early exit was right).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .. import grpo
from ..rollout import Rollout, decode_completion, generate
from ..sampling import SamplingSettings
from ..tasks.answer_format import CLOSE_ANSWER, CLOSE_REASONING, OPEN_ANSWER, is_correct

# ----------------------------------------------------------------------------- pure pieces

def exit_prefix_lengths(span_length: int, num_exits: int) -> list[int]:
    """Tokens kept at exits 1..K: evenly spaced, the last keeping the whole span."""
    return [math.ceil(k * span_length / num_exits) for k in range(1, num_exits + 1)]


def exit_rewards(correct: np.ndarray, decay: float) -> np.ndarray:
    """[paths, K] correctness -> rewards: decay ** (k - 1) at a correct exit k, else 0."""
    correct = np.asarray(correct, dtype=bool)
    weights = decay ** np.arange(correct.shape[1], dtype=np.float64)
    return np.where(correct, weights[None, :], 0.0)


def find_subsequence(seq: Sequence[int], sub: Sequence[int]) -> int | None:
    """Index of the first occurrence of `sub` in `seq`, or None."""
    n = len(sub)
    if n == 0:
        return None
    for i in range(len(seq) - n + 1):
        if list(seq[i:i + n]) == list(sub):
            return i
    return None


@dataclass(frozen=True)
class TagTokens:
    """Token ids of the tags S-GRPO looks for and forces."""

    close_reasoning: list[int]
    open_answer: list[int]
    close_answer: list[int]

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> "TagTokens":
        def ids(text: str) -> list[int]:
            return list(tokenizer.encode(text, add_special_tokens=False))
        return cls(ids(CLOSE_REASONING), ids(OPEN_ANSWER), ids(CLOSE_ANSWER))


def reasoning_span(completion: Sequence[int], tags: TagTokens, eos_ids: set[int], num_exits: int) -> int:
    """Length of the span exits are placed along (see the module docstring)."""
    body = list(completion[:-1]) if completion and completion[-1] in eos_ids else list(completion)
    closed = find_subsequence(body, tags.close_reasoning)
    if closed is not None and closed >= num_exits:
        return closed
    answer = find_subsequence(body, tags.open_answer)
    return answer if answer is not None else len(body)


def forced_tokens(prefix: Sequence[int], tags: TagTokens) -> list[int]:
    """The tags that close the reasoning (unless the prefix did) and open the answer."""
    if find_subsequence(prefix, tags.close_reasoning) is not None:
        return list(tags.open_answer)
    return list(tags.close_reasoning) + list(tags.open_answer)


def cut_answer(ids: Sequence[int], tags: TagTokens) -> list[int]:
    """The generated answer up to and including its closing tag (multi-token tags are not a stop id)."""
    end = find_subsequence(ids, tags.close_answer)
    return list(ids) if end is None else list(ids[: end + len(tags.close_answer)])


def sgrpo_metrics(correct: np.ndarray, rewards: np.ndarray) -> dict[str, float]:
    """sgrpo/exit_<k>/accuracy per exit, the mean exit position of correct answers, overall accuracy, and the
    share of serial groups whose exits all scored the same (they give the update nothing: all-zero advantages)."""
    correct = np.asarray(correct, dtype=bool)
    rewards = np.asarray(rewards, dtype=float)
    out = {f"sgrpo/exit_{k + 1}/accuracy": float(correct[:, k].mean()) for k in range(correct.shape[1])}
    out["sgrpo/overall_accuracy"] = float(correct.mean())
    out["sgrpo/zero_std_group_frac"] = float((rewards.max(axis=1) == rewards.min(axis=1)).mean())
    if correct.any():
        positions = np.nonzero(correct)[1] + 1
        out["sgrpo/avg_correct_exit_position"] = float(positions.mean())
    return out


# ----------------------------------------------------------------------------- with a model

@dataclass
class SerialGroups:
    """paths * K exit sequences, path-major (exits 1..K of path p are rows p*K .. p*K+K-1)."""

    prompts: list[list[int]]
    completions: list[list[int]]  # kept prefix + forced tags + generated answer
    correct: np.ndarray  # [paths, K]
    rewards: np.ndarray  # [paths, K]
    advantages: mx.array  # [paths * K]
    seconds: float  # answer generation
    # other tokens than the rollout's: the update runs the whole forward (no kept frozen-block states)
    prefix = None

    def metrics(self) -> dict[str, float]:
        return sgrpo_metrics(self.correct, self.rewards)


def run_exits(model: nn.Module, tokenizer: Any, rollout: Rollout, answers: Sequence[str], *, num_exits: int,
              decay: float, max_answer_tokens: int, scale_rewards: str, settings: SamplingSettings,
              eos_ids: set[int], pad_id: int, key: mx.array) -> SerialGroups:
    """Force an answer at each exit of every path, score and group them."""
    tags = TagTokens.from_tokenizer(tokenizer)
    prompts, prefixes = [], []
    for prompt, completion in zip(rollout.prompts, rollout.completions):
        span = reasoning_span(completion, tags, eos_ids, num_exits)
        for keep in exit_prefix_lengths(span, num_exits):
            prefix = list(completion[:keep])
            prompts.append(list(prompt))
            prefixes.append(prefix + forced_tokens(prefix, tags))
    # one id closing tags stop the batch early; longer ones are cut afterwards
    stop_ids = set(eos_ids) | ({tags.close_answer[0]} if len(tags.close_answer) == 1 else set())
    answered = generate(model, [p + q for p, q in zip(prompts, prefixes)], 1, max_answer_tokens, stop_ids, pad_id,
                        settings, key)
    completions = [q + cut_answer(a, tags) for q, a in zip(prefixes, answered.completions)]
    paths = len(rollout.completions)
    correct = np.array([is_correct(decode_completion(tokenizer, c, eos_ids), answers[i // num_exits])
                        for i, c in enumerate(completions)], dtype=bool).reshape(paths, num_exits)
    rewards = exit_rewards(correct, decay)
    advantages = grpo.group_advantages(mx.array(rewards.reshape(-1), dtype=mx.float32), num_exits, scale_rewards)
    return SerialGroups(prompts, completions, correct, rewards, advantages, answered.seconds)
