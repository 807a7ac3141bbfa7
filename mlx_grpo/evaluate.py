"""Held-out evaluation: greedy accuracy of a policy on rows it never trained on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from .data import encode_prompt
from .rewards import is_correct
from .rollout import SamplingSettings, decode_completion, generate
from .step_metrics import difficulty_metrics

GREEDY = SamplingSettings(temperature=0.0)


@dataclass
class EvalResult:
    accuracy: float
    num_rows: int
    by_difficulty: dict[str, float]


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
    levels = [row.get("difficulty") for row in rows]
    by_level = difficulty_metrics(levels, correct) if any(level is not None for level in levels) else {}
    return EvalResult(sum(correct) / max(1, len(correct)), len(correct),
                      {k.replace("difficulty/", "eval/difficulty/"): v for k, v in by_level.items()})
