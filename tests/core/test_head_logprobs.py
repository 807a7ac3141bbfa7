"""The update's log-probs with their hand-written backward pass, and policy/entropy on a sample of positions:
the same numbers as the textbook formulation, at a fraction of its cost over a large vocabulary."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from tiny_models import random_model

from mlx_grpo import grpo
from mlx_grpo.head_scores import target_logprobs
from mlx_grpo.models.cpu_kernels import shifted_exp
from mlx_grpo.models.families import entropy_stride
from mlx_grpo.rollout import Rollout
from mlx_grpo.update import build_train_batch, completion_scores


def test_the_heads_exponential_matches_exp_to_a_rounding_step_and_keeps_its_edges():
    rng = np.random.default_rng(2)
    x = np.concatenate([-rng.exponential(scale=s, size=20_000) for s in (0.01, 1.0, 10.0, 40.0)]).astype(np.float32)
    edges = np.array([0.0, -1e-8, -0.5, -87.0, -88.0, -104.0, -1e30, -np.inf], dtype=np.float32)
    zero = mx.array(0.0)
    ours = np.array(shifted_exp(mx.array(np.concatenate([x, edges])), zero))
    exact = np.exp(np.concatenate([x, edges]).astype(np.float64))
    normal = exact >= np.finfo(np.float32).tiny
    assert np.all(np.abs(ours[normal] - exact[normal]) <= 2.5e-7 * exact[normal])
    assert np.all(ours[~normal] <= np.finfo(np.float32).tiny)  # underflow: zero, never garbage
    assert ours[-1] == 0.0 and ours[len(x)] == 1.0
    assert np.isnan(np.array(shifted_exp(mx.array([np.nan], dtype=mx.float32), zero)))[0]


def test_the_heads_exponential_subtracts_each_rows_own_shift():
    """The streamed head's exponentials of a block of logits less each row's maximum: exp of the same
    float32 differences, whatever the rows' scale (half-way cases of x / ln 2 included)."""
    rng = np.random.default_rng(3)
    logits = (rng.normal(size=(6, 700)) * np.array([[0.1], [1.0], [5.0], [30.0], [1e3], [1.0]])).astype(np.float32)
    logits[5, :40] = -np.log(2.0) * (np.arange(40) + 0.5)  # x / ln 2 at half-way points: n rounds to even
    top = logits.max(axis=-1, keepdims=True)
    ours = np.array(shifted_exp(mx.array(logits), mx.array(top)))
    exact = np.exp((logits - top).astype(np.float64))  # the float32 differences, exponentiated exactly
    normal = exact >= np.finfo(np.float32).tiny
    assert np.all(np.abs(ours[normal] - exact[normal]) <= 2.5e-7 * exact[normal])
    assert np.all(ours[~normal] <= np.finfo(np.float32).tiny)


def test_hand_written_backward_equals_autodiff_of_the_log_softmax():
    rng = np.random.default_rng(0)
    logits = mx.array(rng.normal(scale=4.0, size=(3, 5, 50)), dtype=mx.float32)
    logits = mx.concatenate([logits[:2], logits[2:] + 1000.0])  # a row of huge logits keeps its digits
    targets = mx.array(rng.integers(0, 50, size=(3, 5)), dtype=mx.int32)
    weights = mx.array(rng.normal(size=(3, 5)), dtype=mx.float32)

    def ours(z):
        return (target_logprobs(z, targets) * weights).sum()

    def textbook(z):
        return (grpo.token_logprobs(z, targets) * weights).sum()

    assert np.allclose(np.array(target_logprobs(logits, targets)), np.array(grpo.token_logprobs(logits, targets)),
                       atol=1e-5)
    assert np.allclose(np.array(mx.grad(ours)(logits)), np.array(mx.grad(textbook)(logits)), atol=1e-6)


def test_policy_entropy_is_measured_at_every_kth_position_at_most_32_per_completion():
    assert [entropy_stride(t) for t in (1, 24, 32, 33, 256, 1024)] == [1, 1, 1, 2, 8, 32]
    model = random_model("qwen2", 300)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(1, 300, size=5).tolist() for _ in range(2)]
    completions = [rng.integers(1, 300, size=40).tolist() for _ in range(2)]
    batch = build_train_batch(Rollout(prompts, completions, [[0.0] * 40] * 2, [False] * 2, 0.0), pad_id=0)
    every = completion_scores(model, batch, 0.9, entropy_stride=1)
    sampled = completion_scores(model, batch, 0.9, entropy_stride=entropy_stride(40))
    assert every.entropy.shape == (2, 40) and sampled.entropy.shape == (2, 20)
    assert np.allclose(np.array(sampled.entropy), np.array(every.entropy)[:, ::2], atol=1e-5)
    # the full-vocabulary entropy at the same positions, from the logits at temperature 0.9
    logits = model(batch.inputs).astype(mx.float32) / 0.9
    full = grpo.token_entropy(mx.take_along_axis(logits, batch.positions[:, :, None], axis=1))
    assert np.allclose(np.array(every.entropy), np.array(full), atol=1e-4)
    assert np.allclose(np.array(every.logp), np.array(grpo.token_logprobs(
        mx.take_along_axis(logits, batch.positions[:, :, None], axis=1),
        mx.take_along_axis(batch.targets, batch.positions, axis=1))), atol=1e-4)


@pytest.mark.parametrize("quantized", [False, True])
def test_streamed_head_equals_the_whole_logits_forward_and_backward(monkeypatch, quantized):
    """The frozen head's log-probs a block of the vocabulary at a time (the default under LoRA and in the
    reference pass): the same log-probs, entropy and gradient as the whole [N, T, V] logits give."""
    from mlx_grpo import head_scores
    from mlx_grpo.models import families

    monkeypatch.setattr(families, "STREAM_LOGITS", 21 * 300)  # 7 blocks of at most 300 rows: the running rescale
    monkeypatch.setattr(families, "MIN_VOCAB_BLOCK", 300)
    mx.random.seed(0)
    head = nn.Linear(64, 2000, bias=False)
    if quantized:
        head = nn.QuantizedLinear.from_linear(head, 64, 4)
    head.freeze()
    assert head_scores.streams_head(head)
    weight = head_scores._head_rows(head, slice(0, 2000))
    hidden = mx.random.normal((3, 7, 64)) * 3
    targets = mx.random.randint(0, 2000, (3, 7))
    cotangent = mx.random.normal((3, 7))

    def whole(h):
        return target_logprobs((h @ weight.T).astype(mx.float32), targets)

    def streamed(h):
        return head_scores.streamed_head_scores(h, targets, head)[0]

    logp, entropy = head_scores.streamed_head_scores(hidden, targets, head)
    np.testing.assert_allclose(np.array(logp), np.array(whole(hidden)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.array(entropy), np.array(grpo.token_entropy((hidden @ weight.T).astype(mx.float32))),
                               rtol=1e-5, atol=1e-4)
    reference, _ = head_scores.streamed_head_scores(hidden, targets, head, gradient=False)
    np.testing.assert_allclose(np.array(reference), np.array(logp), rtol=1e-6, atol=1e-6)
    expected = mx.grad(lambda h: (whole(h) * cotangent).sum())(hidden)
    got = mx.grad(lambda h: (streamed(h) * cotangent).sum())(hidden)
    np.testing.assert_allclose(np.array(got), np.array(expected), rtol=1e-4, atol=1e-5)
    # a trained head (full fine-tuning) keeps the whole-logits path, which also gives its weight's gradient
    head.unfreeze()
    assert not head_scores.streams_head(head)
