"""A tile: one metric's latest value per run, its recent trend and change. Enter or a click opens its chart."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from .board import Board
from .board_widget import BoardWidget
from .fmt import fmt_spark, fmt_value
from .messages import OpenChart
from .palette import ACCENT, MUTED

SPARK_WIDTH = 12
# Change shown next to the value: against the value this many records back.
DELTA_RECORDS = 10


class MetricTile(BoardWidget, Static, can_focus=True):
    """One metric's last value, its trend and a small sparkline; click or enter opens its chart."""

    def __init__(self, board: Board, label: str, metric: str):
        super().__init__(board, "")
        self.label = label
        self.metric = metric
        self._key: tuple | None = None
        self._shown: str | None = None
        self._height = 0

    def chart_request(self) -> OpenChart:
        """The message that opens this metric as a chart."""
        return OpenChart(self.label, (self.metric,))

    def on_click(self) -> None:
        """A click opens the metric as a chart."""
        self.post_message(self.chart_request())

    def update_data(self) -> None:
        """Redraw from the runs' data."""
        board = self.board
        if self._height != len(board.runs) + 2:
            # A line per run inside the border; set only when the runs change, so updates need no layout pass.
            self._height = self.styles.height = len(board.runs) + 2
        level = board.alert_level([self.metric])
        self.set_class(level == "warning", "alert-warning")
        self.set_class(level == "error", "alert-error")
        key = (board.generation, level)
        if key == self._key:
            return
        self._key = key
        title = ("⚠ " if level else "") + self.label
        if self.border_title != title:
            self.border_title = title
        text = Text(no_wrap=True, overflow="ellipsis")
        several = len(board.runs) > 1
        for i, run in enumerate(board.runs):
            col = run.table.column(self.metric)
            recent = [] if col is None else col[-200:].tolist()
            values = [v for v in recent if v == v]
            if i:
                text.append("\n")
            value = values[-1] if values else None
            text.append(fmt_value(value).rjust(7), style=f"bold {board.color(i)}" if several else "bold")
            if len(values) > DELTA_RECORDS:
                delta = values[-1] - values[-1 - DELTA_RECORDS]
                arrow = "▲" if delta > 0 else "▼" if delta < 0 else "="
                text.append(f" {arrow}", style=MUTED)
            text.append(" " + fmt_spark(values, SPARK_WIDTH), style=board.color(i) if several else ACCENT)
        if text.plain != self._shown:  # colours follow the run and the text: same text, same look
            self._shown = text.plain
            self.update(text, layout=False)
