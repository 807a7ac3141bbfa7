"""What "float32" means on this Mac's GPU: full float32, or TF32 on the Neural Accelerators of an M5.

From macOS 26.2, MLX runs float32 matrix products (matmul, quantized matmul, attention) on the Neural
Accelerators of an M5-family GPU (Apple GPU generation 17) in TF32: each operand rounded to 11 significant
bits, about 2^-11 = 4.9e-4 relative, where float32 keeps 24. MLX reads `MLX_ENABLE_TF32` once, at its first
such product: unset or 1 means TF32 there, 0 means full float32 (slower). M1-M4 and MLX's CPU backend compute
full float32 either way. `mlx-grpo selftest` sets 0 for its float32 comparisons and measures TF32 on its own.

`tf32_rounding()` emulates TF32 on any backend (the selftest derives its TF32 tolerance from it; tests use it to
stand in for an M5). `python -m mlx_grpo.measuring.tf32_child BATCH.npz OUT.npy` is the selftest's child process
that computes the default model's float32 log-probs with the flag as this process has it.
"""

from __future__ import annotations

import os
import platform
import re
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

ENV = "MLX_ENABLE_TF32"
TF32_BITS = 11  # significant bits of a TF32 operand (10 stored + the implicit one)
ACCELERATOR_GENERATION = 17  # applegpu_g17*: the M5 family, the first with Neural Accelerators in the GPU
PHONE_ACCELERATOR_GENERATION = 18  # an iPhone-class GPU ('p' suffix: A18 Pro in a MacBook Neo) needs 18 (MLX's gate)
ACCELERATOR_MACOS = (26, 2)  # MLX uses them from this macOS on


@dataclass(frozen=True)
class Float32State:
    accelerators: bool | None  # the GPU computes on Neural Accelerators; None: no Metal GPU in this process
    setting: str | None  # MLX_ENABLE_TF32 as set (None: unset, MLX's default 1)
    architecture: str | None

    @property
    def tf32(self) -> bool:
        """float32 products run in TF32 on this GPU."""
        return bool(self.accelerators) and self.setting != "0"

    def describe(self) -> str:
        setting = f"{ENV}={self.setting}" if self.setting is not None else f"{ENV} unset (MLX's default 1)"
        if self.accelerators is None:
            return f"no Metal GPU: float32 is full float32 ({setting}: no effect on the CPU)"
        if not self.accelerators:
            return (f"GPU without Neural Accelerators ({self.architecture or 'unknown'}): float32 is full float32 "
                    f"({setting}: no effect here)")
        if self.tf32:
            return (f"GPU Neural Accelerators in use (M5 family): {setting}, so float32 matmuls and attention run "
                    f"in TF32 ({TF32_BITS} significant bits); {ENV}=0 for full float32, at a cost in speed")
        return f"GPU Neural Accelerators in use (M5 family): {setting}, float32 is full float32 (slower than TF32)"


def generation(architecture: str | None) -> int | None:
    """Apple GPU generation from MLX's architecture name ('applegpu_g17s' -> 17)."""
    found = re.match(r"applegpu_g(\d+)", architecture or "")
    return int(found.group(1)) if found else None


def accelerators_in_use(architecture: str | None, macos: str | None) -> bool:
    """MLX's own test for its Neural Accelerator kernels: GPU generation 17 (18 for a phone-class GPU) on
    macOS 26.2 or later."""
    parts = tuple(int(p) for p in re.findall(r"\d+", macos or "")[:2])
    needed = PHONE_ACCELERATOR_GENERATION if (architecture or "").endswith("p") else ACCELERATOR_GENERATION
    return (generation(architecture) or 0) >= needed and parts >= ACCELERATOR_MACOS


def float32_state() -> Float32State:
    import mlx.core as mx

    from .machine import device_info

    setting = os.environ.get(ENV)
    if not mx.metal.is_available():
        return Float32State(None, setting, None)
    architecture = device_info().get("architecture")
    return Float32State(accelerators_in_use(architecture, platform.mac_ver()[0]), setting, architecture)


def full_float32() -> str | None:
    """Make this process's float32 full float32 (MLX_ENABLE_TF32=0), before MLX's first matrix product reads
    the flag; the setting it had before (None: unset)."""
    before = os.environ.get(ENV)
    os.environ[ENV] = "0"
    return before


def round_to_tf32(x):
    """`x` with its float32 significand rounded to TF32's 11 bits (to nearest, ties to even); the gradient
    passes through unchanged."""
    import mlx.core as mx

    if x.dtype != mx.float32:
        return x
    drop = 24 - TF32_BITS
    bits = x.view(mx.uint32)
    half = (1 << (drop - 1)) - 1
    rounded = (bits + half + ((bits >> drop) & 1)) & (0xFFFFFFFF - (1 << drop) + 1)
    return x + mx.stop_gradient(rounded.view(mx.float32) - x)


@contextmanager
def tf32_rounding() -> Iterator[None]:
    """Within: every float32 matmul of an mlx-lm model (linear layers, a tied head, quantized matmuls and
    attention) takes TF32-rounded operands, as an M5's GPU computes them by default."""
    import mlx.core as mx
    import mlx.nn as nn

    linear, as_linear = nn.Linear.__call__, nn.Embedding.as_linear
    quantized_matmul, attention = mx.quantized_matmul, mx.fast.scaled_dot_product_attention

    def tf32_linear(self, x):
        out = round_to_tf32(x) @ round_to_tf32(self["weight"]).T
        return out + self["bias"] if "bias" in self else out

    def tf32_quantized_matmul(x, *args, **kwargs):
        return quantized_matmul(round_to_tf32(x), *args, **kwargs)

    def tf32_attention(q, k, v, *args, **kwargs):
        return attention(round_to_tf32(q), round_to_tf32(k), round_to_tf32(v), *args, **kwargs)

    nn.Linear.__call__ = tf32_linear
    nn.Embedding.as_linear = lambda self, x: round_to_tf32(x) @ round_to_tf32(self.weight).T
    mx.quantized_matmul, mx.fast.scaled_dot_product_attention = tf32_quantized_matmul, tf32_attention
    try:
        yield
    finally:
        nn.Linear.__call__, nn.Embedding.as_linear = linear, as_linear
        mx.quantized_matmul, mx.fast.scaled_dot_product_attention = quantized_matmul, attention
