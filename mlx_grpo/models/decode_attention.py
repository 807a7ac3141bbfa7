"""Decode-step attention for grouped-query models on the CPU, where MLX has no attention kernel of its own.

On the CPU `mx.fast.scaled_dot_product_attention` falls back to plain ops, and for grouped-query attention
(Qwen2.5: 14 query heads over 2 key/value heads) it broadcasts each key/value head to its query heads: a
decode step's one query row per head becomes a separate matrix-vector product per query head, each reading
the cached keys and values again. Folding a group's query heads into the rows of one product reads the cache
once per key/value head: 82 against 176 ms per decode step over 24 layers of Qwen2.5-0.5B at 16 rows x 400
cached positions (benchmarks/decode_profile.py), and the gap grows with the cache.

mlx-lm's models call `scaled_dot_product_attention` as a name of their own module, so `grouped_decoding`
swaps that name in the model's modules while the rollout decodes, and puts it back after. Only one-position
queries over an unquantized cache take the grouped path; prefill and the update keep mlx-lm's."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import base

NAME = "scaled_dot_product_attention"


def grouped_attention(queries: mx.array, keys: mx.array, values: mx.array, cache, scale: float,
                      mask: mx.array | str | None, sinks: mx.array | None = None) -> mx.array:
    """mlx-lm's attention, with a grouped-query decode step (one query position) done as one product per
    key/value head."""
    batch, query_heads, length, _ = queries.shape
    kv_heads = keys.shape[1] if isinstance(keys, mx.array) else 0
    if length != 1 or sinks is not None or hasattr(cache, "bits") or kv_heads in (0, query_heads):
        return base.scaled_dot_product_attention(queries, keys, values, cache=cache, scale=scale, mask=mask,
                                                 sinks=sinks)
    group = query_heads // kv_heads
    scores = (queries * scale).reshape(batch, kv_heads, group, -1) @ keys.swapaxes(-1, -2)
    if isinstance(mask, mx.array):  # [B or 1, 1 or heads, 1, S]
        if mask.shape[1] == query_heads:
            mask = mask.reshape(mask.shape[0], kv_heads, group, -1)
        scores = mx.where(mask, scores, mx.finfo(scores.dtype).min) if mask.dtype == mx.bool_ else scores + mask
    # a str mask ("causal") is no mask for one query position at the end of the sequence
    weights = mx.softmax(scores, axis=-1, precise=True)
    return (weights @ values).reshape(batch, query_heads, 1, -1)


@contextmanager
def grouped_decoding(model: nn.Module) -> Iterator[None]:
    """Inside, on the CPU, `model`'s attention runs decode steps through `grouped_attention`."""
    if mx.default_device().type != mx.cpu:  # Metal has a decode kernel of its own
        yield
        return
    modules = {type(m).__module__ for _, m in model.named_modules()}
    swapped = [sys.modules[name] for name in modules
               if getattr(sys.modules.get(name), NAME, None) is base.scaled_dot_product_attention]
    for module in swapped:
        setattr(module, NAME, grouped_attention)
    try:
        yield
    finally:
        for module in swapped:
            setattr(module, NAME, base.scaled_dot_product_attention)
