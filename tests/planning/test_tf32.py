"""What float32 means on the GPU (tf32.py): MLX's Neural Accelerator gate, the line doctor, the run and the
selftest print, and TF32's rounding as the selftest emulates it."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from mlx_grpo.planning import chips
from mlx_grpo.planning.tf32 import Float32State, accelerators_in_use, round_to_tf32


def test_neural_accelerators_are_an_m5_on_macos_26_2_or_later():
    assert accelerators_in_use("applegpu_g17s", "26.2")
    assert accelerators_in_use("applegpu_g17g", "27.0.1")
    assert not accelerators_in_use("applegpu_g17s", "26.1")  # MLX uses them from 26.2
    assert not accelerators_in_use("applegpu_g16s", "26.3")  # M4
    assert not accelerators_in_use("applegpu_g17p", "26.3")  # a phone-class GPU needs generation 18
    assert not accelerators_in_use(None, None)


def test_each_state_says_what_float32_is_and_how_to_get_full_float32():
    m5 = Float32State(True, None, "applegpu_g17s")
    assert m5.tf32 and "TF32" in m5.describe() and "MLX_ENABLE_TF32=0 for full float32" in m5.describe()
    off = Float32State(True, "0", "applegpu_g17s")
    assert not off.tf32 and "float32 is full float32" in off.describe()
    assert "no effect here" in Float32State(False, None, "applegpu_g15s").describe()
    assert "no Metal GPU" in Float32State(None, None, None).describe()


def test_tf32_rounding_keeps_11_significant_bits_and_passes_gradients():
    x = mx.array(np.random.default_rng(0).normal(size=4096).astype(np.float32))
    rounded = np.array(round_to_tf32(x))
    mantissa, _ = np.frexp(rounded)
    assert np.array_equal(mantissa * 2**11, np.round(mantissa * 2**11))  # 11 significant bits
    assert np.max(np.abs(rounded - np.array(x)) / np.abs(np.array(x))) <= 2.0**-11  # to nearest
    assert np.array_equal(np.array(mx.grad(lambda a: round_to_tf32(a).sum())(x)), np.ones(4096, np.float32))


def test_the_chip_table_knows_the_macbook_neo():
    neo = chips.lookup("Apple A18 Pro", 6)
    assert neo is not None and neo.bandwidth_gb_s == 60.0
