"""models/cpu_kernels.py: the CPU's attention and gated activation give mlx-lm's results and gradients."""

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models import activations, base, llama
from tiny_models import random_model

from mlx_grpo.models import cpu_kernels
from mlx_grpo.models.cpu_kernels import attention, swiglu


def _qkv(batch, query_heads, kv_heads, length, width, depth=16):
    keys = mx.random.normal((batch, kv_heads, width, depth), key=mx.random.key(1))
    values = mx.random.normal((batch, kv_heads, width, depth), key=mx.random.key(2))
    queries = mx.random.normal((batch, query_heads, length, depth), key=mx.random.key(3)) * 2
    return queries, keys, values


def _masks(batch, query_heads, length, width):
    padding = mx.arange(width)[None, None, None, :] >= mx.array([0, 5, 9])[:batch, None, None, None]
    causal = mx.arange(length)[:, None] + (width - length) >= mx.arange(width)[None]
    per_head = mx.random.uniform(shape=(batch, query_heads, length, width), key=mx.random.key(4)) > 0.3
    return {"none": None, "causal": "causal", "padding and causal": padding & causal,
            "additive": mx.where(padding & causal, 0.0, -1e9), "per head": per_head | causal}


@pytest.mark.parametrize("query_heads, kv_heads", [(6, 2), (4, 4)])
@pytest.mark.parametrize("mask_name", ["none", "causal", "padding and causal", "additive", "per head"])
@pytest.mark.parametrize("block", [1 << 20, 1500, 64])  # every pair at once, two pairs a block, a few query rows
def test_many_position_attention_matches_mlx_forward_and_backward(monkeypatch, query_heads, kv_heads,
                                                                  mask_name, block):
    monkeypatch.setattr(cpu_kernels, "ATTENTION_BLOCK", block)
    queries, keys, values = _qkv(3, query_heads, kv_heads, length=12, width=20)
    mask = _masks(3, query_heads, 12, 20)[mask_name]
    weights = mx.random.normal(queries.shape, key=mx.random.key(5))

    def loss(fn):
        return lambda q, k, v: (fn(q, k, v) * weights).sum()

    expected_fn = lambda q, k, v: mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=mask)  # noqa: E731
    ours_fn = lambda q, k, v: attention(q, k, v, None, 0.25, mask)  # noqa: E731
    assert mx.allclose(ours_fn(queries, keys, values), expected_fn(queries, keys, values), atol=1e-5).item()
    expected = mx.grad(loss(expected_fn), argnums=(0, 1, 2))(queries, keys, values)
    ours = mx.grad(loss(ours_fn), argnums=(0, 1, 2))(queries, keys, values)
    for a, b in zip(ours, expected):
        assert mx.allclose(a, b, atol=1e-4).item()


def test_a_fully_masked_query_row_attends_evenly_as_mlx_does():
    queries, keys, values = _qkv(1, 2, 2, length=3, width=5)
    mask = mx.array([[True] * 5, [False] * 5, [True, True, False, False, False]])
    got = attention(queries, keys, values, None, 0.25, mask)
    expected = mx.fast.scaled_dot_product_attention(queries, keys, values, scale=0.25, mask=mask)
    assert not mx.isnan(got).any().item()
    assert mx.allclose(got, expected, atol=1e-5).item()


@pytest.mark.parametrize("dtype, tolerance", [(mx.float32, 1e-5), (mx.float16, 2e-3)])
def test_a_grouped_query_decode_step_attends_as_mlx_does(dtype, tolerance):
    keys = mx.random.normal((3, 2, 40, 16), key=mx.random.key(1)).astype(dtype)
    values = mx.random.normal((3, 2, 40, 16), key=mx.random.key(2)).astype(dtype)
    queries = (mx.random.normal((3, 6, 1, 16), key=mx.random.key(3)) * 3).astype(dtype)
    padding = mx.arange(40)[None, None, None, :] >= mx.array([0, 5, 17])[:, None, None, None]  # [3, 1, 1, 40]
    nothing = padding & (mx.arange(3) != 1)[:, None, None, None]  # row 1 attends to no position
    for mask in (None, padding, mx.where(padding, 0.0, -1e9).astype(dtype), nothing):
        expected = mx.fast.scaled_dot_product_attention(queries, keys, values, scale=0.25, mask=mask)
        got = attention(queries, keys, values, None, 0.25, mask)
        assert got.dtype == dtype and not mx.isnan(got).any().item()
        assert mx.allclose(got, expected, atol=tolerance).item()


@pytest.mark.parametrize("block", [1 << 16, 40])  # one block, and blocks of a few rows
def test_gated_silu_matches_mlx_lm_swiglu_forward_and_backward(monkeypatch, block):
    monkeypatch.setattr(cpu_kernels, "ACTIVATION_BLOCK", block)
    gate = mx.random.normal((2, 7, 24), key=mx.random.key(1)) * 6
    gate = mx.concatenate([gate, mx.array([[[-200.0, -88.5, 0.0, 88.5, 200.0] + [1.0] * 19]] * 2)], axis=1)
    x = mx.random.normal(gate.shape, key=mx.random.key(2))
    cotangent = mx.random.normal(gate.shape, key=mx.random.key(3))
    assert mx.allclose(swiglu(gate, x), activations.swiglu(gate, x), rtol=1e-5, atol=1e-6).item()
    ours = mx.vjp(swiglu, [gate, x], [cotangent])[1]
    expected = mx.vjp(activations.swiglu, [gate, x], [cotangent])[1]
    for a, b in zip(ours, expected):
        assert not mx.isnan(a).any().item()
        assert mx.allclose(a, b, rtol=1e-5, atol=1e-5).item()


def test_inside_cpu_kernels_a_model_runs_ours_and_gives_the_same_logits_and_gradients():
    model = random_model("llama", vocab=64, hidden=64)
    tokens = mx.array([[3, 9, 4, 1, 7, 7, 2, 5], [8, 1, 1, 6, 3, 2, 9, 4]])

    def loss(m):
        return nn.losses.cross_entropy(m(tokens[:, :-1]), tokens[:, 1:]).mean()

    expected_loss, expected_grads = nn.value_and_grad(model, loss)(model)
    with cpu_kernels.cpu_kernels(model):
        assert llama.scaled_dot_product_attention is attention and llama.swiglu is swiglu
        with cpu_kernels.cpu_kernels(model):  # entered again inside: the outer entry keeps its swap
            pass
        assert llama.scaled_dot_product_attention is attention
        ours_loss, ours_grads = nn.value_and_grad(model, loss)(model)
        mx.eval(ours_loss, ours_grads)
    assert llama.scaled_dot_product_attention is base.scaled_dot_product_attention
    assert llama.swiglu is activations.swiglu
    assert abs(ours_loss.item() - expected_loss.item()) < 1e-5
    from mlx.utils import tree_flatten

    for (name, a), (_, b) in zip(tree_flatten(ours_grads), tree_flatten(expected_grads)):
        assert mx.allclose(a, b, rtol=1e-3, atol=1e-5).item(), name
