"""System metrics (`system/*`) sampled in a background thread, so a training step pays only a dict copy.

Public API:

- `SystemSampler(interval=1.0, accel_memory=None, gpu_utilization=None)`: `start()` launches a daemon
  thread that samples machine CPU % (over the interval), memory, the process RSS and, where it can be
  read, GPU utilisation every `interval` seconds; `snapshot()` returns the latest sample plus the
  accelerator memory read at call time; `stop()` ends the thread. Usable as a context manager.
  - `accel_memory`: a callable the trainer passes (this package never imports mlx) returning a
    mapping with any of `active`, `peak`, `cache`, `limit` in bytes (None or absent = unknown), e.g.
    `lambda: {"active": mx.get_active_memory(), "peak": mx.get_peak_memory(),
    "cache": mx.get_cache_memory(), "limit": machine.device_info().get("max_recommended_working_set_size")}`.
    It is called from `snapshot()`, in the trainer's thread.
  - `gpu_utilization`: a callable returning a percentage or None; by default `ioreg_gpu_utilization`
    on macOS when `ioreg` exists, otherwise nothing.
- `ioreg_gpu_utilization() -> float | None` and `parse_ioreg_utilization(text) -> float | None`: the
  "Device Utilization %" of the GPU from `ioreg -r -d 1 -w 0 -c IOAccelerator` (the AGX accelerator
  on Apple silicon), no sudo needed.
- `accel_metrics(reading) -> dict`: turns an accelerator reading into `system/accel_*` metrics.
- `swap_used_bytes()`, `memory_pressure_level()`: swap in use, and macOS's memory-pressure level (1 normal,
  2 warning, 4 critical; None elsewhere), sampled as `system/swap_used_gb` and `system/memory_pressure_level`.

A metric that cannot be read is left out of the snapshot, never filled in.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import threading
from typing import Callable, Mapping

import psutil

from ...common.units import GB
from .mac_state import MacStateReader
from .names import (
    ACCEL_HELD_PERCENT,
    ACCEL_MEMORY_PERCENT,
    CPU_PERCENT,
    MEMORY_PERCENT,
    MEMORY_PRESSURE_LEVEL,
    MEMORY_USED_GB,
    PROCESS_RSS_GB,
    SWAP_USED_GB,
)

_UTILIZATION = re.compile(r'"Device Utilization %"\s*=\s*(\d+(?:\.\d+)?)')


def parse_ioreg_utilization(text: str) -> float | None:
    """The highest "Device Utilization %" in ioreg output (one per accelerator), or None."""
    values = [float(v) for v in _UTILIZATION.findall(text)]
    return max(values) if values else None


def ioreg_gpu_utilization() -> float | None:
    """The GPU's utilisation in percent from macOS's ioreg, or None elsewhere."""
    try:
        result = subprocess.run(["ioreg", "-r", "-d", "1", "-w", "0", "-c", "IOAccelerator"],
                                capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_ioreg_utilization(result.stdout) if result.returncode == 0 else None


def swap_used_bytes() -> int | None:
    """Swap in use on this machine (psutil; macOS grows its swap files when memory runs short)."""
    try:
        return int(psutil.swap_memory().used)
    except (OSError, RuntimeError, psutil.Error):
        return None


# kern.memorystatus_vm_pressure_level: what Activity Monitor's memory-pressure graph shows
PRESSURE_LEVELS = {1: "normal", 2: "warning", 4: "critical"}


def memory_pressure_level() -> int | None:
    """macOS's memory-pressure level (1 normal, 2 warning, 4 critical), None elsewhere or unreadable."""
    if sys.platform != "darwin":
        return None
    try:
        text = subprocess.run(["sysctl", "-n", "kern.memorystatus_vm_pressure_level"], capture_output=True,
                              text=True, timeout=5, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return int(text) if text.isdigit() else None


def _default_gpu_reader() -> Callable[[], float | None] | None:
    if sys.platform == "darwin" and shutil.which("ioreg"):
        return ioreg_gpu_utilization
    return None


def accel_metrics(reading: Mapping[str, float | None]) -> dict[str, float]:
    """An accelerator-memory reading (bytes) as system/accel_* metrics in GB and percent."""
    out: dict[str, float] = {}
    for key in ("active", "peak", "cache", "limit"):
        value = reading.get(key)
        if value is not None:
            out[f"system/accel_{key}_gb"] = float(value) / GB
    active, cache, limit = reading.get("active"), reading.get("cache"), reading.get("limit")
    if active is not None and limit:
        out[ACCEL_MEMORY_PERCENT] = 100.0 * float(active) / float(limit)
        if cache is not None:  # on a Mac the cache stays wired: it crowds the machine as active memory does
            out[ACCEL_HELD_PERCENT] = 100.0 * (float(active) + float(cache)) / float(limit)
    return out


class SystemSampler:
    """Samples CPU, memory and accelerator use on a thread; each record takes the latest sample."""

    def __init__(self, interval: float = 1.0,
                 accel_memory: Callable[[], Mapping[str, float | None]] | None = None,
                 gpu_utilization: Callable[[], float | None] | None = None,
                 mac_state: MacStateReader | None = None):
        self.interval = interval
        self.mac_state = mac_state if mac_state is not None else MacStateReader()
        self.accel_memory = accel_memory
        self.gpu_utilization = gpu_utilization if gpu_utilization is not None else _default_gpu_reader()
        self._process = psutil.Process()
        self._latest: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "SystemSampler":
        """Start the sampling thread."""
        self._sample(include_cpu=False)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="mlx-grpo-system-sampler", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        # psutil keeps cpu_percent's baseline per calling thread, so the baseline is taken here, in the
        # thread that reads it: taken in start() it left this thread's first reading a meaningless 0.0.
        psutil.cpu_percent(interval=None)
        while not self._stop.wait(self.interval):
            self._sample(include_cpu=True)

    def _sample(self, include_cpu: bool) -> None:
        sample: dict[str, float] = {}
        if include_cpu:
            sample[CPU_PERCENT] = float(psutil.cpu_percent(interval=None))
        memory = psutil.virtual_memory()
        sample[MEMORY_PERCENT] = float(memory.percent)
        sample[MEMORY_USED_GB] = (memory.total - memory.available) / GB
        sample["system/memory_available_gb"] = memory.available / GB
        if (swap := swap_used_bytes()) is not None:
            sample[SWAP_USED_GB] = swap / GB
        if (pressure := memory_pressure_level()) is not None:
            sample[MEMORY_PRESSURE_LEVEL] = float(pressure)
        sample.update(self.mac_state.read())
        try:
            sample[PROCESS_RSS_GB] = self._process.memory_info().rss / GB
        except psutil.Error:
            pass
        if self.gpu_utilization is not None:
            try:
                utilization = self.gpu_utilization()
            except Exception:  # a reader that breaks once is dropped; the other metrics carry on
                self.gpu_utilization = utilization = None
            if utilization is not None:
                sample["system/gpu_utilization_percent"] = float(utilization)
        with self._lock:
            self._latest = sample

    def snapshot(self) -> dict[str, float]:
        """The latest sample's metrics."""
        with self._lock:
            out = dict(self._latest)
        if self.accel_memory is not None:
            out.update(accel_metrics(self.accel_memory()))
        return out

    def stop(self) -> None:
        """Stop the sampling thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval + 5)
            self._thread = None

    def __enter__(self) -> "SystemSampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
