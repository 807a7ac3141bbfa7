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

Values come from the update's first pass, i.e. the policy that sampled the rollout. The run hands each
dump to its sinks as an `EntropyDump` event; `EntropyDumpWriter`, one of the run's sinks, writes it.
This module imports no mlx, so `python -m mlx_grpo.tools.summarize_entropy` runs anywhere.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..telemetry.events import Sink
from ..telemetry.rundir.layout import RunPaths

FIELDS = ("step", "entropy", "varentropy", "responses", "response_mask", "prompts", "prompt_lengths",
          "attention_mask")


@dataclass(frozen=True)
class EntropyDump:
    """The event of one step's dump (`build_dump`'s arrays)."""

    arrays: dict[str, np.ndarray]


class EntropyDumpWriter(Sink):
    """The sink that writes each EntropyDump into the run directory's entropy/."""

    name = "entropy dumps"

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)

    def handle(self, event: Any) -> None:
        """Write a dump; other events are not this sink's."""
        if isinstance(event, EntropyDump):
            write_dump(self.run_dir, event.arrays)


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
    path = RunPaths(run_dir).entropy_step(int(arrays["step"]))
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
    return list(RunPaths(run_dir).entropy_files().values())
