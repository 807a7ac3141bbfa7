"""The Mac's physical state, read where macOS tells it without sudo (`pmset`): thermal throttling, running on
battery, Low Power Mode. A long run on a laptop slows down for each of them; they are recorded as metrics so a
slow stretch has its reason next to it. Nothing is read on other systems. Imports no mlx.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from typing import Callable

from .names import CPU_SPEED_LIMIT, LOW_POWER_MODE, ON_BATTERY, THERMAL_WARNING_LEVEL

READ_EVERY_S = 30.0  # pmset costs ~10 ms a call: the state changes over minutes, not steps


def parse_therm(text: str) -> dict[str, float]:
    """`pmset -g therm`: the thermal warning level (0 when none was recorded) and, on Macs that report one,
    the CPU speed limit in percent (100: not throttled)."""
    out: dict[str, float] = {}
    if (m := re.search(r"(?i)thermal warning level\D*?(\d+)", text)) is not None:
        out[THERMAL_WARNING_LEVEL] = float(m.group(1))
    elif re.search(r"(?i)no thermal warning level", text):
        out[THERMAL_WARNING_LEVEL] = 0.0
    if (m := re.search(r"CPU_Speed_Limit\s*=\s*(\d+)", text)) is not None:
        out[CPU_SPEED_LIMIT] = float(m.group(1))
    return out


def parse_batt(text: str) -> dict[str, float]:
    """`pmset -g batt`: 1 when drawing from the battery, 0 on AC power."""
    if "'Battery Power'" in text:
        return {ON_BATTERY: 1.0}
    if "'AC Power'" in text:
        return {ON_BATTERY: 0.0}
    return {}


def parse_settings(text: str) -> dict[str, float]:
    """`pmset -g`: Low Power Mode (its `lowpowermode` line; macOS 12 and later)."""
    m = re.search(r"(?im)^\s*lowpowermode\s+(\d)", text)
    return {LOW_POWER_MODE: float(m.group(1))} if m else {}


def run_pmset(*args: str) -> str:
    return subprocess.run(["pmset", *args], capture_output=True, text=True, timeout=5, check=False).stdout


class MacStateReader:
    """The metrics of the three readings, refreshed at most every `every_s`; {} off a Mac."""

    def __init__(self, run: Callable[..., str] = run_pmset, every_s: float = READ_EVERY_S,
                 clock: Callable[[], float] = time.monotonic, platform: str = sys.platform,
                 available: bool | None = None):
        self.run, self.every_s, self.clock = run, every_s, clock
        self.on = platform == "darwin" and (shutil.which("pmset") is not None if available is None else available)
        self._last: dict[str, float] = {}
        self._read_at: float | None = None

    def read(self) -> dict[str, float]:
        if not self.on:
            return {}
        now = self.clock()
        if self._read_at is None or now - self._read_at >= self.every_s:
            self._read_at = now
            try:
                self._last = {**parse_therm(self.run("-g", "therm")), **parse_batt(self.run("-g", "batt")),
                              **parse_settings(self.run("-g"))}
            except (OSError, subprocess.SubprocessError):
                self.on, self._last = False, {}  # pmset that cannot run once will not run later
        return dict(self._last)
