"""Held-out evaluation: greedy decoding of rows the policy never trained on, and which it got right."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from .data import encode_prompt
from .rewards import is_correct
from .rollout import SamplingSettings, decode_completion, generate

GREEDY = SamplingSettings(temperature=0.0)


@dataclass
class EvalResult:
    correct: list[bool]  # one per held-out row
    levels: list  # each row's difficulty level (None when the data has none)

    @property
    def accuracy(self) -> float | None:
        return sum(self.correct) / len(self.correct) if self.correct else None


def evaluate(model: Any, tokenizer: Any, rows: list[dict], config: Any, eos_ids: set[int], pad_id: int,
             batch_size: int = 100) -> EvalResult:
    """Greedy-decode every held-out prompt; a completion is right when its answer matches."""
    correct: list[bool] = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        prompts = [encode_prompt(tokenizer, row["prompt"], config).tokens for row in chunk]
        rollout = generate(model, prompts, 1, config.max_generation_steps, eos_ids, pad_id, GREEDY,
                           mx.random.key(0))
        for row, ids in zip(chunk, rollout.completions):
            correct.append(is_correct(decode_completion(tokenizer, ids, eos_ids), row["answer"]))
    return EvalResult(correct, [row.get("difficulty") for row in rows])
