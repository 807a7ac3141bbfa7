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
    name: str  # "OpenBLAS", "reference BLAS", "Accelerate", or "other" (another preloaded BLAS)
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


def _global_symbol_library(symbol: str) -> str | None:
    """The library that provides `symbol` in the process-wide lookup scope, if any.

    Preloaded libraries sit in that scope ahead of every library MLX loads, so MLX's
    calls bind to them; libraries loaded privately (numpy's own OpenBLAS) do not.
    """
    import ctypes
    import ctypes.util

    class DlInfo(ctypes.Structure):
        _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                    ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]

    try:
        address = ctypes.cast(getattr(ctypes.CDLL(None), symbol), ctypes.c_void_p).value
        # glibc >= 2.34 has dladdr in libc itself; older ones in libdl.
        libdl = ctypes.CDLL(ctypes.util.find_library("dl") or ctypes.util.find_library("c"))
    except (AttributeError, OSError):
        return None
    info = DlInfo()
    if not libdl.dladdr(ctypes.c_void_p(address), ctypes.byref(info)) or not info.dli_fname:
        return None
    return os.path.realpath(info.dli_fname.decode())


def blas_in_use() -> BlasInfo:
    """The BLAS MLX's CPU matmuls go to: where MLX's `cblas_sgemm` calls bind in this process."""
    import mlx.core  # noqa: F401 - maps MLX's own BLAS so its path can be shown

    found = blas.find_openblas() if sys.platform.startswith("linux") else None
    switched_off = os.environ.get(blas.SWITCH, "1") == "0"
    if sys.platform == "darwin":
        return BlasInfo("Accelerate", None, None, switched_off)
    provider = _global_symbol_library("cblas_sgemm")
    if provider is not None:
        return BlasInfo("OpenBLAS" if "openblas" in Path(provider).name else "other", provider, found, switched_off)
    # Nothing global: MLX binds to the reference BLAS bundled in its wheel.
    bundled = next((p for p in _mapped_libraries() if Path(p).name.startswith("libblas")), None)
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


def matmul_peak_flops() -> float:
    """The machine's fp32 matmul FLOP/s for the roofline and perf/mfu: the best of five 1024 x 1024 matmuls
    (large enough for the BLAS to reach its speed, short enough to take well under a second)."""
    return matmul_gflops(1024, repeats=5) * 1e9


def stream_gb_s(megabytes: int = 256, rows: int = 8, repeats: int = 3) -> float:
    """Best-of-`repeats` rate at which a matmul of `rows` rows reads a `megabytes` fp32 matrix: how fast
    a decode step can read the weights (each is used once per row, so memory, not arithmetic, bounds it)."""
    import mlx.core as mx

    side = int((megabytes * 2**20 / 4) ** 0.5)
    w = mx.random.normal((side, side))
    x = mx.random.normal((rows, side))
    mx.eval(w, x @ w)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        mx.eval(x @ w)
        best = min(best, time.perf_counter() - start)
    return w.nbytes / best / 1e9


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
    load_average: float | None  # 1-minute load average when measured: other work shares these cores

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
        load_average=round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    )


# ----------------------------------------------------------------------------- a Mac's state, for reports

NOT_ON_THIS_OS = "not available on this OS"


def _pmset(*args: str) -> str | None:
    try:
        return subprocess.run(["pmset", *args], capture_output=True, text=True, timeout=5, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def power_source() -> str:
    """"AC Power" or "Battery Power" (`pmset -g batt`): a Mac on battery may run its GPU slower."""
    if sys.platform != "darwin":
        return NOT_ON_THIS_OS
    text = _pmset("-g", "batt") or ""
    start = text.find("'")
    return text[start + 1:text.find("'", start + 1)] if start >= 0 and text.count("'") >= 2 else "unknown"


def low_power_mode() -> str:
    """"on" or "off" (`pmset -g`'s lowpowermode): Low Power Mode caps the chip's clocks."""
    if sys.platform != "darwin":
        return NOT_ON_THIS_OS
    for line in (_pmset("-g") or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "lowpowermode":
            return "on" if parts[1] == "1" else "off"
    return "unknown"


def thermal_state() -> str:
    """What `pmset -g therm` reports: speed limits from heat (throttling slows steps several-fold)."""
    if sys.platform != "darwin":
        return NOT_ON_THIS_OS
    text = _pmset("-g", "therm")
    if text is None:
        return "unknown"
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("Note:")]
    limits = [line for line in lines if "=" in line]
    return "; ".join(limits) if limits else ("; ".join(lines[-1:]) or "unknown")


# ----------------------------------------------------------------------------- the MLX device, for a run

def device_info() -> dict:
    """The GPU's facts (name, architecture, memory size, recommended working set), {} without a GPU.
    `mx.device_info()` exists from MLX 0.30.4 (our floor); before it only `mx.metal.device_info()` (the
    same keys on Metal), kept for an install below the floor. Asked of the GPU, not the default device."""
    import mlx.core as mx

    if hasattr(mx, "device_info"):
        try:
            return dict(mx.device_info(mx.gpu)) if mx.metal.is_available() else dict(mx.device_info())
        except (RuntimeError, ValueError, TypeError):
            return {}
    return dict(mx.metal.device_info()) if mx.metal.is_available() else {}


MEMORY_SHARE_ENV = "MLX_GRPO_MEMORY_SHARE"  # set by `mlx-grpo sweep --parallel N`: this process's share is 1/N


def memory_share() -> int:
    """How many trainers share this machine's memory (1 unless a parallel sweep started this one, or
    `mlx.launch` put several ranks on this host: `share_memory_with`)."""
    try:
        return max(1, int(os.environ.get(MEMORY_SHARE_ENV, "1")))
    except ValueError:
        return 1


def share_memory_with(trainers_here: int) -> None:
    """Ranks of one launch on the same host each plan for, wire and are measured against 1/N of its memory
    (a parallel sweep has already set its own share; that one stands)."""
    if trainers_here > 1 and MEMORY_SHARE_ENV not in os.environ:
        os.environ[MEMORY_SHARE_ENV] = str(trainers_here)


def wired_limit() -> int | None:
    """What `wire_memory` wires: this trainer's share of the GPU's recommended working set (None without
    Metal). MLX accepts a limit up to the working set; before macOS 15 setting it does nothing."""
    import mlx.core as mx

    if not mx.metal.is_available():
        return None
    working_set = device_info().get("max_recommended_working_set_size")
    return int(working_set / memory_share()) if working_set else None


def wired_limit_in_effect() -> int | None:
    """The wired limit MLX holds now, read back (setting it returns the previous one), None without Metal.
    What `wire_memory` asked for, unless nothing asked; before macOS 15 MLX keeps the number but wires
    nothing (`wiring_takes_effect`)."""
    import mlx.core as mx

    if not mx.metal.is_available():
        return None
    current = mx.set_wired_limit(0)
    mx.set_wired_limit(current)
    return int(current)


def wiring_takes_effect() -> bool | None:
    """Whether a wired limit wires anything: MLX's residency sets need macOS 15 (None off macOS)."""
    version = platform.mac_ver()[0]
    if not version:
        return None
    return int(version.split(".")[0]) >= 15


def cache_limit_for(resident_bytes: float, planned_peak: float | None) -> int | None:
    """The most freed memory MLX may keep cached (and, on a Mac, wired) for reuse: what a step adds to the
    resident weights at the plan's peak. GRPO's shapes change every step, so without a limit Metal's cache
    keeps growing until active + cache reach 95% of the working set, whatever the plan said (None: no plan)."""
    if planned_peak is None or planned_peak <= resident_bytes:
        return None
    return int(planned_peak - resident_bytes)


def wire_memory(resident_bytes: float, planned_peak: float | None = None) -> str | None:
    """On Metal, let MLX keep up to the recommended working set wired, as mlx-lm's trainer does, so the
    model's buffers are not paged out between steps; a trainer sharing the Mac with others (a parallel
    sweep) wires and may use only its share. The buffer cache is held to what the plan's peak adds to the
    resident state (`cache_limit_for`). Returns a warning when what stays resident all run (weights,
    optimiser state) already takes more than 90% of that."""
    import mlx.core as mx

    if (cache_limit := cache_limit_for(resident_bytes, planned_peak)) is not None:
        mx.set_cache_limit(cache_limit)
    working_set = wired_limit()
    if working_set is None:
        return None
    mx.set_wired_limit(working_set)
    if memory_share() > 1:
        mx.set_memory_limit(int(working_set))
    if resident_bytes > 0.9 * working_set:
        return (f"the weights and optimiser state take {resident_bytes / 2**30:.1f} GiB, over 90% of this Mac's "
                f"{working_set / 2**30:.1f} GiB working set: the rollout and update will swap; see `mlx-grpo plan`")
    return None


def accel_memory() -> dict[str, float | None]:
    """MLX's memory counters and the device's recommended working set (None where the backend has none);
    this process's share of it when several trainers share the machine, so `memory/peak_percent` and its
    alert read against what this trainer may use."""
    import mlx.core as mx

    working_set = device_info().get("max_recommended_working_set_size")
    return {
        "active": mx.get_active_memory(),
        "peak": mx.get_peak_memory(),
        "cache": mx.get_cache_memory(),
        "limit": working_set / memory_share() if working_set else None,
    }


def describe_device(dtype: str) -> dict[str, object]:
    """run.json's device section: backend, device, chip, memory, BLAS, dtype, OS."""
    import mlx.core as mx

    info = device_info()
    device = mx.default_device()
    return {
        "backend": "metal" if device.type == mx.gpu and mx.metal.is_available() else "cpu",
        "device": str(device),
        "device_name": info.get("device_name", platform.processor()),
        "architecture": info.get("architecture", platform.machine()),
        "memory_size_gb": (info["memory_size"] / 2**30) if "memory_size" in info else None,
        "blas": blas_in_use().name,
        "dtype": dtype,
        "platform": platform.platform(),
    }


def versions() -> dict[str, str]:
    import mlx.core as mx
    import mlx_lm

    from .. import __version__

    return {"mlx_grpo": __version__, "mlx": mx.__version__, "mlx_lm": mlx_lm.__version__,
            "python": platform.python_version()}
