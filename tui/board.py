"""The dashboard's model: the runs being watched and the user's view settings.

Widgets read from one `Board` (the app owns it); nothing here draws.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from mlx_grpo.telemetry.rundir_reader import RunReader, RunState, pid_alive

from .palette import LEVEL_RANK, run_color

SMOOTHING_LEVELS = (0.0, 0.6, 0.9, 0.99)
REFRESH_LEVELS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0)


@dataclass
class Board:
    readers: list[RunReader]
    clock: Callable[[], float] = time.time
    alive: Callable[[int], bool] = pid_alive
    smoothing: float = 0.6
    refresh_s: float = 1.0
    paused: bool = False
    filter: str = ""
    # metric -> (level, indices of the runs where an alert on it stands)
    standing: dict[str, tuple[str, set[int]]] = field(default_factory=dict)
    # Bumped whenever any run's data changed; views skip work when it did not.
    generation: int = 0

    @property
    def runs(self) -> list[RunState]:
        return [r.state for r in self.readers]

    def color(self, index: int) -> str:
        return run_color(index)

    def poll(self) -> bool:
        """Read new data from every run; True when something changed."""
        changed = False
        for reader in self.readers:
            changed |= reader.poll()
        if changed:
            self.generation += 1
            self._update_standing()
        return changed

    def _update_standing(self) -> None:
        standing: dict[str, tuple[str, set[int]]] = {}
        for i, run in enumerate(self.runs):
            for metric, level in run.standing_alerts().items():
                old_level, idx = standing.get(metric, ("info", set()))
                idx.add(i)
                best = level if LEVEL_RANK[level] >= LEVEL_RANK[old_level] else old_level
                standing[metric] = (best, idx)
        self.standing = standing

    def alert_level(self, metrics: list[str] | tuple[str, ...]) -> str | None:
        """Highest level of a standing alert on any of these metrics, or None."""
        best = None
        for m in metrics:
            hit = self.standing.get(m)
            if hit and (best is None or LEVEL_RANK[hit[0]] > LEVEL_RANK[best]):
                best = hit[0]
        return best

    def available_metrics(self) -> list[str]:
        names: dict[str, None] = {}
        for run in self.runs:
            names.update(dict.fromkeys(run.table.names))
        return list(names)

    def matches_filter(self, *texts: str) -> bool:
        f = self.filter.strip().lower()
        return not f or any(f in t.lower() for t in texts)

    def cycle_smoothing(self) -> float:
        i = SMOOTHING_LEVELS.index(self.smoothing) if self.smoothing in SMOOTHING_LEVELS else 0
        self.smoothing = SMOOTHING_LEVELS[(i + 1) % len(SMOOTHING_LEVELS)]
        return self.smoothing

    def change_refresh(self, direction: int) -> float:
        """Step the refresh interval up (+1, slower) or down (-1, faster)."""
        levels = REFRESH_LEVELS
        i = min(range(len(levels)), key=lambda k: abs(levels[k] - self.refresh_s))
        self.refresh_s = levels[max(0, min(len(levels) - 1, i + direction))]
        return self.refresh_s

    def close(self) -> None:
        for reader in self.readers:
            reader.close()
