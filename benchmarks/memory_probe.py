"""Measure the peak memory of each phase of one GRPO step on a random-weight model of a given shape.

The numbers `mlx_grpo/planning/plan.py`'s formula is calibrated on, and checked against. MLX's peak-memory
counter is exact on every backend, so the figures do not depend on machine load; compute is done
in float32 unless --dtype says otherwise (on a CPU, bf16 matmuls bypass BLAS and are slow).

    python benchmarks/memory_probe.py --hidden 896 --intermediate 4864 --heads 14 --kv-heads 2 \\
        --vocab 151936 --layers 1 2 --sequences 2 --prompt 64 --completion 256 --chunk 128
"""

from __future__ import annotations

import argparse
import importlib
import json
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from mlx_grpo.config.train_config import load_config
from mlx_grpo.models.policy import apply_adapters, make_reference
from mlx_grpo.planning.presets import preset_config
from mlx_grpo.rollout import Rollout, generate
from mlx_grpo.sampling import SamplingSettings
from mlx_grpo.trainer import make_optimizer
from mlx_grpo.update import build_train_batch, checkpoint_blocks, make_loss_fn, reference_logprobs, update_policy


@dataclass
class Probe:
    preset: str = ""  # a published shape (mlx_grpo/planning/presets.py); the shape fields below are then ignored
    model_type: str = "qwen2"
    hidden: int = 896
    intermediate: int = 4864
    heads: int = 14
    kv_heads: int = 2
    vocab: int = 151936
    tied: bool = True
    layers: int = 1
    sequences: int = 2  # completions in the batch (the micro-batch is all of them unless micro_batch_size)
    group_size: int = 2
    prompt: int = 64
    completion: int = 128
    micro_batch_size: int = 0
    chunk: int = 0
    grad_checkpoint: bool = False
    use_lora: bool = True
    lora_rank: int = 8
    lora_layers: int = -1  # adapters on the last this many blocks (-1: every block)
    beta: float = 0.04
    num_iterations: int = 1  # optimiser updates per rollout (each evaluates and frees its own pass)
    dtype: str = "float32"
    rollout: bool = False
    train: bool = True  # measure the reference and update phases (off: the rollout alone)

    def model_config(self) -> dict:
        if self.preset:
            return preset_config(self.preset, self.layers)
        return {"model_type": self.model_type, "hidden_size": self.hidden, "intermediate_size": self.intermediate,
                "num_attention_heads": self.heads, "num_key_value_heads": self.kv_heads,
                "vocab_size": self.vocab, "num_hidden_layers": self.layers, "tie_word_embeddings": self.tied,
                "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 32768}


def build_model(probe: Probe) -> nn.Module:
    config = probe.model_config()
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    model = module.Model(module.ModelArgs.from_dict(config))
    model.set_dtype(getattr(mx, probe.dtype))
    mx.eval(model.parameters())
    return model


def measure(probe: Probe) -> dict[str, float]:
    """Bytes: weights, and the peak above what was resident before each phase (rollout, ref, update)."""
    config = load_config(None, {"use_lora": probe.use_lora, "lora_rank": probe.lora_rank,
                                "lora_layers": probe.lora_layers, "beta": probe.beta,
                                "micro_batch_size": probe.micro_batch_size, "logits_chunk_size": probe.chunk,
                                "grad_checkpoint": probe.grad_checkpoint, "max_generation_steps": probe.completion,
                                "num_iterations": probe.num_iterations, "learning_rate": 1e-5})
    mx.random.seed(0)
    model = build_model(probe)
    mx.clear_cache()
    weights = mx.get_active_memory()
    apply_adapters(model, config)
    if config.grad_checkpoint:
        checkpoint_blocks(model)
    reference = make_reference(model, config)
    optimizer = make_optimizer(config)
    rng = np.random.default_rng(0)
    vocab = probe.model_config()["vocab_size"]
    num_prompts = probe.sequences // probe.group_size
    prompts = [rng.integers(1, vocab, probe.prompt).tolist() for _ in range(num_prompts)]
    out = {"weights": weights}

    def phase(name, run):
        mx.eval(model.parameters())
        mx.clear_cache()
        before = mx.get_active_memory()
        mx.reset_peak_memory()
        result = run()
        out[name] = mx.get_peak_memory() - before
        return result

    if probe.rollout:
        phase("rollout", lambda: generate(model, prompts, probe.group_size, probe.completion, set(), 0,
                                          SamplingSettings(temperature=1.0), mx.random.key(0)))
        out["kv_bytes"] = (probe.sequences * (probe.prompt + probe.completion) * len(model.layers) * 2
                           * model.args.num_key_value_heads * (getattr(model.args, "head_dim", None)
                           or model.args.hidden_size // model.args.num_attention_heads) * mx.float32.size)
    if not probe.train:
        out["trainable_state"] = mx.get_active_memory() - weights
        return out
    completions = [rng.integers(1, vocab, probe.completion).tolist() for _ in range(probe.sequences)]
    rollout = Rollout([p for p in prompts for _ in range(probe.group_size)], completions,
                      [[0.0] * probe.completion] * probe.sequences, [False] * probe.sequences, 0.0)
    batch = build_train_batch(rollout, pad_id=0)
    mx.eval(batch.inputs, batch.targets, batch.positions, batch.mask)
    ref_logp = phase("ref", lambda: reference_logprobs(reference, batch, config))
    loss_and_grad = nn.value_and_grad(model, make_loss_fn(config))
    advantages = mx.array(rng.normal(size=probe.sequences), dtype=mx.float32)
    if not probe.use_lora:  # the first update allocates the (large) optimiser state: measure the second
        update_policy(model, optimizer, loss_and_grad, batch, advantages, ref_logp, config)
    phase("update", lambda: update_policy(model, optimizer, loss_and_grad, batch, advantages, ref_logp, config))
    out["trainable_state"] = mx.get_active_memory() - weights
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, value in Probe().__dict__.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            parser.add_argument(flag, type=lambda s: s.lower() in ("1", "true", "yes"), default=value)
        elif name == "layers":
            parser.add_argument(flag, type=int, nargs="+", default=[value])
        else:
            parser.add_argument(flag, type=type(value), default=value)
    args = vars(parser.parse_args(argv))
    for layers in args.pop("layers"):
        probe = Probe(**args, layers=layers)
        print(json.dumps({**probe.__dict__, **measure(probe)}), flush=True)


if __name__ == "__main__":
    import sys
    from pathlib import Path

    from mlx_grpo.planning.blas import reexec_with_openblas

    reexec_with_openblas([str(Path(__file__).resolve()), *sys.argv[1:]])  # OpenBLAS on Linux: ~20x the matmuls
    main()
