"""The memory-lean update: micro-batches, chunked LM head and checkpointed blocks change the memory an
update needs, never its result."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
import pytest
from mlx.utils import tree_flatten
from tiny_models import random_model

from mlx_grpo.config.train_config import load_config
from mlx_grpo.models.policy import apply_adapters
from mlx_grpo.rollout import Rollout
from mlx_grpo.update import (
    build_train_batch,
    checkpoint_blocks,
    completion_logprobs,
    make_loss_fn,
    reference_logprobs,
    update_policy,
)


def random_rollout(n: int, vocab: int, max_completion: int, seed: int = 0) -> Rollout:
    """n completions of very different lengths (1..max_completion) after prompts of 3-8 tokens."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(1, vocab, size=int(rng.integers(3, 9))).tolist() for _ in range(n)]
    completions = [rng.integers(1, vocab, size=int(rng.integers(1, max_completion + 1))).tolist() for _ in range(n)]
    return Rollout(prompts, completions, [[0.0] * len(c) for c in completions], [False] * n, 0.0)


class Reference:
    """A frozen copy of the starting weights, as make_reference gives for full fine-tuning."""

    uses_adapters_off = False

    def __init__(self, model):
        self.model = model

    def active(self):
        import contextlib
        return contextlib.nullcontext(self.model)


def run_update(model_type: str, overrides: dict, use_lora: bool = False, vocab: int = 300):
    config = load_config(None, {"beta": 0.04, "num_iterations": 2, "max_grad_norm": 0.0, "temperature": 0.9,
                                "max_generation_steps": 12, "use_lora": use_lora, "lora_rank": 4, **overrides})
    model = random_model(model_type, vocab)
    reference = Reference(random_model(model_type, vocab, seed=1))
    if use_lora:
        model.freeze()
        apply_adapters(model, config)
    if config.grad_checkpoint:
        checkpoint_blocks(model)
    rollout = random_rollout(10, vocab, 12)
    batch = build_train_batch(rollout, pad_id=0)
    advantages = mx.array(np.random.default_rng(3).normal(size=10), dtype=mx.float32)
    ref_logp = reference_logprobs(reference, batch, config)
    before = {k: np.array(v) for k, v in tree_flatten(model.trainable_parameters())}
    # plain SGD: the weights move by exactly -lr * gradient, so comparing them compares the gradients
    result = update_policy(model, optim.SGD(learning_rate=0.5), nn.value_and_grad(model, make_loss_fn(config)),
                           batch, advantages, ref_logp, config)
    moved = {k: np.array(v) - before[k] for k, v in tree_flatten(model.trainable_parameters())}
    return result, moved, np.array(ref_logp * batch.mask)  # padding positions hold no log-prob


LEAN = {"micro_batch_size": 3, "logits_chunk_size": 5, "grad_checkpoint": True}


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_micro_batched_gradients_equal_the_whole_batch_gradient(loss_type, level):
    settings = {"loss_type": loss_type, "importance_sampling_level": level}
    whole, whole_moved, whole_ref = run_update("qwen2", settings)
    lean, lean_moved, lean_ref = run_update("qwen2", {**settings, **LEAN})
    np.testing.assert_allclose(lean_ref, whole_ref, rtol=1e-5, atol=1e-6)
    assert lean.loss == pytest.approx(whole.loss, rel=1e-5, abs=1e-6)  # abs: the loss is a sum of terms of size ~1 that nearly cancel
    assert lean.grad_norm == pytest.approx(whole.grad_norm, rel=1e-5)
    assert lean.stats.keys() == whole.stats.keys()
    for name, value in whole.stats.items():
        assert lean.stats[name] == pytest.approx(value, rel=1e-5, abs=1e-6)  # abs: the loss is a sum of terms of size ~1 that nearly cancel, name
    scale = max(np.abs(v).max() for v in whole_moved.values())
    assert scale > 1e-4  # the update really moved the weights
    for name, delta in whole_moved.items():
        np.testing.assert_allclose(lean_moved[name], delta, rtol=1e-5, atol=1e-5 * scale, err_msg=name)


@pytest.mark.parametrize("model_type,use_lora", [("llama", False), ("llama", True), ("gemma3_text", False),
                                                  ("gemma2", False)])
def test_every_head_layout_and_lora_give_the_same_update_in_parts(model_type, use_lora):
    whole, whole_moved, _ = run_update(model_type, {"loss_type": "dapo"}, use_lora=use_lora)
    lean, lean_moved, _ = run_update(model_type, {"loss_type": "dapo", **LEAN}, use_lora=use_lora)
    assert lean.loss == pytest.approx(whole.loss, rel=1e-5, abs=1e-6)  # abs: the loss is a sum of terms of size ~1 that nearly cancel
    scale = max(np.abs(v).max() for v in whole_moved.values())
    for name, delta in whole_moved.items():
        # atol 5e-5 of the largest step: on OpenBLAS gemma3's scaled, tied embedding rows differed by 2e-5 of it
        # (sums in another order); a wrong micro-batch weighting moves steps by a tenth or more
        np.testing.assert_allclose(lean_moved[name], delta, rtol=1e-5, atol=5e-5 * scale, err_msg=name)


def test_chunked_head_log_probs_equal_the_plain_ones():
    model = random_model("llama", vocab=500)
    batch = build_train_batch(random_rollout(4, 500, 20), pad_id=0)
    plain = completion_logprobs(model, batch, 1.0)
    np.testing.assert_allclose(np.array(completion_logprobs(model, batch, 1.0, chunk_size=7)), np.array(plain),
                               rtol=1e-6, atol=1e-6)


def peak_update_bytes(overrides: dict) -> int:
    """Peak memory above the weights of one LoRA update of 8 completions of 96 tokens over a 16k
    vocabulary (fp32): the shape of a real run, scaled down."""
    vocab = 16384
    config = load_config(None, {"beta": 0.0, "max_generation_steps": 96, "use_lora": True, **overrides})
    model = random_model("llama", vocab=vocab, hidden=64)
    model.freeze()
    apply_adapters(model, config)
    if config.grad_checkpoint:
        checkpoint_blocks(model)
    rng = np.random.default_rng(0)
    rollout = Rollout([rng.integers(1, vocab, 8).tolist()] * 8, [rng.integers(1, vocab, 96).tolist()] * 8,
                      [[0.0] * 96] * 8, [False] * 8, 0.0)
    batch = build_train_batch(rollout, pad_id=0)
    loss_and_grad = nn.value_and_grad(model, make_loss_fn(config))
    mx.eval(batch.inputs, batch.mask)
    # Arrays that earlier tests left in reference cycles would be freed by a garbage collection during the
    # update, taking their bytes off the measured peak (a 40 MB cycle took the one-at-a-time peak from
    # 33.0 to 20.6 MB): collect them before the baseline is read.
    gc.collect()
    mx.clear_cache()
    mx.reset_peak_memory()
    weights = mx.get_active_memory()
    update_policy(model, optim.SGD(learning_rate=0.1), loss_and_grad, batch, mx.ones(8), None, config)
    return mx.get_peak_memory() - weights


def test_micro_batches_and_head_chunks_cut_the_update_peak_to_a_fraction():
    logits_bytes = 8 * 96 * 16384 * 4  # the whole batch's fp32 logits, 50 MB
    whole = peak_update_bytes({})
    # the streamed head (the default under LoRA): the batch's logits never exist, not even once (measured
    # 48 MB: a few blocks of ~1M logits at a time, the block, its exponentials and the CPU polynomial's
    # intermediates (36 MB with mx.exp); 229 MB, 4.5 copies of them, when the head built them whole)
    assert whole < logits_bytes
    one_at_a_time = peak_update_bytes({"micro_batch_size": 1})
    # 8 completions, one at a time (measured 33 MB; 14.4 MB with mx.exp: at this small shape the streamed
    # head's few blocks of ~1M logits, a constant, weigh more than the 8x fewer positions save)
    assert one_at_a_time < 0.75 * whole
    chunked = peak_update_bytes({"micro_batch_size": 1, "logits_chunk_size": 16})
    assert chunked < one_at_a_time  # 16 of 96 positions at a time (measured 11.1 MB)


def test_a_micro_batched_default_run_ends_with_the_same_weights(tmp_path):
    """5 steps of the default run (full fine-tuning of the shipped model, KL on), 4 prompts x 8 a step (20 rows:
    each prompt once, without building the default 20,000)."""
    from mlx_grpo.run.loop import train

    def final_weights(name, **overrides):
        config = load_config(None, {"num_steps": 5, "eval_every": 0, "checkpoint_every": 0, "tensorboard": False,
                                    "batch_size": 4, "train_size": 20, "monitoring_dir": str(tmp_path / "runs"),
                                    "run_name": name,
                                    **overrides})
        run_dir = Path(train(config, tmp_path)["run_dir"])
        return mx.load(str(run_dir / "checkpoints" / "step_5" / "model.safetensors")), run_dir

    whole, whole_dir = final_weights("whole")
    lean, lean_dir = final_weights("lean", micro_batch_size=6, logits_chunk_size=7, grad_checkpoint=True)
    for name, value in whole.items():
        np.testing.assert_allclose(np.array(lean[name]), np.array(value), rtol=1e-4, atol=1e-6, err_msg=name)
    records = [json.loads(line) for line in (lean_dir / "metrics.jsonl").read_text().splitlines()]
    expected = [json.loads(line) for line in (whole_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["rewards/total/mean"] for r in records] == pytest.approx([r["rewards/total/mean"] for r in expected])


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "gemma3_text", "qwen3_moe", "gemma2"])
def test_a_family_runs_its_head_at_chosen_positions_exactly_when_its_logits_are_that_heads(model_type):
    """has_plain_head says the logits are the LM head (or tied embedding) of the backbone's output, so the
    update may run it at the completion positions only: true of gemma3's tied embedding (its embedding's
    scale is on the way in), not of gemma2's soft-capped logits."""
    from mlx_grpo.models.policy import has_plain_head, lm_head, project_to_vocab

    model = random_model(model_type)
    tokens = mx.array([[5, 9, 2, 7, 11, 3, 8]])
    own = np.array(model(tokens))
    through_head = np.array(project_to_vocab(lm_head(model), model.model(tokens)))
    assert has_plain_head(model) == np.allclose(own, through_head, rtol=1e-5, atol=1e-5)


def test_a_gemma3_update_never_builds_the_prompts_logits():
    """gemma-3-270m's recipe scores 1-4 answer tokens after ~40 prompt tokens over a 262k vocabulary: the
    update's log-probs (LoRA: the streamed head) come from the completion positions alone, equal to the
    model's own logits there, and its peak stays under the whole sequences' logits (measured: 40-44 MB
    against their 90 MB; the model's own head over every position peaked at 127 MB here, and at 0.66 GB
    above the weights on the real model). Every row its own prompt, so no prompt pass is shared."""
    from mlx_grpo.models.policy import apply_adapters

    vocab, rows, prompt, completion = 65536, 8, 40, 4
    config = load_config(None, {"beta": 0.0, "max_generation_steps": completion, "use_lora": True,
                                "lora_layers": 1})
    model = random_model("gemma3_text", vocab=vocab, sliding_window=512)
    model.freeze()
    apply_adapters(model, config)
    rng = np.random.default_rng(0)
    rollout = Rollout([rng.integers(1, vocab, prompt).tolist() for _ in range(rows)],
                      [rng.integers(1, vocab, completion).tolist() for _ in range(rows)],
                      [[0.0] * completion] * rows, [False] * rows, 0.0)
    batch = build_train_batch(rollout, pad_id=0)
    own = nn.log_softmax(model(batch.inputs).astype(mx.float32), axis=-1)
    expected = mx.take_along_axis(mx.take_along_axis(own, batch.positions[:, :, None], axis=1),
                                  mx.take_along_axis(batch.targets, batch.positions, axis=1)[:, :, None], axis=2)
    np.testing.assert_allclose(np.array(completion_logprobs(model, batch, 1.0)), np.array(expected[..., 0]),
                               rtol=1e-5, atol=1e-5)
    del own, expected
    loss_and_grad = nn.value_and_grad(model, make_loss_fn(config))
    gc.collect()
    mx.clear_cache()
    mx.reset_peak_memory()
    weights = mx.get_active_memory()
    update_policy(model, optim.SGD(learning_rate=0.1), loss_and_grad, batch, mx.array(rng.normal(size=rows)),
                  None, config)
    whole_sequence_logits = rows * (prompt + completion - 1) * vocab * 4
    assert mx.get_peak_memory() - weights < whole_sequence_logits
