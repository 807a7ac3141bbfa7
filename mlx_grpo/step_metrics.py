"""Per-step outcome metrics of a rollout: lengths, tokens, truncation, correctness, difficulty.

Pure numpy over plain lists, so it is tested without a model.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

import numpy as np


def _stats(prefix: str, values: Sequence[float]) -> dict[str, float]:
    arr = np.asarray(values, dtype=float)
    return {f"{prefix}_mean": float(arr.mean()), f"{prefix}_min": float(arr.min()), f"{prefix}_max": float(arr.max())}


def rollout_metrics(
    prompt_lengths: Sequence[int],
    prompt_truncated: Sequence[bool],
    completion_lengths: Sequence[int],
    completion_truncated: Sequence[bool],
    correct: Sequence[bool],
    difficulty: Sequence | None = None,
) -> dict[str, float]:
    """Metrics over one step's B*G sequences (prompt lists are per sequence too)."""
    lengths = np.asarray(completion_lengths, dtype=float)
    truncated = np.asarray(completion_truncated, dtype=bool)
    finished = ~truncated
    correct_arr = np.asarray(correct, dtype=bool)
    out: dict[str, float] = {}
    out.update({f"completions/{k}": v for k, v in _stats("length", lengths).items()})
    out["completions/clip_ratio"] = float(truncated.mean())
    out["completions/finished_frac"] = float(finished.mean())
    if truncated.any():
        out["completions/truncated_correct_frac"] = float(correct_arr[truncated].mean())
    if finished.any():
        out["completions/finished_correct_frac"] = float(correct_arr[finished].mean())
    if correct_arr.any():
        out["completions/correct_length_mean"] = float(lengths[correct_arr].mean())
    out.update({f"prompts/{k}": v for k, v in _stats("length", prompt_lengths).items()})
    out["prompts/clip_ratio"] = float(np.mean(np.asarray(prompt_truncated, dtype=bool)))
    prompt_total = float(np.sum(prompt_lengths))
    completion_total = float(lengths.sum())
    out["tokens/prompt_total"] = prompt_total
    out["tokens/completion_total"] = completion_total
    out["tokens/total"] = prompt_total + completion_total
    out["accuracy/train"] = float(correct_arr.mean())
    if difficulty is not None:
        out.update(difficulty_metrics(difficulty, correct_arr))
    return out


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
