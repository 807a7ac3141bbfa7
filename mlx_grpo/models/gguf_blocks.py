"""ggml's quantized blocks as MLX affine groups of 32: codes, scales and biases read from the blocks.

MLX's affine format stores a group of 32 weights as `scale * code + bias` with `bits`-bit codes. ggml's
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (blocks of 32) and Q4_K, Q5_K (sub-blocks of 32 inside 256-weight super-blocks)
store each block the same way, so they convert exactly at their own bits: scale = the block's step (for the
K-quants the super-block's f16 scale times the sub-block's 6-bit one), bias = the block's offset (the min for
Q4_1/Q5_1/K-quants, -8, -16 or -128 steps for the symmetric Q4_0/Q5_0/Q8_0). Every product involved is exact
in float32 (an f16 scale has 11 significant bits, a code at most 8), so `mx.dequantize` of the result gives the
gguf package's float32 values bit for bit.

Q2_K, Q3_K and Q6_K have 16-weight sub-blocks with scales of their own: a group of 32 spans two, which no
affine group of 32 holds at those bits. They are quantized by MLX at `REQUANTIZED_BITS` from the file's values
(8 bits: a step of 1/255 of each group's range, well under 1% of the weights' RMS; 8.5 bits a weight against
16 for bfloat16). The loader measures and says that error.
"""

from __future__ import annotations

import numpy as np

GROUP_SIZE = 32  # MLX's smallest group: ggml's blocks and K-quant sub-blocks are 32 weights
EXACT_BITS = {"Q4_0": 4, "Q4_1": 4, "Q5_0": 5, "Q5_1": 5, "Q8_0": 8, "Q4_K": 4, "Q5_K": 5}
REQUANTIZED_BITS = 8
REQUANTIZED = ("Q2_K", "Q3_K", "Q6_K")
# bytes of one block (32 weights; 256 for the K-quants)
BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34, "Q4_K": 144, "Q5_K": 176}


def mlx_bits(type_name: str) -> int:
    """The bits a matrix of ggml type `type_name` keeps in MLX's format."""
    return EXACT_BITS.get(type_name, REQUANTIZED_BITS)


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    """The little-endian float16 at byte `at` of every block, as float32."""
    return np.ascontiguousarray(blocks[..., at:at + 2]).view(np.float16)[..., 0].astype(np.float32)


def _nibbles(packed: np.ndarray) -> np.ndarray:
    """16 bytes -> 32 four-bit codes: the low nibbles are weights 0-15, the high ones 16-31."""
    return np.concatenate([packed & 0x0F, packed >> 4], axis=-1)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1's high bits: bit j of the block's little-endian 32-bit word belongs to weight j."""
    return np.unpackbits(qh, axis=-1, bitorder="little")


def _k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes -> eight 6-bit scales and eight 6-bit mins, one per sub-block of 32. Bytes 0-3 hold
    scales 0-3, bytes 4-7 mins 0-3 (low 6 bits each); bytes 8-11 hold the low 4 bits of scales 4-7 and (high
    nibble) mins 4-7, whose top 2 bits are the top 2 bits of bytes 0-3 and 4-7."""
    a, b, c = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    scales = np.concatenate([a & 63, (c & 0x0F) | ((a >> 6) << 4)], axis=-1)
    mins = np.concatenate([b & 63, (c >> 4) | ((b >> 6) << 4)], axis=-1)
    return scales.astype(np.float32), mins.astype(np.float32)


def affine_groups(raw: np.ndarray, type_name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of ggml blocks (uint8 [rows, bytes per row]) of an exact type as MLX affine groups of 32:
    codes (uint8 [rows, weights]), scales and biases (float32 [rows, weights / 32])."""
    rows = raw.shape[0]
    blocks = raw.reshape(rows, -1, BLOCK_BYTES[type_name])
    if type_name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
        d = _f16(blocks, 0)
        if type_name == "Q8_0":
            codes = (blocks[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
            bias = -128 * d
        elif type_name == "Q4_0":
            codes, bias = _nibbles(blocks[..., 2:]), -8 * d
        elif type_name == "Q4_1":
            codes, bias = _nibbles(blocks[..., 4:]), _f16(blocks, 2)
        elif type_name == "Q5_0":
            codes, bias = _nibbles(blocks[..., 6:]) | (_fifth_bits(blocks[..., 2:6]) << 4), -16 * d
        else:  # Q5_1
            codes, bias = _nibbles(blocks[..., 8:]) | (_fifth_bits(blocks[..., 4:8]) << 4), _f16(blocks, 2)
        return codes.reshape(rows, -1), d, bias
    # K-quants: super-block scale d and min scale dmin, then 6-bit scales/mins per sub-block of 32
    d, dmin = _f16(blocks, 0)[..., None], _f16(blocks, 2)[..., None]
    sub_scales, sub_mins = _k_scales(blocks[..., 4:16])
    low_start = 16 if type_name == "Q4_K" else 48
    quads = blocks[..., low_start:low_start + 128].reshape(rows, -1, 4, 32)  # 4 x 32 bytes: sub-blocks 2i, 2i+1
    codes = np.stack([quads & 0x0F, quads >> 4], axis=-2).reshape(rows, -1, 8, 32)
    if type_name == "Q5_K":  # the fifth bit of sub-block s is bit s of byte i (weight i) of the 32 qh bytes
        high = np.unpackbits(blocks[..., 16:48, None], axis=-1, bitorder="little")  # [rows, blocks, 32, 8]
        codes = codes | (np.moveaxis(high, -1, -2) << 4)
    return codes.reshape(rows, -1), (d * sub_scales).reshape(rows, -1), (-(dmin * sub_mins)).reshape(rows, -1)


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Codes (uint8 [rows, weights]) as MLX packs them: one little-endian stream of `bits`-bit fields per row,
    read as uint32 words."""
    rows = codes.shape[0]
    if bits == 8:
        return np.ascontiguousarray(codes).view(np.uint32)
    eights = codes.reshape(rows, -1, 8).astype(np.uint64)  # 8 codes fill exactly `bits` bytes
    words = (eights << (np.arange(8, dtype=np.uint64) * np.uint64(bits))).sum(axis=-1, dtype=np.uint64)
    stream = words.view(np.uint8).reshape(rows, -1, 8)[..., :bits]  # little-endian: the low `bits` bytes
    return np.ascontiguousarray(stream).reshape(rows, -1).view(np.uint32)
