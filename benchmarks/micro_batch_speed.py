"""What the memory-lean update costs in speed: update tokens/s with micro-batches, head chunks and
block checkpointing against the whole batch at once, on a shape where all of them fit.

Each setting runs once per repetition, interleaved, so a slow moment on a busy machine hits all of
them alike; the report gives each one's median tokens/s and its ratio to the whole-batch update
within the same repetition. float32 (bf16 matmuls bypass BLAS on a CPU).

    python benchmarks/micro_batch_speed.py --hidden 896 --intermediate 4864 --heads 14 --vocab 151936 \\
        --layers 2 --sequences 8 --prompt 64 --completion 256

With `--group-size G` the sequences come in groups of G sharing a prompt, as in a GRPO step, and one
more setting, "whole batch, each row its prompt", scores every row over its whole sequence: what the
update did before a group shared one pass over its prompt.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from memory_probe import Probe, build_model

from mlx_grpo.config.train_config import load_config
from mlx_grpo.models.policy import apply_adapters
from mlx_grpo.rollout import Rollout
from mlx_grpo.trainer import make_optimizer
from mlx_grpo.update import build_train_batch, checkpoint_blocks, make_loss_fn, update_policy

SETTINGS = {
    "whole batch": {},
    "micro 4": {"micro_batch_size": 4},
    "micro 2": {"micro_batch_size": 2},
    "micro 1": {"micro_batch_size": 1},
    "micro 2, chunk 64": {"micro_batch_size": 2, "logits_chunk_size": 64},
    "micro 2, chunk 64, checkpoint": {"micro_batch_size": 2, "logits_chunk_size": 64, "grad_checkpoint": True},
}
UNSHARED = "whole batch, each row its prompt"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--intermediate", type=int, default=4864)
    parser.add_argument("--heads", type=int, default=14)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--completion", type=int, default=256)
    parser.add_argument("--group-size", type=int, default=1, help="completions per prompt")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--only", nargs="+", metavar="SETTING", help="time only these settings (and the whole batch)")
    args = parser.parse_args()
    probe = Probe(hidden=args.hidden, intermediate=args.intermediate, heads=args.heads, kv_heads=args.kv_heads,
                  vocab=args.vocab, layers=args.layers)
    rng = np.random.default_rng(0)
    prompts = [prompt for _ in range(args.sequences // args.group_size)
               for prompt in [rng.integers(1, args.vocab, args.prompt).tolist()] * args.group_size]
    args.sequences = len(prompts)
    completions = [rng.integers(1, args.vocab, args.completion).tolist() for _ in range(args.sequences)]
    batch = build_train_batch(Rollout(prompts, completions, [[0.0] * args.completion] * args.sequences,
                                      [False] * args.sequences, 0.0), pad_id=0)
    advantages = mx.array(rng.normal(size=args.sequences), dtype=mx.float32)
    tokens = args.sequences * args.completion

    settings = dict(SETTINGS)
    if args.group_size > 1:
        settings[UNSHARED] = {}
    if args.only:
        settings = {name: value for name, value in settings.items() if name == "whole batch" or name in args.only}
    runners = {}
    for name, overrides in settings.items():
        config = load_config(None, {"use_lora": True, "beta": 0.0, "learning_rate": 1e-5,
                                    "max_generation_steps": args.completion, **overrides})
        mx.random.seed(0)
        model = build_model(probe)
        apply_adapters(model, config)
        if config.grad_checkpoint:
            checkpoint_blocks(model)
        optimizer = make_optimizer(config)
        loss_and_grad = nn.value_and_grad(model, make_loss_fn(config))

        rows = replace(batch, prompts=[]) if name == UNSHARED else batch

        def run(model=model, optimizer=optimizer, loss_and_grad=loss_and_grad, config=config, rows=rows) -> float:
            start = time.perf_counter()
            update_policy(model, optimizer, loss_and_grad, rows, advantages, None, config)
            return time.perf_counter() - start

        run()  # warm-up
        runners[name] = run

    seconds: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(args.repetitions):
        for name, run in runners.items():
            seconds[name].append(run())
    whole = seconds["whole batch"]
    report = {name: {"tokens_per_s": round(tokens / statistics.median(s), 1),
                     "vs_whole_batch": round(statistics.median([w / x for w, x in zip(whole, s)]), 3)}
              for name, s in seconds.items()}
    print(json.dumps({"shape": vars(args), "update": report}, indent=2))


if __name__ == "__main__":
    import sys
    from pathlib import Path

    from mlx_grpo.planning.blas import reexec_with_openblas

    reexec_with_openblas([str(Path(__file__).resolve()), *sys.argv[1:]])  # OpenBLAS on Linux: ~20x the matmuls
    main()
