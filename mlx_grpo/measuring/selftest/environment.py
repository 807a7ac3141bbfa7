"""The machine a selftest ran on: chip, GPU, memory and wiring, power and thermal state, versions."""

from __future__ import annotations

import os
import platform
import subprocess
from typing import Any


def gpu_cores() -> int | None:
    """The Apple GPU's core count (ioreg's gpu-core-count), None elsewhere."""
    if platform.system() != "Darwin":
        return None
    try:
        text = subprocess.run(["ioreg", "-rc", "AGXAccelerator", "-d", "1"], capture_output=True, text=True,
                              timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in text.splitlines():
        if '"gpu-core-count"' in line:
            try:
                return int(line.split("=")[-1].strip())
            except ValueError:
                return None
    return None


def memory_state() -> dict[str, Any]:
    """Swap in use and macOS's memory pressure, now (None where the OS has no such reading)."""
    from ...telemetry.metrics.system import PRESSURE_LEVELS, memory_pressure_level, swap_used_bytes

    level = memory_pressure_level()
    return {"swap_used_bytes": swap_used_bytes(),
            "memory_pressure": PRESSURE_LEVELS.get(level, str(level)) if level is not None else None}


def cache_limit_now() -> int:
    import mlx.core as mx

    current = mx.set_cache_limit(0)
    mx.set_cache_limit(current)
    return int(current)


def environment(tf32_at_start: str | None = None) -> dict[str, Any]:
    """The machine, read without changing it: the selftest does not wire memory itself, so a `train` or
    `bench` that stopped wiring would show in the read-back of the `memory` and `bench` checks.
    `tf32_at_start`: MLX_ENABLE_TF32 as the user had it, before the selftest set 0."""
    import mlx.core as mx
    import psutil

    from ...planning import chips
    from ...planning.machine import (
        NOT_ON_THIS_OS,
        cpu_model,
        device_info,
        low_power_mode,
        memory_share,
        power_source,
        thermal_state,
        versions,
        wired_limit,
        wiring_takes_effect,
    )
    from ...planning.tf32 import ENV, float32_state

    info = device_info()
    chip = chips.this_chip()
    float32 = float32_state()
    return {
        "chip": info.get("device_name") or cpu_model(),
        "cpu": cpu_model(),
        "gpu_cores": gpu_cores(),
        "gpu_architecture": info.get("architecture") if mx.metal.is_available() else None,
        "bandwidth_gb_s": chip.bandwidth_gb_s if chip else None,
        "memory_bytes": info.get("memory_size") or psutil.virtual_memory().total,
        "working_set_bytes": info.get("max_recommended_working_set_size"),
        "wired_limit_bytes": wired_limit(),  # what `train` asks for; read back in the `memory` check
        "wiring_takes_effect": wiring_takes_effect(),  # MLX wires nothing before macOS 15
        "cache_limit_bytes": cache_limit_now(),
        "memory_share": memory_share(),
        "neural_accelerators": float32.accelerators,  # an M5's GPU: float32 products in TF32 unless the flag is 0
        "tf32_setting_at_start": tf32_at_start,
        "tf32_setting": os.environ.get(ENV),
        "float32": float32.describe(),
        "os": platform.platform(),
        "macos": platform.mac_ver()[0] or None,
        "power_source": power_source(),
        "low_power_mode": low_power_mode(),
        "thermal_state": thermal_state(),
        **memory_state(),
        "memory_pressure_note": None if platform.system() == "Darwin" else f"memory pressure: {NOT_ON_THIS_OS}",
        "backend": "metal" if mx.metal.is_available() and mx.default_device().type == mx.gpu else "cpu",
        "load_average": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "cores": os.cpu_count(),
        **versions(),
    }

