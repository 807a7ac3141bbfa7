"""How far frozen-prefix reuse's log-probs, KL and loss are from a full forward's (docs/PERFORMANCE.md).

The kept states come from the rollout's incremental computation (a left-padded batched prefill, then one
position per decode step over a KV cache); a full forward computes every position of the batch at once.
On a random-weight model of a published shape cut to a few blocks, with LoRA on the last ones (their
adapters given random weight, so the policy differs from the reference), one rollout is scored both ways:
the policy's and the reference's completion log-probs, the mean k3 KL, the GRPO loss (beta 0.04, token
advantages spread over [-1, 1]) and the LoRA gradient.

    python benchmarks/frozen_prefix_numerics.py --preset qwen2.5-0.5b --layers 6 --lora-layers 2 --dtype float32
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm import load

from mlx_grpo import frozen_prefix, grpo
from mlx_grpo.config.train_config import TrainConfig
from mlx_grpo.models.policy import DTYPES, apply_adapters, make_reference
from mlx_grpo.planning.presets import cached_preset_model
from mlx_grpo.rollout import generate
from mlx_grpo.sampling import SamplingSettings
from mlx_grpo.update import build_train_batch, completion_logprobs, loss_options, make_loss_fn, reference_logprobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen2.5-0.5b")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--lora-layers", type=int, default=2)
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--prompt-length", type=int, default=32)
    parser.add_argument("--completion", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    model, _ = load(str(cached_preset_model(args.preset, args.layers)))
    model.set_dtype(DTYPES[args.dtype])
    config = TrainConfig(use_lora=True, lora_layers=args.lora_layers, beta=0.04, num_iterations=1,
                         max_generation_steps=args.completion, micro_batch_size=0)
    apply_adapters(model, config)
    key = mx.random.key(args.seed)
    for _, module in model.named_modules():
        if hasattr(module, "lora_b"):
            key, sub = mx.random.split(key)
            module.lora_b = (mx.random.normal(module.lora_b.shape, key=sub) * 0.01).astype(module.lora_b.dtype)
    note = frozen_prefix.install(model)
    if note:
        raise SystemExit(note)
    rng = np.random.default_rng(args.seed)
    vocab = model.args.vocab_size
    prompts = [rng.integers(100, min(vocab, 30000), size=args.prompt_length).tolist() for _ in range(args.prompts)]
    model.eval()
    rollout = generate(model, prompts, args.group_size, args.completion, set(), 0, SamplingSettings(),
                       mx.random.key(args.seed), capture=True)
    batch = build_train_batch(rollout, 0)
    full_batch = replace(batch, prefix=None)
    reference = make_reference(model, config)
    advantages = mx.array(np.linspace(-1, 1, batch.num_sequences), dtype=mx.float32)
    loss_and_grad = nn.value_and_grad(model, make_loss_fn(config))

    def measure(b):
        logp = completion_logprobs(model, b, 1.0)
        ref = reference_logprobs(reference, b, config)
        kl = grpo.masked_mean(grpo.kl_k3(logp, ref), b.mask)
        (loss, _), grads = loss_and_grad(model, b, advantages, None, ref, grpo.LossTotals.of(b.mask))
        mx.eval(logp, ref, kl, loss, grads)
        return logp, ref, kl.item(), loss.item(), dict(tree_flatten(grads))

    reused, full = measure(batch), measure(full_batch)
    active = np.array(batch.mask) > 0

    def max_delta(a, b):
        return float(np.abs(np.array(a.astype(mx.float32)) - np.array(b.astype(mx.float32)))[active].max())

    grad_error = max(float(mx.abs(reused[4][k] - full[4][k]).max().item())
                     / max(float(mx.abs(full[4][k]).max().item()), 1e-30)
                     for k in full[4])
    print(json.dumps({
        "shape": {"preset": args.preset, "layers": args.layers, "lora_layers": args.lora_layers, "dtype": args.dtype,
                  "rows": batch.num_sequences, "prompt_length": args.prompt_length, "completion": args.completion},
        "kept_state_bytes": rollout.prefix.nbytes(),
        "policy_max_abs_delta_logp": max_delta(reused[0], full[0]),
        "reference_max_abs_delta_logp": max_delta(reused[1], full[1]),
        "kl": {"reused": reused[2], "full": full[2], "abs_difference": abs(reused[2] - full[2])},
        "loss": {"reused": reused[3], "full": full[3], "abs_difference": abs(reused[3] - full[3])},
        "lora_gradient_max_relative_difference": grad_error,
        "loss_options": str(loss_options(config)),
    }, indent=2))


if __name__ == "__main__":
    main()
