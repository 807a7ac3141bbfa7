"""What this process runs on: CPU, memory, OS, MLX device and the BLAS it really uses.

Shared by `mlx-grpo bench` (the machine block of its report) and `mlx-grpo doctor`.
mlx is imported inside the functions that need it, never at module import.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from . import blas


@dataclass
class BlasInfo:
    name: str  # "OpenBLAS", "reference BLAS" or "Accelerate"
    library: str | None  # the shared library the matmuls resolve to, when known
    openblas_found: str | None  # a system OpenBLAS on disk, used or not
    disabled_by_switch: bool  # MLX_GRPO_OPENBLAS=0 is set


def _mapped_libraries() -> list[str]:
    """Shared objects mapped into this process (Linux); empty where /proc is absent."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return []
    paths = {line.split()[-1] for line in maps.read_text().splitlines() if "/" in line and ".so" in line}
    return sorted(paths)


def blas_in_use() -> BlasInfo:
    """The BLAS MLX's CPU matmuls go to. Call after mlx is imported (its libraries are then mapped)."""
    import mlx.core  # noqa: F401 - maps MLX's own BLAS so it can be seen

    found = blas.find_openblas() if sys.platform.startswith("linux") else None
    switched_off = os.environ.get(blas.SWITCH, "1") == "0"
    if sys.platform == "darwin":
        return BlasInfo("Accelerate", None, None, switched_off)
    libraries = _mapped_libraries()
    # A preloaded OpenBLAS is searched first, so its symbols win over the wheel's bundled libblas.
    openblas = next((p for p in libraries if "openblas" in Path(p).name), None)
    if openblas:
        return BlasInfo("OpenBLAS", openblas, found, switched_off)
    bundled = next((p for p in libraries if Path(p).name.startswith("libblas")), None)
    return BlasInfo("reference BLAS", bundled, found, switched_off)


def cpu_model() -> str:
    if sys.platform == "darwin":
        try:
            return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                                  text=True, timeout=5, check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return platform.processor() or "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith(("model name", "Model", "Hardware")):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def matmul_gflops(size: int = 512, repeats: int = 3) -> float:
    """Best-of-`repeats` fp32 square matmul speed on the default device: shows which BLAS is really hit."""
    import mlx.core as mx

    a = mx.random.normal((size, size))
    b = mx.random.normal((size, size))
    mx.eval(a @ b)  # warm-up: first call pays allocation and library set-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        mx.eval(a @ b)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


@dataclass
class Machine:
    cpu: str
    physical_cores: int | None
    logical_cores: int | None
    ram_bytes: int
    os: str
    python: str
    mlx: str | None
    mlx_lm: str | None
    mlx_grpo: str | None
    device: str  # "cpu" or "gpu"
    metal: bool  # a Metal GPU is available to MLX
    blas: str
    blas_library: str | None
    matmul_fp32_gflops: float

    def to_dict(self) -> dict:
        return asdict(self)


def describe() -> Machine:
    import mlx.core as mx
    import psutil

    info = blas_in_use()
    return Machine(
        cpu=cpu_model(),
        physical_cores=psutil.cpu_count(logical=False),
        logical_cores=psutil.cpu_count(logical=True),
        ram_bytes=psutil.virtual_memory().total,
        os=platform.platform(),
        python=platform.python_version(),
        mlx=mx.__version__,
        mlx_lm=package_version("mlx-lm"),
        mlx_grpo=package_version("mlx-grpo"),
        device="gpu" if mx.default_device().type == mx.gpu else "cpu",
        metal=mx.metal.is_available(),
        blas=info.name,
        blas_library=info.library,
        matmul_fp32_gflops=round(matmul_gflops(), 1),
    )
