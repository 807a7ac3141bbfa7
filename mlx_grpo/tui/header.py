"""The top bar: per run its name, step of total, elapsed, ETA and state; then the view settings."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.widgets import Static

from .board_widget import BoardWidget
from .fmt import fmt_duration, fmt_step
from .palette import HIGHLIGHT, INK, LEVEL_COLORS, MUTED, state_color

BAR_WIDTH = 12
COMPACT_WIDTH = 100


def _bar(step: int | None, total: int | None) -> str:
    if not step or not total:
        return " " * BAR_WIDTH
    filled = min(BAR_WIDTH, int(round(BAR_WIDTH * step / total)))
    return "█" * filled + "░" * (BAR_WIDTH - filled)


@dataclass(frozen=True)
class Settings:
    """What the user set, shown on the header's last line (the app keeps it)."""

    refresh_s: float
    smoothing: float
    paused: bool = False
    filter: str = ""
    log_scale: bool = False


class RunHeader(BoardWidget, Static):
    """The top lines: each run's state, step and times, the alert count, and the view settings."""

    settings = Settings(1.0, 0.0)

    _height = 0

    def update_data(self) -> None:
        """Redraw from the board and the settings."""
        board = self.board
        if self._height != len(board.runs) + 1:
            # A line per run and one for the settings; set only when the runs change, so updates need no layout pass.
            self._height = self.styles.height = len(board.runs) + 1
        now = board.clock()
        compact = 0 < self.size.width < COMPACT_WIDTH  # 80 columns: no bar, no labels, so ETA stays on the line
        text = Text(no_wrap=True, overflow="ellipsis")
        for i, run in enumerate(board.runs):
            status = run.status(now, board.alive)
            color = board.color(i)
            text.append("● ", style=color)
            text.append(run.name, style=f"bold {color}")
            text.append("  " + fmt_step(run.step, run.total_steps))
            if not compact:
                text.append(" " + _bar(run.step, run.total_steps), style=color)
            text.append(f"  {'' if compact else 'elapsed '}{fmt_duration(run.elapsed(now, status))}")
            eta = run.eta(status)
            if eta is not None:
                text.append(f"  ETA {fmt_duration(eta)}")
            text.append("  ")
            text.append(f" {status.upper()} ", style=f"bold {INK} on {state_color(status)}")
            levels = [e.alert.level for e in run.alerts]
            for level in ("error", "warning"):
                if level in levels:
                    text.append(f"  ⚠ {levels.count(level)} {level}", style=f"bold {LEVEL_COLORS[level]}")
            if run.history_progress is not None:
                text.append(f"  loading history {100 * run.history_progress:.0f}%", style=MUTED)
            if run.garbage_total:
                text.append(f"  {run.garbage_total} bad lines skipped", style=MUTED)
            if run.notes:
                text.append(f"  {run.notes[-1]}", style=MUTED)
            text.append("\n")
        settings = self.settings
        smoothing = f"EMA {settings.smoothing:g}" if settings.smoothing else "off"
        scale = "log" if settings.log_scale else "linear"
        text.append(f"refresh {settings.refresh_s:g}s · smoothing {smoothing} · y {scale}", style=MUTED)
        if settings.filter:
            text.append(f" · filter '{settings.filter}'", style=f"bold {HIGHLIGHT}")
        if settings.paused:
            text.append("  PAUSED", style=f"bold {INK} on {HIGHLIGHT}")
        self.update(text, layout=False)
