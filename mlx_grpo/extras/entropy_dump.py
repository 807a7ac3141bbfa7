"""Entropy dump files: `<run dir>/entropy/step_<N>.npz`, one per dumped step.

Rows are the sequences the update trained on (the B*G sampled completions, or the
S-GRPO exits when S-GRPO is on), in batch order; T is the longest completion in
the step, P the longest prompt, S the longest prompt+completion. Arrays (numpy .npz,
no pickles):

    step             int64 scalar    the training step
    entropy          float32 [N, T]  entropy (nats) of the policy's next-token distribution
                                     at each completion token; 0 where response_mask is 0
    varentropy       float32 [N, T]  variance of -log p under p at the same positions (nats^2)
    responses        int32   [N, T]  completion token ids, right-padded with -1
    response_mask    uint8   [N, T]  1 for real completion tokens
    prompts          int32   [N, P]  prompt token ids, right-padded with -1
    prompt_lengths   int32   [N]     prompt tokens of each row
    attention_mask   uint8   [N, S]  1 for the real prompt+completion tokens of each row

Values come from the update's first pass, i.e. the policy that sampled the rollout.
This module imports no mlx, so `python -m mlx_grpo.tools.summarize_entropy` runs anywhere.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

DIR_NAME = "entropy"
FIELDS = ("step", "entropy", "varentropy", "responses", "response_mask", "prompts", "prompt_lengths",
          "attention_mask")


def dump_path(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / DIR_NAME / f"step_{step}.npz"


def build_dump(step: int, entropy: np.ndarray, varentropy: np.ndarray, prompts: Sequence[Sequence[int]],
               completions: Sequence[Sequence[int]]) -> dict[str, np.ndarray]:
    """The arrays of one dump, from the per-token [N, >=T] values and the token lists they belong to."""
    n = len(completions)
    width = max(1, max((len(c) for c in completions), default=0))
    total = max(1, max((len(p) + len(c) for p, c in zip(prompts, completions)), default=0))
    prompt_ids = np.full((n, max(1, max((len(p) for p in prompts), default=0))), -1, dtype=np.int32)
    responses = np.full((n, width), -1, dtype=np.int32)
    response_mask = np.zeros((n, width), dtype=np.uint8)
    attention_mask = np.zeros((n, total), dtype=np.uint8)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        prompt_ids[i, : len(p)] = p
        responses[i, : len(c)] = c
        response_mask[i, : len(c)] = 1
        attention_mask[i, : len(p) + len(c)] = 1
    keep = response_mask.astype(bool)
    return {
        "step": np.int64(step),
        "entropy": np.where(keep, np.asarray(entropy, dtype=np.float32)[:, :width], 0.0).astype(np.float32),
        "varentropy": np.where(keep, np.asarray(varentropy, dtype=np.float32)[:, :width], 0.0).astype(np.float32),
        "responses": responses,
        "response_mask": response_mask,
        "prompts": prompt_ids,
        "prompt_lengths": np.array([len(p) for p in prompts], dtype=np.int32),
        "attention_mask": attention_mask,
    }


def write_dump(run_dir: Path, arrays: dict[str, np.ndarray]) -> Path:
    """Write atomically (a reader never sees half a file; a resumed run overwrites its replayed steps)."""
    path = dump_path(run_dir, int(arrays["step"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, path)
    return path


def read_dump(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        missing = [name for name in FIELDS if name not in data]
        if missing:
            raise ValueError(f"{path}: not an entropy dump (missing {', '.join(missing)})")
        return {name: data[name] for name in FIELDS}


def list_dumps(run_dir: Path) -> list[Path]:
    """The dump files of a run, in step order."""
    files = Path(run_dir, DIR_NAME).glob("step_*.npz")
    return sorted((f for f in files if f.stem[5:].isdigit()), key=lambda f: int(f.stem[5:]))
