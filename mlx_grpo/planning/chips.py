"""Peak unified-memory bandwidth of Apple Silicon chips, for the decode-speed ceiling.

Decoding one token per sequence reads every weight once plus each sequence's KV
cache, so on a bandwidth-bound chip
    tokens/s <= batch * bandwidth / (weight bytes + batch * KV bytes per sequence).
The figures are Apple's published peak numbers (theoretical: LPDDR clock times bus
width); real kernels reach part of them, which is what the percentage shows.
This module imports no mlx.
"""

from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class Chip:
    name: str  # as in `sysctl -n machdep.cpu.brand_string`, e.g. "Apple M2 Pro"
    bandwidth_gb_s: float  # 1 GB = 1e9 bytes, as Apple states it
    source: str


# (name, CPU cores or None for every variant, GB/s, source). Where one chip name
# ships in two bandwidth bins, the total CPU core count tells them apart.
_TABLE: list[tuple[str, int | None, float, str]] = [
    # Apple does not print M1's figure; its 128-bit LPDDR4X-4266 bus gives 68.25 GB/s, and
    # Apple's M1 Pro/Max announcement (newsroom, 18 Oct 2021) calls M1 Pro's 200GB/s "nearly 3x" M1.
    ("Apple M1", None, 68.25, "128-bit LPDDR4X-4266; Apple newsroom 2021-10-18 (M1 Pro is 'nearly 3x' M1)"),
    ("Apple M1 Pro", None, 200.0, "Apple newsroom 2021-10-18, 'Introducing M1 Pro and M1 Max'"),
    ("Apple M1 Max", None, 400.0, "Apple newsroom 2021-10-18, 'Introducing M1 Pro and M1 Max'"),
    ("Apple M1 Ultra", None, 800.0, "Apple newsroom 2022-03-08, 'Apple unveils M1 Ultra'"),
    ("Apple M2", None, 100.0, "Apple newsroom 2022-06-06, 'Apple unveils M2'"),
    ("Apple M2 Pro", None, 200.0, "Apple newsroom 2023-01-17, 'Apple unveils M2 Pro and M2 Max'"),
    ("Apple M2 Max", None, 400.0, "Apple newsroom 2023-01-17, 'Apple unveils M2 Pro and M2 Max'"),
    ("Apple M2 Ultra", None, 800.0, "Apple newsroom 2023-06-05, 'Apple introduces M2 Ultra'"),
    ("Apple M3", None, 100.0, "Apple MacBook Pro (Nov 2023) tech specs"),
    ("Apple M3 Pro", None, 150.0, "Apple MacBook Pro (Nov 2023) tech specs"),
    # M3 Max: 14-core CPU / 30-core GPU is 300GB/s, 16-core CPU / 40-core GPU is 400GB/s.
    ("Apple M3 Max", 14, 300.0, "Apple MacBook Pro (Nov 2023) tech specs, 14-core CPU M3 Max"),
    ("Apple M3 Max", 16, 400.0, "Apple MacBook Pro (Nov 2023) tech specs, 16-core CPU M3 Max"),
    ("Apple M3 Ultra", None, 819.0, "Apple newsroom 2025-03-05, Mac Studio with M3 Ultra"),
    ("Apple M4", None, 120.0, "Apple newsroom 2024-05-07, 'Apple introduces M4 chip'"),
    ("Apple M4 Pro", None, 273.0, "Apple newsroom 2024-10-30, 'Apple introduces M4 Pro and M4 Max'"),
    # M4 Max: 14-core CPU is 410GB/s, 16-core CPU is 546GB/s.
    ("Apple M4 Max", 14, 410.0, "Apple MacBook Pro (Nov 2024) tech specs, 14-core CPU M4 Max"),
    ("Apple M4 Max", 16, 546.0, "Apple newsroom 2024-10-30, 'Apple introduces M4 Pro and M4 Max'"),
    ("Apple M5", None, 153.0, "Apple newsroom 2025-10-15, 'Apple unleashes M5'"),
    # Apple states M5 Max as "up to" 614GB/s; a lower bin, if any, would make the percentage read low.
    ("Apple M5 Pro", None, 307.0, "Apple newsroom 2026-03-03, M5 Pro and M5 Max"),
    ("Apple M5 Max", None, 614.0, "Apple newsroom 2026-03-03, M5 Pro and M5 Max (top configuration)"),
    # MacBook Neo: an iPhone chip in a Mac, 8 GB of memory (`mlx-grpo plan --memory 8GB`); its GPU has no
    # Neural Accelerators, so float32 stays full float32 there (tf32.py).
    ("Apple A18 Pro", None, 60.0, "Apple MacBook Neo tech specs (A18 Pro, 8 GB, 60GB/s memory bandwidth)"),
]


def lookup(brand: str, cpu_cores: int | None) -> Chip | None:
    """The chip for a CPU brand string ("Apple M2 Pro"), or None when it is not in the table."""
    brand = brand.strip()
    rows = [row for row in _TABLE if row[0] == brand]
    if not rows:
        return None
    exact = [row for row in rows if row[1] is not None and row[1] == cpu_cores]
    any_variant = [row for row in rows if row[1] is None]
    # An unknown core count for a binned chip: take the larger bin (the percentage then errs low).
    name, _, gb_s, source = (exact or any_variant or [max(rows, key=lambda r: r[2])])[0]
    return Chip(name, gb_s, source)


def this_chip() -> Chip | None:
    """The Apple Silicon chip this process runs on, or None elsewhere or when unknown."""
    if platform.system() != "Darwin" or platform.machine() != "arm64":
        return None
    try:
        brand = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                               text=True, timeout=5, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return lookup(brand, os.cpu_count())


def decode_ceiling_tokens_per_s(bandwidth_gb_s: float, batch: int, weight_bytes: int,
                                kv_bytes_per_sequence: float) -> float:
    """Tokens/s if every decode step only had to read its bytes at peak bandwidth."""
    bytes_per_step = weight_bytes + batch * kv_bytes_per_sequence
    return batch * bandwidth_gb_s * 1e9 / bytes_per_step
