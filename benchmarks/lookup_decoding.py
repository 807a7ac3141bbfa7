"""Lookup decoding on a real model: the rollout with and without it, from the same random key.

The model is loaded as `mlx-grpo train` loads it (base dequantized on the CPU, LoRA adapters on, untrained).
Greedy (`--greedy`, the held-out check's decoding) gives the same replies either way, so the two times
compare the same work; sampled, each setting draws its own replies (both exactly from the model), so compare
seconds per token and how long the longest reply ran. Each lookup step's guessed and kept tokens are counted.

    python benchmarks/lookup_decoding.py --config configs/qwen_think.yaml --greedy --prompts 16 --max-tokens 512
    python benchmarks/lookup_decoding.py --config configs/qwen_think.yaml --prompts 2 --group-size 4 --max-tokens 512
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import mlx.core as mx

from mlx_grpo import lookup_decoding
from mlx_grpo import rollout as rollout_module
from mlx_grpo.config.train_config import load_config
from mlx_grpo.data import encode_prompt, load_datasets
from mlx_grpo.models.policy import load_policy_for_training
from mlx_grpo.rollout import generate
from mlx_grpo.sampling import SamplingSettings, check_guesses


def measure(policy, prompts: list[list[int]], group_size: int, max_tokens: int, temperature: float,
            lookup: bool, seed: int) -> tuple[dict, list[list[int]]]:
    steps: list[tuple[int, int]] = []  # (tokens guessed, tokens every row kept) per lookup step

    def counted(logits, guesses, *args):
        kept, logprobs = check_guesses(logits, guesses, *args)
        steps.append((guesses.shape[1], int(kept.min())))
        return kept, logprobs

    rollout_module.check_guesses = counted
    try:
        started = time.perf_counter()
        rollout = generate(policy.model, prompts, group_size, max_tokens, policy.eos_ids, policy.pad_id,
                           SamplingSettings(temperature), mx.random.key(seed), lookup=lookup)
        seconds = time.perf_counter() - started
    finally:
        rollout_module.check_guesses = check_guesses
    lengths = [len(c) for c in rollout.completions]
    result = {"lookup": lookup, "seconds": round(seconds, 2), "tokens": sum(lengths), "longest": max(lengths),
              "tokens_per_s": round(sum(lengths) / seconds, 1), "lookup_steps": len(steps),
              "tokens_by_lookup": sum(kept + 1 for _, kept in steps),
              "kept_per_step": round(sum(k for _, k in steps) / len(steps), 2) if steps else None,
              "guessed_per_step": round(sum(g for g, _ in steps) / len(steps), 2) if steps else None}
    return result, rollout.completions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("configs/qwen_think.yaml"))
    parser.add_argument("--greedy", action="store_true", help="the held-out rows, greedy (else training rows, sampled)")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--seeds", type=int, nargs="+", default=[7])
    args = parser.parse_args()
    base_dir = args.config.resolve().parent
    config = load_config(str(args.config), {"max_generation_steps": args.max_tokens})
    policy = load_policy_for_training(config, base_dir)
    policy.model.eval()
    train, held_out = load_datasets(config, base_dir)[:2]
    rows = (held_out if args.greedy else train)[:args.prompts]
    prompts = [encode_prompt(policy.tokenizer, row["prompt"], config, row.get("messages")).tokens for row in rows]
    group_size = 1 if args.greedy else args.group_size
    temperature = 0.0 if args.greedy else config.temperature
    generate(policy.model, prompts[:1], 1, 8, policy.eos_ids, policy.pad_id, SamplingSettings(1.0),
             mx.random.key(0))  # warm-up: kernels and allocator
    results = []
    for seed in args.seeds:
        off, plain = measure(policy, prompts, group_size, args.max_tokens, temperature, False, seed)
        on, looked_up = measure(policy, prompts, group_size, args.max_tokens, temperature, True, seed)
        results.append({"seed": seed, "off": off, "on": on, "speedup": round(off["seconds"] / on["seconds"], 2),
                        "same_replies": plain == looked_up})
        print(json.dumps(results[-1]), flush=True)
    print(json.dumps({"model": config.model_id, "greedy": args.greedy, "prompts": len(prompts),
                      "group_size": group_size, "max_tokens": args.max_tokens, "temperature": temperature,
                      "lookup_rows": lookup_decoding.LOOKUP_ROWS, "lookup_tokens": lookup_decoding.LOOKUP_TOKENS,
                      "results": results}, indent=2))


if __name__ == "__main__":
    import sys

    from mlx_grpo.planning.blas import reexec_with_openblas

    reexec_with_openblas([str(Path(__file__).resolve()), *sys.argv[1:]])  # OpenBLAS on Linux
    main()
