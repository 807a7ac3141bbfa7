"""A KV cache whose keys and values are held quantized, for a rollout with `kv_cache_bits`."""

from __future__ import annotations

import mlx.core as mx
from mlx.utils import tree_map
from mlx_lm.models.cache import BatchKVCache, KVCache

from ..common.errors import UserError


class QuantizedBatchKVCache(BatchKVCache):
    """mlx-lm's BatchKVCache (per-row left padding and offsets, its attention mask) holding its keys and values
    quantized as mlx-lm's QuantizedKVCache does (`mx.quantize` per group of `group_size` values); mlx-lm's
    attention runs `quantized_matmul` over them when a cache has `bits`. 8 bits keep 0.28 of float32's bytes
    per cached value, 4 bits 0.16."""

    def __init__(self, left_padding: list[int], bits: int, group_size: int = 64):
        super().__init__(left_padding)
        self.bits, self.group_size = bits, group_size

    @classmethod
    def of(cls, plain: KVCache, bits: int, capacity: int) -> "QuantizedBatchKVCache":
        """`plain`'s rows (a prefilled KVCache or BatchKVCache) quantized, in a buffer of `capacity` positions."""
        keys, values = plain.keys[..., :cached_positions(plain), :], plain.values[..., :cached_positions(plain), :]
        rows = keys.shape[0]
        left = plain.left_padding if isinstance(plain, BatchKVCache) else mx.zeros((rows,), dtype=mx.int32)
        cache = cls([0] * rows, bits, kv_group_size(keys.shape[-1]))
        cache.left_padding = left
        cache.offset = keys.shape[2] - left
        cache.keys, cache.values = cache._buffer(keys, capacity), cache._buffer(values, capacity)
        cache._write(0, keys, values)
        return cache

    def _buffer(self, like: mx.array, positions: int) -> tuple[mx.array, mx.array, mx.array]:
        rows, heads, _, dim = like.shape
        per_int = 32 // self.bits
        shape = (rows, heads, positions)
        return (mx.zeros((*shape, dim // per_int), dtype=mx.uint32),
                mx.zeros((*shape, dim // self.group_size), dtype=like.dtype),
                mx.zeros((*shape, dim // self.group_size), dtype=like.dtype))

    def _write(self, at: int, keys: mx.array, values: mx.array) -> None:
        end = at + keys.shape[2]
        for stored, new in ((self.keys, keys), (self.values, values)):
            for part, quantized in zip(stored, mx.quantize(new, group_size=self.group_size, bits=self.bits)):
                part[..., at:end, :] = quantized
        self._idx = end

    def update_and_fetch(self, keys, values):
        prev = self._idx
        if prev + keys.shape[2] > self.keys[0].shape[2]:  # past the capacity asked for: grow by a block
            grow = lambda x: mx.concatenate(  # noqa: E731
                [x[..., :prev, :], mx.zeros((*x.shape[:2], self.step + keys.shape[2], x.shape[3]), x.dtype)], axis=2)
            self.keys, self.values = tree_map(grow, self.keys), tree_map(grow, self.values)
        self.offset = self.offset + keys.shape[2]
        self._write(prev, keys, values)
        return self.keys_and_values()

    def keys_and_values(self):
        return (tree_map(lambda x: x[..., :self._idx, :], self.keys),
                tree_map(lambda x: x[..., :self._idx, :], self.values))

    @property
    def state(self):
        return self.keys, self.values, self.offset, self.left_padding, self._idx

    @state.setter
    def state(self, v):
        self.keys, self.values, self.offset, self.left_padding, self._idx = v


def kv_group_size(head_dim: int) -> int:
    """The quantization group of a KV cache with heads of `head_dim` values: 64 as mlx-lm's QuantizedKVCache,
    or 32 (the smallest `mx.quantize` takes) for heads it does not divide."""
    for group in (64, 32):
        if head_dim % group == 0:
            return group
    raise UserError(f"kv_cache_bits: this model's attention heads hold {head_dim} values, not a multiple of 32; "
                    "its KV cache cannot be quantized (kv_cache_bits: 0)")


def cached_positions(layer_cache: KVCache) -> int:
    """How many positions a plain or batch KV cache holds."""
    return layer_cache._idx if isinstance(layer_cache, BatchKVCache) else layer_cache.offset
