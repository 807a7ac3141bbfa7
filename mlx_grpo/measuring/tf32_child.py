"""The selftest's TF32 child process: `python -m mlx_grpo.measuring.tf32_child BATCH.npz OUT.npy` computes the default
model's float32 log-probs of a saved batch with MLX_ENABLE_TF32 as this process has it (tf32.py says why)."""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    """The selftest's child: the default model's float32 log-probs of a saved batch, with MLX_ENABLE_TF32 as
    this process has it (the parent runs with 0)."""
    import mlx.core as mx
    import numpy as np

    from ..models.policy import load_policy
    from ..update import TrainBatch, completion_logprobs
    from .selftest import small_config

    batch_file, out_file = argv if argv is not None else sys.argv[1:]
    saved = np.load(batch_file)
    batch = TrainBatch(*(mx.array(saved[k]) for k in ("inputs", "targets", "positions", "mask")),
                       num_tokens=int(saved["num_tokens"]))
    model, _ = load_policy(small_config(dtype="float32"), Path.cwd())
    logprobs = completion_logprobs(model, batch, float(saved["temperature"]))
    np.save(out_file, np.array(logprobs) * np.array(batch.mask))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
