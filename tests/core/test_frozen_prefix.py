"""Frozen-prefix reuse (mlx_grpo/frozen_prefix.py): the rollout keeps the output of the blocks below the first
adapted one, and the reference pass and the update start there.

Numerics. The kept states come from the rollout's incremental computation (a left-padded batched prefill,
then one position per decode step over a KV cache); a full forward computes every position at once. The
arithmetic is the same, so the two differ by float rounding only: on these models (hidden 64-128, fp32)
max |delta log p| is 0 to 6e-6; the tolerance below is 1e-4 in float32 and 0.05 in bfloat16. A capture
from the wrong positions or the wrong layer moves log-probs by ~1 or more (checked below, so the
comparison can fail).
"""

from __future__ import annotations

from dataclasses import replace

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_unflatten
from tiny_models import random_model

from mlx_grpo import frozen_prefix
from mlx_grpo.config.train_config import TrainConfig
from mlx_grpo.frozen_prefix import Captured
from mlx_grpo.models.policy import apply_adapters, make_reference
from mlx_grpo.rollout import generate
from mlx_grpo.sampling import SamplingSettings
from mlx_grpo.update import (
    build_train_batch,
    checkpoint_blocks,
    completion_logprobs,
    make_loss_fn,
    reference_logprobs,
    update_policy,
)

FAMILIES = ["llama", "qwen2", "gemma3_text", "qwen3_moe"]
TOLERANCE = {mx.float32: 1e-4, mx.bfloat16: 5e-2}
PROMPTS = [[1, 5, 9, 22, 40], [3, 4, 7], [8, 8, 8, 8, 8, 2, 17]]
SAME_LENGTHS = [[1, 5, 9, 22, 40], [3, 4, 7], [8, 8, 8, 2, 17]]  # a merged-cache model prefills 0 and 2 together


def adapted(model_type: str, layers: int = 4, lora_layers: int = 2, hidden: int = 64, dtype=mx.float32):
    model = random_model(model_type, layers=layers, hidden=hidden)
    model.set_dtype(dtype)
    apply_adapters(model, TrainConfig(use_lora=True, lora_layers=lora_layers))
    # adapters start at zero (lora_b = 0): give them weight, so the policy differs from the base model
    for _, m in model.named_modules():
        if hasattr(m, "lora_b"):
            m.lora_b = mx.random.normal(m.lora_b.shape, key=mx.random.key(1)) * 0.05
    return model


def rollout_of(model, group_size: int = 3, max_tokens: int = 9, prompts=PROMPTS):
    return generate(model, prompts, group_size, max_tokens, set(), 0, SamplingSettings(), mx.random.key(0),
                    capture=True)


def full_forward_states(model, tokens: list[int]) -> mx.array:
    """The last frozen block's output at every position of a whole-sequence forward, [len, H]."""
    with frozen_prefix.recording(model) as recorded:
        model(mx.array([tokens]))
    return recorded[0][0]


def test_install_finds_the_first_adapted_block_and_keeps_every_weight_name():
    model = adapted("qwen2", layers=5, lora_layers=2)
    names = [name for name, _ in tree_flatten(model.parameters())]
    assert frozen_prefix.install(model) is None
    assert frozen_prefix.first_block(model) == 3
    assert [name for name, _ in tree_flatten(model.parameters())] == names  # checkpoints and adapters unchanged
    every = adapted("qwen2", layers=3, lora_layers=3)
    assert frozen_prefix.install(every) is None and frozen_prefix.first_block(every) == 0  # nothing frozen below


@pytest.mark.parametrize("prompts", [PROMPTS, SAME_LENGTHS], ids=["lengths-differ", "two-of-one-length"])
@pytest.mark.parametrize("model_type", ["qwen2", "gemma3_text"])  # batched left-padded prefill; merged caches
def test_the_rollout_keeps_the_frozen_blocks_output_at_every_position_it_fed(model_type, prompts):
    model = adapted(model_type)
    frozen_prefix.install(model)
    rollout = rollout_of(model, prompts=prompts)
    for row in (0, 4, 8):
        prompt, completion = rollout.prompts[row], rollout.completions[row]
        expected = full_forward_states(model, prompt + completion[:-1])
        kept = mx.concatenate([rollout.prefix.prompt[row], rollout.prefix.completion[row][:len(completion) - 1]])
        assert kept.shape == expected.shape
        assert mx.abs(kept - expected).max().item() < 1e-4
    assert rollout.prefix.nbytes() == (sum(map(len, prompts)) + 9 * 8) * 64 * 4  # each prompt once, 8 fed steps


def test_a_rollout_without_capture_keeps_nothing():
    model = adapted("qwen2")
    frozen_prefix.install(model)
    assert generate(model, PROMPTS, 2, 4, set(), 0, SamplingSettings(), mx.random.key(0)).prefix is None


def scores(model, batch, micro: int = 0) -> mx.array:
    parts = []
    for _, part in batch.micro_batches(micro):
        logp = completion_logprobs(model, part, 1.0)
        parts.append(mx.pad(logp, [(0, 0), (0, batch.mask.shape[1] - logp.shape[1])]))
    return mx.concatenate(parts)


def max_difference(a, b, mask) -> float:
    return mx.where(mask > 0, mx.abs(a - b), 0.0).max().item()


@pytest.mark.parametrize("model_type", FAMILIES)
def test_the_forward_started_at_the_first_adapted_block_gives_the_full_forwards_log_probs(model_type):
    """Micro-batches of 4 rows: a group cut in two, prompts re-padded to each micro-batch's longest."""
    model = adapted(model_type)
    assert frozen_prefix.install(model) is None
    batch = build_train_batch(rollout_of(model), 0)
    full = scores(model, replace(batch, prefix=None), 4)
    assert max_difference(scores(model, batch, 4), full, batch.mask) < TOLERANCE[mx.float32]


def test_states_from_the_wrong_positions_or_layer_are_caught():
    model = adapted("qwen2")
    frozen_prefix.install(model)
    rollout = rollout_of(model)
    batch = build_train_batch(rollout, 0)
    micro = 0
    full = scores(model, replace(batch, prefix=None), micro)
    assert max_difference(scores(model, batch, micro), full, batch.mask) < TOLERANCE[mx.float32]
    # the comparison can fail: states from the wrong positions (one step late), or from the wrong layer
    # (the embedding, block 0's input)
    late = Captured(batch.prefix.prompt, [mx.concatenate([c[1:], c[-1:]]) for c in batch.prefix.completion])
    assert max_difference(scores(model, replace(batch, prefix=late), micro), full, batch.mask) > 0.1
    embedded = Captured([model.model.embed_tokens(mx.array(p)) for p in rollout.prompts], batch.prefix.completion)
    assert max_difference(scores(model, replace(batch, prefix=embedded), micro), full, batch.mask) > 0.1


@pytest.mark.parametrize("micro", [0, 4])
@pytest.mark.parametrize("whole_sequences", [False, True])
def test_a_batch_without_kept_states_gets_them_from_the_reference_pass(micro, whole_sequences):
    """A multi-turn rollout keeps no states (tool results enter its cache between turns): the reference pass
    (the policy with its adapters off: the same frozen blocks) keeps its own, and the update passes that
    start from them give the full forward's log-probs. The kept states equal the rollout's. Whole
    sequences: block recompute scores every row's sequence instead of sharing its prompt."""
    model = adapted("llama")
    frozen_prefix.install(model)
    if whole_sequences:
        checkpoint_blocks(model)
    batch = build_train_batch(rollout_of(model), 0)
    config = TrainConfig(use_lora=True, lora_layers=2, beta=0.04, micro_batch_size=micro)
    reference = make_reference(model, config)
    without = replace(batch, prefix=None)
    ref_logp = reference_logprobs(reference, without, config)
    with reference.active() as ref_model:
        assert max_difference(ref_logp, scores(ref_model, replace(batch, prefix=None), micro), batch.mask) < 1e-4
    for mine, kept in zip(without.prefix.prompt + without.prefix.completion,
                          batch.prefix.prompt + batch.prefix.completion, strict=True):
        assert mine.shape == kept.shape and mx.abs(mine - kept).max().item() < 1e-4
    full = scores(model, replace(batch, prefix=None), micro)
    assert max_difference(scores(model, without, micro), full, batch.mask) < TOLERANCE[mx.float32]
    kept_before = batch.prefix
    reference_logprobs(reference, batch, config)
    assert batch.prefix is kept_before  # the rollout's states are used as they are


def test_whole_sequences_start_at_the_first_adapted_block_too():
    """Block recompute (grad_checkpoint) scores whole right-padded sequences instead of sharing prompts."""
    model = adapted("llama")
    checkpoint_blocks(model)
    assert frozen_prefix.install(model) is None
    batch = build_train_batch(rollout_of(model), 0)
    full = scores(model, replace(batch, prefix=None))
    assert max_difference(scores(model, batch), full, batch.mask) < TOLERANCE[mx.float32]


def test_bfloat16_log_probs_agree_within_rounding():
    model = adapted("qwen2", dtype=mx.bfloat16)
    assert frozen_prefix.install(model) is None
    batch = build_train_batch(rollout_of(model), 0)
    full = scores(model, replace(batch, prefix=None))
    assert max_difference(scores(model, batch), full, batch.mask) < TOLERANCE[mx.bfloat16]


def one_update(model, batch, config) -> tuple[float, dict, dict[str, np.ndarray]]:
    before = {k: np.array(v) for k, v in tree_flatten(model.trainable_parameters())}
    # SGD at 1.0: each move is the gradient itself, far above the weights' float32 spacing. Adam divides
    # every entry by its own size, so an entry near its epsilon (1e-8) would turn a rounding difference of
    # 1e-10 between the two forwards into 1% of a step.
    optimizer = optim.SGD(learning_rate=1.0)
    advantages = mx.array(np.linspace(-1, 1, batch.num_sequences), dtype=mx.float32)
    ref = mx.zeros(batch.mask.shape)
    result = update_policy(model, optimizer, nn.value_and_grad(model, make_loss_fn(config)), batch, advantages, ref,
                           config)
    moves = {k: np.array(v) - before[k] for k, v in tree_flatten(model.trainable_parameters())}
    model.update(tree_unflatten([(k, mx.array(v)) for k, v in before.items()]))  # the next update starts alike
    return result.loss, result.stats, moves


def test_the_update_from_kept_states_moves_the_adapters_as_the_full_forward_does():
    model = adapted("qwen2")
    frozen_prefix.install(model)
    config = TrainConfig(use_lora=True, lora_layers=2, beta=0.04, num_iterations=2, max_generation_steps=9,
                         micro_batch_size=4)
    batch = build_train_batch(rollout_of(model), 0)
    loss, stats, moves = one_update(model, batch, config)
    full_loss, full_stats, full_moves = one_update(model, replace(batch, prefix=None), config)
    # the KL against a zero reference is ~260 nats, summed in the BLAS's own order: compared relatively
    assert abs(loss - full_loss) < 1e-5
    assert abs(stats["kl"] - full_stats["kl"]) < 1e-6 * max(1.0, abs(full_stats["kl"]))
    for name, move in moves.items():
        largest = np.abs(full_moves[name]).max()
        assert np.abs(move).max() > 0
        np.testing.assert_allclose(move, full_moves[name], atol=1e-4 * largest)


def test_a_model_whose_forward_is_not_blocks_in_a_row_keeps_the_full_forward(monkeypatch):
    """A family that feeds its blocks something besides the running state (here: the first block's output
    again after the second) cannot start at a block with the state alone: install says so and changes
    nothing."""
    model = adapted("llama")
    inner = type(model.model)

    def forward(self, inputs, cache=None, input_embeddings=None):
        h = self.embed_tokens(inputs)
        for i, layer in enumerate(self.layers):
            h = layer(h if i < 2 else h + 0.5 * first, "causal", None)
            first = h if i == 0 else first
        return self.norm(h)

    monkeypatch.setattr(inner, "__call__", forward)
    note = frozen_prefix.install(model)
    assert note is not None and "could not start at block 2" in note and "run every block" in note
    assert frozen_prefix.first_block(model) == 0
    assert not any(getattr(block, "prefix_tapped", False) for block in model.layers)


def test_a_training_step_on_the_shipped_model_gives_the_same_loss_and_kl_with_and_without_reuse():
    """The trainer as `mlx-grpo train` builds it (LoRA on the last 2 of the shipped model's 4 blocks): reuse is
    on by default, its rollout keeps the states, and the step's loss, KL and gradient norm are the full
    forward's. (A probe on token ids beyond the shipped 20-token vocabulary once turned it off silently.)"""
    from pathlib import Path

    from mlx_grpo.measuring.selftest import small_config
    from mlx_grpo.trainer import Trainer

    results = {}
    for reuse in (True, False):
        trainer = Trainer.build(small_config(use_lora=True, lora_layers=2, frozen_prefix_reuse=reuse, num_steps=2),
                                Path.cwd())
        assert trainer.prefix_note is None
        assert frozen_prefix.first_block(trainer.policy.model) == (2 if reuse else 0)
        results[reuse] = [trainer.step(step).update for step in (1, 2)]
    for on, off in zip(results[True], results[False]):
        assert on.loss == pytest.approx(off.loss, abs=1e-5)
        assert on.stats["kl"] == pytest.approx(off.stats["kl"], abs=1e-6)
        assert on.grad_norm == pytest.approx(off.grad_norm, rel=1e-4)
