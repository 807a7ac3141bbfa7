"""The Mac's own configuration, on the CPU: LoRA in bfloat16 on a base kept 4-bit (`quantized_base: keep`,
`dtype: bfloat16`, what `auto` picks on a Mac). Against the float32 run on the same weights dequantized
(what `auto` picks here), the per-token log-probs and one GRPO update agree within the tolerances below, and a
short `mlx-grpo train` run on the shipped model made 4-bit learns. Deliberately broken quantized paths (scales
off by 5%; the quantized matmul's gradient sign-flipped) are caught by the same checks."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten
from tiny_models import make_model_dir

import mlx_grpo.run.loop as run_module
from mlx_grpo.config.train_config import load_config
from mlx_grpo.data import encode_prompt, load_datasets
from mlx_grpo.models.policy import DEFAULT_MODEL_DIR, adapters_disabled
from mlx_grpo.rollout import Rollout
from mlx_grpo.tasks import arithmetic
from mlx_grpo.trainer import Trainer
from mlx_grpo.update import build_train_batch, completion_logprobs, update_policy

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


@pytest.mark.parametrize("broken", [None, "scales", "gradient"],
                         ids=["intact", "deliberately-broken-scales", "deliberately-broken-gradient"])
def test_bf16_lora_on_a_kept_4bit_base_matches_the_float32_dequantized_run(quantized_dir, tmp_path, monkeypatch,
                                                                           broken):
    mac = trainer(quantized_dir, tmp_path, quantized_base="keep", dtype="bfloat16")
    cpu = trainer(quantized_dir, tmp_path, quantized_base="dequantize", dtype="float32")
    quantized = [m for _, m in mac.policy.model.named_modules() if isinstance(m, nn.QuantizedLinear)]
    assert quantized and all(m.bits == 4 for m in quantized)  # the base stayed 4-bit
    assert not any(isinstance(m, nn.QuantizedLinear) for _, m in cpu.policy.model.named_modules())
    assert mac.policy.model.model.norm.weight.dtype == mx.bfloat16
    assert all(v.dtype == mx.float32 for _, v in tree_flatten(mac.policy.model.trainable_parameters()))
    if broken == "scales":  # the quantized matmul reads scales 5% off (a wrong scale layout or dtype does far worse)
        for m in quantized:
            m.scales = m.scales * 1.05
    if broken == "gradient":  # the same forward pass, a wrong backward through the 4-bit matrices
        monkeypatch.setattr(mx, "quantized_matmul", quantized_matmul_with_its_gradient_negated)
    gap, update = compare(mac, cpu)
    within = gap <= LOGPROB_TOLERANCE and update <= UPDATE_TOLERANCE
    assert within == (broken is None), (gap, update)


# ----------------------------------------------------------------------------- a short run that learns

QUANTIZED_MATMUL = mx.quantized_matmul  # MLX's own, kept before a test replaces it

def quantized_matmul_with_its_gradient_negated(x, w, scales, biases=None, transpose=True, group_size=None, bits=None,
                                               mode="affine"):
    """MLX's quantized matmul, same forward, its gradient with respect to the input sign-flipped: a broken
    backward through the 4-bit base that a comparison of log-probs alone cannot see."""
    args = {"group_size": group_size, "bits": bits, "mode": mode}

    @mx.custom_function
    def product(x):
        return QUANTIZED_MATMUL(x, w, scales, biases, transpose=transpose, **args)

    @product.vjp
    def negated(primals, cotangent, output):
        return (-QUANTIZED_MATMUL(cotangent, w, scales, biases, transpose=not transpose, **args),)

    return product(x)


@pytest.fixture(scope="module")
def default_model_4bit(tmp_path_factory):
    """The shipped default model made 4-bit as mlx-community's directories are (mlx_lm.convert, 4 bits, groups
    of 64): loaded by `mlx_lm.load` into QuantizedLinear/QuantizedEmbedding layers, like a user's download."""
    from mlx_lm import convert

    out = tmp_path_factory.mktemp("mac-learns") / "default-4bit"
    convert(str(DEFAULT_MODEL_DIR), str(out), quantize=True, q_bits=4, q_group_size=64)
    return out


def train_on_the_4bit_base(model_dir, tmp_path, monkeypatch, broken: bool, **settings) -> tuple[list[dict], Trainer]:
    """`mlx-grpo train`'s own loop (run.train) in the Mac's configuration; the step records and the trained model."""
    runs, open_run = [], run_module.open_run

    def opened(*args, **kwargs):
        runs.append(open_run(*args, **kwargs))
        return runs[-1]

    monkeypatch.setattr(run_module, "open_run", opened)
    if broken:
        monkeypatch.setattr(mx, "quantized_matmul", quantized_matmul_with_its_gradient_negated)
    config = load_config(None, {"model_id": str(model_dir), "quantized_base": "keep", "dtype": "bfloat16",
                                "use_lora": True, "lora_rank": 8, "lora_layers": -1, "lr_schedule": "constant",
                                "warmup_fraction": 0.0, "beta": 0.0, "max_generation_steps": 12, "eval_every": 0,
                                "checkpoint_every": 0, "tensorboard": False, "wandb": False,
                                "monitoring_dir": str(tmp_path / "runs"), **settings})
    result = run_module.train(config, tmp_path)
    assert result["status"] == "finished"
    records = [json.loads(line) for line in (Path(result["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "rewards/total/mean" in r], runs[0].trainer


def assert_the_mac_configuration(model: nn.Module) -> None:
    """The base stayed 4-bit and computes in bfloat16; the adapters are LoRA's, in float32."""
    quantized = [m for _, m in model.named_modules() if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))]
    assert len(quantized) == 4 * 7 + 1 and all(m.bits == 4 for m in quantized)  # every block's 7 and the embedding
    assert model.model.norm.weight.dtype == mx.bfloat16 and quantized[0].scales.dtype == mx.bfloat16
    trained = tree_flatten(model.trainable_parameters())
    assert trained and all(k.endswith(("lora_a", "lora_b")) and v.dtype == mx.float32 for k, v in trained)


def right_answer_logprob(trainer: Trainer) -> np.ndarray:
    """Each training prompt's log-probability of its right completion (the task's own reasoning and answer)."""
    policy = trainer.policy
    rows, _ = load_datasets(trainer.config, Path("."))
    prompts = [encode_prompt(policy.tokenizer, row["prompt"], trainer.config).tokens for row in rows]
    completions = [policy.tokenizer.encode(arithmetic.format_completion(row), add_special_tokens=False)
                   + [policy.tokenizer.eos_token_id] for row in rows]
    rollout = Rollout(prompts, completions, [[0.0] * len(c) for c in completions], [False] * len(rows), 0.0)
    batch = build_train_batch(rollout, pad_id=policy.pad_id)
    logp = completion_logprobs(policy.model, batch, 1.0, gradient=False).astype(mx.float32)
    return np.array((logp * batch.mask).sum(axis=1))


# Steps on four sums, 8 completions each, at a constant learning rate of 1e-3 (5e-3 collapsed the reward from
# 6.8 to -3 in ten steps in float32 and bf16 alike). The sampled reward of so short a run swings by +-1 a step
# (measured 7.4, 7.7, 8.2, 6.8), so the test reads what the run did to the policy: the log-probability of the
# right completions of the prompts it trained on, with the adapters (after) and without them (the base,
# before). Measured here (nats per completion, mean of the four): one step +0.31 (every prompt up), four steps
# +0.46; with the gradient broken -4.2 and -17.7.
LEARNING = {"learning_rate": 1e-3, "num_steps": 4, "batch_size": 4, "num_generations": 8, "num_iterations": 2,
            "train_size": 4, "seed": 0}
MIN_GAIN = 0.25  # after four steps
# the one-step case takes ~16 s on the 2-core machine, a four-step one ~55 s: MLX's CPU quantized matmul in bf16
# takes ~5x float32's time
SLOW = pytest.mark.slow


@pytest.mark.parametrize("steps, min_gain, broken", [
    (1, 0.0, False), pytest.param(1, 0.0, True, marks=SLOW),
    pytest.param(4, MIN_GAIN, False, marks=SLOW), pytest.param(4, MIN_GAIN, True, marks=SLOW)],
    ids=["one-step", "one-step-deliberately-broken-gradient", "four-steps", "four-steps-deliberately-broken-gradient"])
def test_a_bf16_lora_run_on_a_kept_4bit_base_learns(default_model_4bit, tmp_path, monkeypatch, steps, min_gain, broken):
    records, trainer = train_on_the_4bit_base(default_model_4bit, tmp_path, monkeypatch, broken,
                                              **{**LEARNING, "num_steps": steps})
    assert_the_mac_configuration(trainer.policy.model)
    after = right_answer_logprob(trainer)
    with adapters_disabled(trainer.policy.model):
        before = right_answer_logprob(trainer)
    gain = float(np.mean(after - before))
    reward = [r["rewards/total/mean"] for r in records]
    assert (gain > min_gain) != broken, (gain, before, after, reward)
