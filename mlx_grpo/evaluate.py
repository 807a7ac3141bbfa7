"""Held-out evaluation: greedy decoding of rows the policy never trained on, and which it got right."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import mlx.core as mx

from .data import encode_prompt, extra_columns
from .multiturn.episodes import final_turn
from .multiturn.trajectories import generate_trajectories
from .rewards.correctness import Check, answer_check
from .rollout import decode_completion, generate
from .sampling import SamplingSettings

GREEDY = SamplingSettings(temperature=0.0)


@dataclass
class EvalResult:
    correct: list[bool]  # one per held-out row
    levels: list  # each row's difficulty level (None when the data has none)
    completions: list[str] = field(default_factory=list)  # the greedy completion of each row
    sampled: list[list[bool]] = field(default_factory=list)  # with samples: each row's N sampled answers, right?

    @property
    def accuracy(self) -> float | None:
        return sum(self.correct) / len(self.correct) if self.correct else None


def evaluate(model: Any, tokenizer: Any, rows: list[dict], config: Any, eos_ids: set[int], pad_id: int,
             batch_size: int = 100, progress: Callable[[int], None] | None = None,
             check: Check = answer_check, samples: int = 0,
             settings: SamplingSettings | None = None, multiturn: Any = None) -> EvalResult:
    """Greedy-decode every held-out prompt; a completion is right when `check` says so (the built-in: its
    answer matches). With `samples` N, also sample N completions of each with `settings` (the run's
    sampling), `batch_size` completions at a time, for mean@N and pass@N. `progress` is told how many rows
    each finished batch held (`mlx-grpo eval`'s progress bar). `multiturn` (multiturn/episodes.py): each
    completion is a whole trajectory (tools called, their results read), and `check` reads its last turn."""
    def complete(chunk: list[dict], group: int, sampling: SamplingSettings, key: mx.array) -> list[str]:
        tools = multiturn.tools if multiturn is not None else None
        prompts = [encode_prompt(tokenizer, row["prompt"], config, row.get("messages"), tools).tokens for row in chunk]
        if multiturn is None:
            rollout = generate(model, prompts, group, config.max_generation_steps, eos_ids, pad_id, sampling, key,
                               lookup=config.lookup_decoding)
            return [decode_completion(tokenizer, ids, eos_ids) for ids in rollout.completions]
        rollout = generate_trajectories(model, tokenizer, prompts, chunk, group, multiturn.budgets, eos_ids, pad_id,
                                        sampling, key, multiturn.make_env, tools)
        text_of = lambda ids: decode_completion(tokenizer, ids, eos_ids)  # noqa: E731
        return [final_turn(text_of, c, t) for c, t in zip(rollout.completions, rollout.trajectories)]

    correct: list[bool] = []
    texts: list[str] = []
    sampled: list[list[bool]] = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        chunk_texts = complete(chunk, 1, GREEDY, mx.random.key(0))
        texts += chunk_texts
        correct += check([row["prompt"] for row in chunk], chunk_texts, [row["answer"] for row in chunk],
                         **extra_columns(chunk))
        if progress is not None:
            progress(len(chunk))
    per_call = max(1, batch_size // max(samples, 1))
    for start in range(0, len(rows) if samples > 0 else 0, per_call):
        chunk = rows[start:start + per_call]
        chunk_texts = complete(chunk, samples, settings or SamplingSettings(), mx.random.key(start + 1))
        right = check([row["prompt"] for row in chunk for _ in range(samples)], chunk_texts,
                      [row["answer"] for row in chunk for _ in range(samples)],
                      **{k: [v for v in column for _ in range(samples)] for k, column in extra_columns(chunk).items()})
        sampled += [list(right[i * samples:(i + 1) * samples]) for i in range(len(chunk))]
    return EvalResult(correct, [row.get("difficulty") for row in rows], texts, sampled)
