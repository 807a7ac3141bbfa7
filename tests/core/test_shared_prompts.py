"""The G completions of a prompt share one pass over it in the reference pass and the update: the log-probs
and the weights' update are the whole-sequence pass's, for every head layout, with LoRA, and with micro-batches
that cut a group in two."""

from __future__ import annotations

from dataclasses import replace

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
import pytest
from mlx.utils import tree_flatten
from tiny_models import grouped_rollout, random_model

from mlx_grpo.config.train_config import load_config
from mlx_grpo.models.policy import apply_adapters
from mlx_grpo.rollout import Rollout
from mlx_grpo.update import (
    build_train_batch,
    checkpoint_blocks,
    completion_logprobs,
    make_loss_fn,
    shares_prompts,
    update_policy,
)

VOCAB = 300


def prompts_in_groups(num_prompts: int = 3, group_size: int = 4, seed: int = 0) -> Rollout:
    """Prompts of 2-9 tokens (so the shared pass left-pads them), each with `group_size` completions of
    1-12 tokens; the first completion of the first group is empty."""
    rollout = grouped_rollout(np.random.default_rng(seed), num_prompts, group_size, ids=(1, VOCAB),
                              prompt_lengths=(2, 10), completion_lengths=(1, 13))
    rollout.completions[0], rollout.logprobs[0] = [], []
    return rollout


def unshared(batch):
    """The same batch scored row by row over whole sequences (what every batch did before)."""
    return replace(batch, prompts=[])


def test_a_batch_knows_which_rows_share_a_prompt():
    batch = build_train_batch(prompts_in_groups(), pad_id=0)
    assert batch.prompt_of_row.tolist() == [0] * 4 + [1] * 4 + [2] * 4 and len(batch.prompts) == 3
    part = batch.rows(6, 11)
    assert part.prompt_of_row.tolist() == [0, 0, 1, 1, 1] and part.prompts == batch.prompts[1:3]


# gemma3 with sliding windows longer than every test sequence (21 positions at most): its caches are then plain
WIDE_WINDOW = {"sliding_window": 32}


# its own LM head; the head is the embedding; sliding windows that cover the sequences
@pytest.mark.parametrize("model_type,shape", [("llama", {}), ("qwen2", {}), ("gemma3_text", WIDE_WINDOW)])
def test_shared_prompt_log_probs_equal_whole_sequence_ones(model_type, shape):
    model = random_model(model_type, VOCAB, **shape)
    batch = build_train_batch(prompts_in_groups(), pad_id=0)
    assert shares_prompts(model, batch) and not shares_prompts(model, unshared(batch))
    mask = np.array(batch.mask)
    shared = np.array(completion_logprobs(model, batch, 0.9)) * mask
    whole = np.array(completion_logprobs(model, unshared(batch), 0.9)) * mask
    np.testing.assert_allclose(shared, whole, rtol=1e-5, atol=1e-5)
    chunked = np.array(completion_logprobs(model, batch, 0.9, chunk_size=5)) * mask
    np.testing.assert_allclose(chunked, whole, rtol=1e-5, atol=1e-5)


def weight_moves(model_type: str, batch, overrides: dict, use_lora: bool = False,
                 shape: dict | None = None) -> dict[str, np.ndarray]:
    """How far one two-iteration update moves each trainable weight (plain SGD: -lr x gradient)."""
    config = load_config(None, {"beta": 0.04, "num_iterations": 2, "max_grad_norm": 0.0, "temperature": 0.9,
                                "use_lora": use_lora, "lora_rank": 4, "loss_type": "dapo", **overrides})
    model = random_model(model_type, VOCAB, **(shape or {}))
    if use_lora:
        model.freeze()
        apply_adapters(model, config)
    if config.grad_checkpoint:
        checkpoint_blocks(model)
    reference = random_model(model_type, VOCAB, seed=1, **(shape or {}))
    ref_logp = mx.stop_gradient(completion_logprobs(reference, unshared(batch), config.temperature))
    advantages = mx.array(np.random.default_rng(3).normal(size=batch.num_sequences), dtype=mx.float32)
    before = {k: np.array(v) for k, v in tree_flatten(model.trainable_parameters())}
    update_policy(model, optim.SGD(learning_rate=0.5), nn.value_and_grad(model, make_loss_fn(config)), batch,
                  advantages, ref_logp, config)
    return {k: np.array(v) - before[k] for k, v in tree_flatten(model.trainable_parameters())}


@pytest.mark.parametrize("model_type,use_lora,overrides", [
    ("llama", False, {}),
    ("qwen2", False, {"micro_batch_size": 3, "logits_chunk_size": 5}),  # micro-batches cut groups in two
    ("llama", True, {"micro_batch_size": 5}),
    ("gemma3_text", True, {"micro_batch_size": 5}),  # with WIDE_WINDOW
])
def test_a_shared_prompt_update_equals_the_whole_sequence_update(model_type, use_lora, overrides):
    batch = build_train_batch(prompts_in_groups(), pad_id=0)
    shape = WIDE_WINDOW if model_type == "gemma3_text" else {}
    whole = weight_moves(model_type, unshared(batch), {}, use_lora, shape)
    shared = weight_moves(model_type, batch, overrides, use_lora, shape)
    scale = max(np.abs(v).max() for v in whole.values())
    assert scale > 1e-4  # the update really moved the weights
    # gemma3's steps differ by up to 1.5e-5 of the largest (its scaled embedding and four norms per block round
    # differently over left-padded prompts), as in test_update_memory; a wrong pass moves them by a tenth or more
    atol = (5e-5 if model_type == "gemma3_text" else 1e-5) * scale
    for name, delta in whole.items():
        np.testing.assert_allclose(shared[name], delta, rtol=1e-4, atol=atol, err_msg=name)


def test_models_and_batches_that_cannot_share_a_prompt_pass_use_whole_sequences():
    batch = build_train_batch(prompts_in_groups(), pad_id=0)
    # sliding windows (6 positions) shorter than the batch's sequences: a plain cache would keep keys they drop
    assert not shares_prompts(random_model("gemma3_text", VOCAB), batch)
    checkpointed = random_model("llama", VOCAB)
    checkpoint_blocks(checkpointed)
    assert not shares_prompts(checkpointed, batch)  # mx.checkpoint takes arrays, not caches
    distinct = build_train_batch(prompts_in_groups(num_prompts=6, group_size=1), pad_id=0)
    assert not shares_prompts(random_model("llama", VOCAB), distinct)  # nothing to share


def graph_primitives(*arrays: mx.array) -> set[str]:
    """The names of the primitives that compute `arrays` (MLX's own graph export)."""
    import re
    import tempfile

    with tempfile.NamedTemporaryFile("w+", suffix=".dot") as dot:
        mx.export_to_dot(dot.name, *arrays)
        return set(re.findall(r'label ="([^"]+)"', dot.read()))


@pytest.mark.parametrize("micro_batch", [0, 6])  # whole groups; a micro-batch that cuts a group (3 + 3 rows)
def test_the_shared_prompt_backward_sums_the_group_without_a_scatter_add(micro_batch):
    """Copying a prompt's keys and values to its G rows by gather makes the backward a scatter-add, which
    Metal runs with atomic adds in scheduling order (resume would not equal the uninterrupted run bit for
    bit there); the copy is a broadcast, whose backward is a reduction."""
    model = random_model("llama", VOCAB)
    config = replace(load_config(), use_lora=True, lora_rank=4, lora_layers=-1)
    apply_adapters(model, config)
    batch = build_train_batch(prompts_in_groups(), pad_id=0)
    rows, micro = next(iter(batch.micro_batches(micro_batch)))
    assert shares_prompts(model, micro)

    def loss(params):
        model.update(params)
        return (completion_logprobs(model, micro, 1.0) * micro.mask).sum()

    grads = mx.grad(loss)(model.trainable_parameters())
    names = graph_primitives(*[g for _, g in tree_flatten(grads)])
    # ("ScatterAxis" is take_along_axis's backward: one index per row, no two adds meet)
    assert not [n for n in names if n.startswith("Scatter ")], sorted(names)
