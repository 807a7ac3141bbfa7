"""The quantized KV cache (`kv_cache_bits`) on a real model: what the rollout saves in memory, what it costs
in time, and how far its sampled log-probs move from the update's full-precision forward.

The model is loaded as `mlx-grpo train` loads it (base dequantized on the CPU, LoRA adapters on, untrained),
the prompts are the config's first training rows, and each setting samples from the same random key. The
log-prob gap is what the importance ratio sees as if the policy had moved: per completion token,
|log p(rollout, quantized cache) - log p(full-precision forward)|.

    python benchmarks/kv_cache_bits.py --config configs/qwen_think.yaml --prompts 2 --group-size 4 --max-tokens 256
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

from mlx_grpo.config.train_config import load_config
from mlx_grpo.data import encode_prompt, load_datasets
from mlx_grpo.models.policy import load_policy_for_training, parameter_bytes
from mlx_grpo.rollout import generate
from mlx_grpo.sampling import SamplingSettings
from mlx_grpo.update import build_train_batch, completion_logprobs


def measure(policy, prompts: list[list[int]], group_size: int, max_tokens: int, temperature: float,
            bits: int) -> dict:
    """One rollout at `bits` (0: the cache in the model's dtype): its time, its peak above what was resident,
    and its log-probs against the full-precision forward over the same tokens."""
    mx.clear_cache()
    resident = mx.get_active_memory()
    mx.reset_peak_memory()
    started = time.perf_counter()
    rollout = generate(policy.model, prompts, group_size, max_tokens, policy.eos_ids, policy.pad_id,
                       SamplingSettings(temperature), mx.random.key(7), kv_bits=bits)
    seconds = time.perf_counter() - started
    peak = mx.get_peak_memory() - resident
    batch = build_train_batch(rollout, policy.pad_id)
    forward = completion_logprobs(policy.model, batch, temperature, gradient=False)
    gaps = np.concatenate([np.abs(np.array(forward[i, :len(lps)]) - np.array(lps))
                           for i, lps in enumerate(rollout.logprobs) if len(lps)])
    tokens = sum(len(c) for c in rollout.completions)
    return {"kv_cache_bits": bits, "seconds": round(seconds, 2), "tokens": tokens,
            "tokens_per_s": round(tokens / seconds, 1), "peak_above_resident_gb": round(peak / 1e9, 4),
            "logp_gap_mean": float(gaps.mean()), "logp_gap_p99": float(np.quantile(gaps, 0.99)),
            "logp_gap_max": float(gaps.max()), "ratio_off_by_over_1pct": float((np.abs(np.expm1(gaps)) > 0.01).mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("configs/qwen_think.yaml"))
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--bits", type=int, nargs="+", default=[0, 8, 4])
    args = parser.parse_args()
    base_dir = args.config.resolve().parent
    config = load_config(str(args.config), {"max_generation_steps": args.max_tokens})
    policy = load_policy_for_training(config, base_dir)
    policy.model.eval()
    rows = load_datasets(config, base_dir)[0][:args.prompts]
    prompts = [encode_prompt(policy.tokenizer, row["prompt"], config, row.get("messages")).tokens for row in rows]
    generate(policy.model, prompts[:1], 1, 8, policy.eos_ids, policy.pad_id, SamplingSettings(1.0),
             mx.random.key(0))  # warm-up: kernels and allocator
    results = [measure(policy, prompts, args.group_size, args.max_tokens, config.temperature, bits)
               for bits in args.bits]
    print(json.dumps({"model": config.model_id, "weights_gb": round(parameter_bytes(policy.model) / 1e9, 3),
                      "prompts": args.prompts, "group_size": args.group_size, "max_tokens": args.max_tokens,
                      "temperature": config.temperature, "results": results}, indent=2))


if __name__ == "__main__":
    import sys

    from mlx_grpo.planning.blas import reexec_with_openblas

    reexec_with_openblas([str(Path(__file__).resolve()), *sys.argv[1:]])  # OpenBLAS on Linux
    main()
