"""The Mac's own configuration, on the CPU: LoRA in bfloat16 on a base kept 4-bit (`quantized_base: keep`,
`dtype: bfloat16`, what `auto` picks on a Mac). Against the float32 run on the same weights dequantized
(what `auto` picks here), the per-token log-probs and one GRPO update agree within the tolerances below; a
deliberately broken quantized path (scales off by 5%) is caught by the same comparison."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from mlx_grpo.config import load_config
from mlx_grpo.rollout import Rollout
from mlx_grpo.trainer import Trainer
from mlx_grpo.update import build_train_batch, completion_logprobs, update_policy
from tiny_models import make_model_dir

# bfloat16 keeps 8 bits of mantissa: a log-prob of ~-5 computed through a few bf16 layers moves by a few 1e-2
# (measured 0.056 here). Adam's first step divides each gradient entry by its own size, so entries whose
# gradient is near zero move by bf16 noise: the update differs by 0.22 (relative norm; cosine ~0.97).
LOGPROB_TOLERANCE = 0.08  # max |bf16 on 4-bit - fp32 on the dequantized weights|, nats per token
UPDATE_TOLERANCE = 0.35  # relative difference of the adapters' first update


@pytest.fixture(scope="module")
def quantized_dir(tmp_path_factory):
    from mlx_lm import convert

    root = tmp_path_factory.mktemp("mac")
    out = root / "q4"
    convert(str(make_model_dir(root / "plain", hidden_size=128, intermediate_size=256)), str(out), quantize=True,
            q_group_size=32, q_bits=4)
    return out


def trainer(path, tmp_path, **settings) -> Trainer:
    config = load_config(None, {"model_id": str(path), "use_lora": True, "lora_rank": 8, "lora_layers": -1,
                                "learning_rate": 5e-3, "warmup_fraction": 0.0, "lr_schedule": "constant",
                                "beta": 0.0, "num_iterations": 1, "batch_size": 2, "num_generations": 4,
                                "max_generation_steps": 8, "train_size": 8, "eval_size": 2, "seed": 0, **settings})
    return Trainer.build(config, tmp_path)


def fixed_batch(vocab: int):
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(3, vocab, size=6)) for _ in range(2) for _ in range(4)]
    completions = [list(rng.integers(3, vocab, size=8)) for _ in range(8)]
    rollout = Rollout([list(map(int, p)) for p in prompts], [list(map(int, c)) for c in completions],
                      [[0.0] * 8] * 8, [False] * 8, 0.0)
    return build_train_batch(rollout, pad_id=0), mx.array(rng.normal(size=8).astype(np.float32))


def adapters(model) -> dict[str, np.ndarray]:
    return {k: np.array(v.astype(mx.float32)) for k, v in tree_flatten(model.trainable_parameters())}


def compare(mac: Trainer, cpu: Trainer) -> tuple[float, float]:
    """(max log-prob difference, relative difference of the first update's adapter change)."""
    cpu.policy.model.update(mac.policy.model.trainable_parameters())  # the same adapters to start from
    cpu.policy.model.set_dtype(mx.float32)
    batch, advantages = fixed_batch(cpu.policy.model.model.embed_tokens.weight.shape[0])
    logp = [np.array(completion_logprobs(t.policy.model, batch, 1.0).astype(mx.float32)) for t in (mac, cpu)]
    gap = float(np.abs(logp[0] - logp[1]).max())
    changes = []
    for t in (mac, cpu):
        before = adapters(t.policy.model)
        update_policy(t.policy.model, t.optimizer, t.loss_and_grad, batch, advantages, None, t.config)
        after = adapters(t.policy.model)
        changes.append(np.concatenate([(after[k] - before[k]).ravel() for k in before]))
    return gap, float(np.linalg.norm(changes[0] - changes[1]) / np.linalg.norm(changes[1]))


@pytest.mark.parametrize("broken", [False, True], ids=["intact", "deliberately-broken"])
def test_bf16_lora_on_a_kept_4bit_base_matches_the_float32_dequantized_run(quantized_dir, tmp_path, broken):
    mac = trainer(quantized_dir, tmp_path, quantized_base="keep", dtype="bfloat16")
    cpu = trainer(quantized_dir, tmp_path, quantized_base="dequantize", dtype="float32")
    quantized = [m for _, m in mac.policy.model.named_modules() if isinstance(m, nn.QuantizedLinear)]
    assert quantized and all(m.bits == 4 for m in quantized)  # the base stayed 4-bit
    assert not any(isinstance(m, nn.QuantizedLinear) for _, m in cpu.policy.model.named_modules())
    assert mac.policy.model.model.norm.weight.dtype == mx.bfloat16
    assert all(v.dtype == mx.float32 for _, v in tree_flatten(mac.policy.model.trainable_parameters()))
    if broken:  # the quantized matmul reads scales 5% off (a wrong scale layout or dtype does far worse)
        for m in quantized:
            m.scales = m.scales * 1.05
    gap, update = compare(mac, cpu)
    within = gap <= LOGPROB_TOLERANCE and update <= UPDATE_TOLERANCE
    assert within != broken, (gap, update)
