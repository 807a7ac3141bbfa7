"""The exponential, and mlx-lm's attention and gated activation built on it, made fast on MLX's CPU backend.

On the CPU, MLX's exp, sigmoid and tanh are scalar loops, 12-16 ns a value on the 2-core EPYC of
docs/PERFORMANCE.md against 0.2 ns for a multiply, and MLX has no attention kernel of its own
(`mx.fast.scaled_dot_product_attention` falls back to plain operations). So, for float32 on the CPU:

- `shifted_exp`: exp by a compiled polynomial, about 2 ns a value on blocks that stay in the caches: the
  streamed LM head's sweep (head_scores.py), the sampler's draw (sampling.py), and the two below;
- `gated_silu`: mlx-lm's `swiglu`, silu(gate) * x, a block of rows at a time, with a backward of its own;
- `attention`: mlx-lm's `scaled_dot_product_attention` over a plain cache. A decode step's grouped-query
  attention runs as one product per key/value head (the cache read once, not once per query head) and, in
  float32, through `softmax`; a query of many positions (the rollout's prefill, the reference pass) runs as
  many (row, key/value head) pairs at a time as fit in ATTENTION_BLOCK scores, each pair's query heads folded
  into its rows, through `softmax`, whose backward needs no exponential.

mlx-lm's models call `scaled_dot_product_attention` and `swiglu` as names of their own modules, so
`cpu_kernels(model)` swaps those names in the model's modules while it is entered and puts back what was
there (entered again inside, it leaves them to the outer entry). The rollout and the reference pass enter
it; the update does not (`cpu_kernels` says why), though both functions have backward passes. Quantized
caches, attention sinks and other dtypes keep mlx-lm's functions; so does a Metal GPU, where exp is an
instruction."""

from __future__ import annotations

import math
import sys
from contextlib import contextmanager
from typing import Callable, Iterator

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import activations, base

_LOG2E = math.log2(math.e)
# ln 2 split in two (Cody and Waite): n * _LN2_HIGH is exact in float32 for the n used here, so x - n ln 2
# keeps its digits at any x
_LN2_HIGH, _LN2_LOW = 0.693359375, -2.12194440e-4
# e^r by its Taylor series to degree 7: relative error under 1e-8 on |r| <= ln(2) / 2
_EXP_TAYLOR = tuple(1.0 / math.factorial(k) for k in range(8))
# e^r on |r| <= ln(2) / 2 by a polynomial of degree 6 fitted for relative error (Lawson's weighted least
# squares on Chebyshev nodes; with these float32 coefficients the error is under 2e-8)
_EXP_POLY = (1.0, 1.0, 0.49999991059303284, 0.16666419804096222, 0.04166822507977486, 0.008374815806746483,
             0.0013836848083883524)
# adding then subtracting 1.5 * 2^23 rounds a float32 of magnitude below 2^22 to the nearest integer
_ROUND = 12582912.0


def _exp_by_polynomial(x: mx.array) -> mx.array:
    """exp(x) of float32 x <= 0 (or NaN) as 2^n e^r with n = round(x / ln 2), |r| <= ln(2) / 2: a polynomial in
    r times 2^n, whose bits are n + 127 in the exponent field. Only multiplies and adds (no floor, no shift),
    so compiled it runs as two fused loops over the block: one writes the exponent fields, the other reads
    them back (as 2^n, and as n for r) and evaluates the polynomial. MLX fuses chains of at most 11
    operations and keeps apart any intermediate that two loops need, so n is never written on its own
    (r takes it from the exponent field) and the polynomial is in Estrin's form (depth 5, Horner's 12).
    Within two float32 rounding steps of exp; 0 below -88 (where float32's normal numbers end), as mx.exp
    gives."""
    # n + 127 from the rounding constant plus 128 (an even offset keeps round-half-to-even's choice), at
    # least 0: below -88 the exponent field is zero, so the result is 0 (and -inf gives 0, not NaN)
    biased = (x * _LOG2E + (_ROUND + 128.0)) - (_ROUND + 1.0)
    biased = (biased + mx.abs(biased)) * 0.5  # max(biased, 0) without a branch, which would keep the loop scalar
    field = (biased * 2.0**23).astype(mx.int32)
    # n ln 2 in two parts from the field; the high part is exact, so r keeps its digits at any x
    scaled = field.astype(mx.float32)
    n_high = scaled * (_LN2_HIGH / 2.0**23) - 127.0 * _LN2_HIGH
    n_low = scaled * (_LN2_LOW / 2.0**23) - 127.0 * _LN2_LOW
    r = (mx.where(x < -88.0, -88.0, x) - n_high) - n_low
    c = _EXP_POLY
    r2 = r * r
    p = ((c[0] + c[1] * r) + r2 * (c[2] + c[3] * r)) + (r2 * r2) * ((c[4] + c[5] * r) + c[6] * r2)
    return p * field.view(mx.float32)


_compiled_exp = mx.compile(_exp_by_polynomial)


def _exp_in_fewest_operations(x: mx.array) -> mx.array:
    """exp(x) of float32 x <= 0 by the same 2^n e^r, with e^r by Horner's rule on the Taylor series: the
    fewest operations and live intermediates, for the update's streamed head. Under mx.grad, MLX did not
    fuse `_exp_by_polynomial` as it does outside (measured: the update's head took about as long with
    compilation disabled), and there its branch-free clamps and its n from the exponent field cost 9% more
    time and 50% more memory (tests/core/test_update_memory.py) than this, the formulation before them."""
    x = mx.maximum(x, -88.0)
    n = (x * _LOG2E + _ROUND) - _ROUND
    r = (x - n * _LN2_HIGH) - n * _LN2_LOW
    p = _EXP_TAYLOR[-1]
    for c in reversed(_EXP_TAYLOR[:-1]):
        p = p * r + c
    return p * ((n + 127.0) * 2.0**23).astype(mx.int32).view(mx.float32)


_compiled_exp_in_fewest_operations = mx.compile(_exp_in_fewest_operations)


def shifted_exp(x: mx.array, shift: mx.array, traced: bool = False) -> mx.array:
    """exp(x - shift) for float32 x <= shift (`shift` broadcasts against x), for the streamed head's blocks
    of logits (about a million each) less their running maximum: the softmax's exponentials over the
    vocabulary, the costliest elementwise work of a scored position. MLX's CPU exp costs more per logit
    than the head's matmul; this compiled polynomial, on blocks that stay in the caches, a fraction of it
    (docs/PERFORMANCE.md, "The exponential over the vocabulary"). The subtraction runs before it, as MLX's
    own vectorised loop: inside, the broadcast would make both compiled loops strided. `traced`: called
    under mx.grad (`_exp_in_fewest_operations`). Not for arrays of
    hundreds of MB: there its loops' full-size intermediates make it slower than mx.exp. On a GPU, exp is
    a hardware instruction: mx.exp."""
    if mx.default_device() != mx.cpu:
        return mx.exp(x - shift)
    return (_compiled_exp_in_fewest_operations if traced else _compiled_exp)(x - shift)


def _softmax_forward(scores: mx.array) -> mx.array:
    unnormalised = shifted_exp(scores, scores.max(axis=-1, keepdims=True))
    return unnormalised * mx.reciprocal(unnormalised.sum(axis=-1, keepdims=True))


@mx.compile
def _softmax_backward(weights: mx.array, cotangent: mx.array) -> mx.array:
    return weights * (cotangent - (cotangent * weights).sum(axis=-1, keepdims=True))


# softmax over the last axis of float32 scores, masked entries at -inf or float32's minimum
softmax = mx.custom_function(_softmax_forward)
softmax.vjp(lambda scores, cotangent, weights: _softmax_backward(weights, cotangent))


# Values per block of the gated activation: measured on the [8 x 533, 4864] gate of Qwen2.5-0.5B's MLP,
# blocks of 2^16 values took 108 ms against 118 at 2^17, 304 at 2^21 and 371 for mlx-lm's swiglu.
ACTIVATION_BLOCK = 1 << 16


def _sigmoid(x: mx.array) -> mx.array:
    """1 / (1 + e^-x) from e^-|x|, which never overflows."""
    small = _exp_in_fewest_operations(-mx.abs(x))
    return mx.where(x >= 0, 1.0, small) / (1.0 + small)


@mx.compile
def _gated_silu_block(gate: mx.array, x: mx.array) -> mx.array:
    return gate * _sigmoid(gate) * x


@mx.compile
def _gated_silu_block_backward(gate: mx.array, x: mx.array, cotangent: mx.array) -> tuple[mx.array, mx.array]:
    # d/dg g s(g) = s (1 + g (1 - s)), and d/dx = g s
    s = _sigmoid(gate)
    return cotangent * x * s * (1.0 + gate * (1.0 - s)), cotangent * gate * s


def _by_row_blocks(block_fn: Callable, *arrays: mx.array) -> list[mx.array]:
    """`block_fn` over blocks of about ACTIVATION_BLOCK values of same-shaped arrays (rows of their last
    axis), each block small enough for the compiled loops to stay in the caches; its outputs rejoined."""
    shape = arrays[0].shape
    flat = [a.reshape(-1, shape[-1]) for a in arrays]
    step = max(1, ACTIVATION_BLOCK // shape[-1])
    cuts = list(range(step, flat[0].shape[0], step))
    blocks = zip(*(mx.split(a, cuts) for a in flat)) if cuts else [flat]
    outputs = [block_fn(*block) for block in blocks]
    outputs = [o if isinstance(o, tuple) else (o,) for o in outputs]
    return [(mx.concatenate(parts) if len(parts) > 1 else parts[0]).reshape(shape) for parts in zip(*outputs)]


# silu(gate) * x of float32 arrays of one shape, by blocks of rows
gated_silu = mx.custom_function(lambda gate, x: _by_row_blocks(_gated_silu_block, gate, x)[0])
gated_silu.vjp(lambda primals, cotangent, output: tuple(
    _by_row_blocks(_gated_silu_block_backward, primals[0], primals[1], cotangent)))


def swiglu(gate: mx.array, x: mx.array) -> mx.array:
    """mlx-lm's `swiglu` (activations.py), through `gated_silu` for float32 arrays of one shape."""
    if gate.dtype != mx.float32 or x.dtype != mx.float32 or gate.shape != x.shape:
        return activations.swiglu(gate, x)
    return gated_silu(gate, x)


def _grouped_decode_step(queries: mx.array, keys: mx.array, values: mx.array, scale: float,
                         mask: mx.array | str | None) -> mx.array:
    """One query position: each key/value head's query heads as the rows of one product."""
    batch, query_heads, _, _ = queries.shape
    kv_heads = keys.shape[1]
    group = query_heads // kv_heads
    scores = (queries * scale).reshape(batch, kv_heads, group, -1) @ keys.swapaxes(-1, -2)
    if isinstance(mask, mx.array):  # [B or 1, 1 or heads, 1, S]
        if mask.shape[1] == query_heads:
            mask = mask.reshape(mask.shape[0], kv_heads, group, -1)
        scores = _masked(scores, mask)
    # a str mask ("causal") is no mask for one query position at the end of the sequence
    weights = softmax(scores) if scores.dtype == mx.float32 else mx.softmax(scores, axis=-1, precise=True)
    return (weights @ values).reshape(batch, query_heads, 1, -1)


# Scores per block of a many-position attention: rows and key/value heads together up to this many, a
# long one split along its queries (measured at 8 rows x 533 positions of Qwen2.5-0.5B: 2^20 and 2^22 took
# 230 and 219 ms forward against 558 for mlx-lm's; blocks of one row's head each made the default model's
# reference pass, 128 rows of ~30 positions, 3.7x slower than mlx-lm's, one block for them all does not).
ATTENTION_BLOCK = 1 << 20


def _full_mask(mask: mx.array | str | None, queries: int, keys: int) -> mx.array | None:
    """The mask as 4 dimensions, [B or 1, heads or 1, T or 1, S or 1], boolean (where to attend) or float32
    (added to the scores): "causal" puts the queries at the last positions of the keys, as MLX does."""
    if mask is None:
        return None
    if isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"unknown attention mask {mask!r}")
        return (mx.arange(queries)[:, None] + (keys - queries) >= mx.arange(keys)[None])[None, None]
    mask = mask if mask.dtype == mx.bool_ else mask.astype(mx.float32)
    return mask.reshape((1,) * (4 - mask.ndim) + mask.shape)


def _masked(scores: mx.array, mask: mx.array) -> mx.array:
    # as MLX masks: a boolean mask replaces the scores (no gradient reaches a masked one), a float one adds
    return mx.where(mask, scores, mx.finfo(scores.dtype).min) if mask.dtype == mx.bool_ else scores + mask


def _blocked_attention(queries: mx.array, keys: mx.array, values: mx.array, scale: float,
                       mask: mx.array | str | None) -> mx.array:
    """Many query positions: the scores of as many (row, key/value head) pairs as fit in ATTENTION_BLOCK,
    each pair's query heads folded into its rows ([pairs, G, T, S]; one pair's split along T past it),
    masked, through `softmax`, times the values."""
    batch, query_heads, length, depth = queries.shape
    kv_heads, width = keys.shape[1], keys.shape[2]
    group = query_heads // kv_heads
    pairs = batch * kv_heads
    full = _full_mask(mask, length, width)
    if full is not None:  # [pairs or 1, G or 1, T or 1, S or 1]
        full = full.reshape(full.shape[0], kv_heads, group, *full.shape[2:]) if full.shape[1] == query_heads \
            else full[:, :, None]
        if full.shape[0] * full.shape[1] > 1:
            full = mx.broadcast_to(full, (batch, kv_heads, *full.shape[2:])).reshape(pairs, *full.shape[2:])
        else:
            full = full.reshape(1, *full.shape[2:])
    per_pair = group * length * width
    pair_step = max(1, ATTENTION_BLOCK // per_pair)
    row_step = length if per_pair <= ATTENTION_BLOCK else max(1, ATTENTION_BLOCK // (group * width))
    pair_cuts = list(range(pair_step, pairs, pair_step))
    row_cuts = list(range(row_step, length, row_step))
    # split, not slices: a slice's backward writes a zeroed whole-size array for every block
    q_parts = mx.split((queries * scale).reshape(pairs, group, length, depth), pair_cuts)
    k_parts = mx.split(keys.reshape(pairs, width, depth), pair_cuts)
    v_parts = mx.split(values.reshape(pairs, width, depth), pair_cuts)
    outputs = []
    for i, (q, k, v) in enumerate(zip(q_parts, k_parts, v_parts)):
        first = i * pair_step
        block_mask = None if full is None else full[first:first + q.shape[0]] if full.shape[0] > 1 else full
        k_t, v = k.swapaxes(-1, -2)[:, None], v[:, None]
        rows = []
        for j, q_rows in enumerate(mx.split(q, row_cuts, axis=2) if row_cuts else [q]):
            scores = q_rows @ k_t  # [pairs in the block, G, rows, S]
            if block_mask is not None:
                start = j * row_step
                scores = _masked(scores, block_mask[:, :, start:start + q_rows.shape[2]] if block_mask.shape[2] > 1
                                 else block_mask)
            rows.append(softmax(scores) @ v)
        outputs.append(rows[0] if len(rows) == 1 else mx.concatenate(rows, axis=2))
    out = outputs[0] if len(outputs) == 1 else mx.concatenate(outputs)
    return out.reshape(batch, query_heads, length, depth)


def attention(queries: mx.array, keys: mx.array, values: mx.array, cache, scale: float,
              mask: mx.array | str | None, sinks: mx.array | None = None) -> mx.array:
    """mlx-lm's `scaled_dot_product_attention` (base.py), over a plain cache by the CPU paths above."""
    plain = (sinks is None and not hasattr(cache, "bits") and isinstance(keys, mx.array)
             and queries.shape[1] % keys.shape[1] == 0)
    if plain and queries.shape[2] == 1 and keys.shape[1] != queries.shape[1]:
        return _grouped_decode_step(queries, keys, values, scale, mask)
    if plain and queries.shape[2] > 1 and queries.dtype == keys.dtype == values.dtype == mx.float32:
        return _blocked_attention(queries, keys, values, scale, mask)
    return base.scaled_dot_product_attention(queries, keys, values, cache=cache, scale=scale, mask=mask,
                                             sinks=sinks)


SWAPS = {"scaled_dot_product_attention": (base.scaled_dot_product_attention, attention),
         "swiglu": (activations.swiglu, swiglu)}


@contextmanager
def cpu_kernels(model: nn.Module) -> Iterator[None]:
    """Inside, on the CPU, `model`'s attention and gated activation run through `attention` and `swiglu`.
    For passes that are not differentiated: under mx.grad, at the lengths GRPO scores, their backward cost
    more than mlx-lm's gained (measured on Qwen2.5-Coder-0.5B's update, 8 rows of up to 160 positions: one
    micro-batch pass 11.8 against 11.1 s; attention at 180 positions 104 against 85 ms forward and
    backward)."""
    if mx.default_device().type != mx.cpu:
        yield
        return
    swapped = []
    for name in {type(m).__module__ for _, m in model.named_modules()}:
        module = sys.modules.get(name)
        for attribute, (theirs, ours) in SWAPS.items():
            if getattr(module, attribute, None) is theirs:
                setattr(module, attribute, ours)
                swapped.append((module, attribute, theirs))
    try:
        yield
    finally:
        for module, attribute, theirs in swapped:
            setattr(module, attribute, theirs)
