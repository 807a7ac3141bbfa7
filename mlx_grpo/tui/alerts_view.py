"""Alerts feed: newest first, coloured by level; ● marks an alert that still stands."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from .board import Board
from .board_widget import BoardView
from .fmt import fmt_value
from .palette import FADED, level_color

MAX_ROWS = 1000


class AlertsView(BoardView, DataTable):
    """Every run's alerts, newest first, one row each; a standing one is marked."""

    def __init__(self, board: Board, *, id: str | None = None):
        super().__init__(board, id=id, cursor_type="row", zebra_stripes=True)
        self._key: tuple | None = None

    def on_mount(self) -> None:
        """Add the table's columns."""
        self.add_columns("", "run", "step", "level", "metric", "value")
        self.add_column("message", key="message")

    def on_resize(self) -> None:
        """Rewrap the messages to the new width (the width is part of the table's key)."""
        self.update_data()

    def _message_width(self) -> int:
        """What is left of the view's width for the message column (the other columns are narrow)."""
        others = sum(c.get_render_width(self) for key, c in self.columns.items() if key != "message")
        return max(20, self.size.width - others - 2 * self.cell_padding - 2)

    def update_data(self) -> None:
        """Rebuild the rows when the alerts or their standing marks changed."""
        board = self.board
        rows = []
        for i, run in enumerate(board.runs):
            for entry in run.alerts:
                a = entry.alert
                if self.matches(a.metric, a.rule, a.message, a.level):
                    rows.append((a.step, a.time or 0.0, i, entry, run.alert_stands(a)))
        rows.sort(key=lambda r: (r[0], r[1]), reverse=True)
        rows = rows[:MAX_ROWS]
        # Alerts are few and change rarely: rebuild only when the list or a standing mark changed.
        width = self._message_width()
        key = (width, tuple((i, id(entry), stands) for _, _, i, entry, stands in rows))
        if key == self._key:
            return
        self._key = key
        self.clear()
        message = self.columns["message"]
        message.auto_width, message.width = False, width
        if not rows:  # an empty table reads as "not loaded yet"; say that there is nothing to show
            any_alerts = any(run.alerts for run in board.runs)
            self.add_row("", "", "", "", "", "", Text("no alerts match the filter" if any_alerts else
                                                      "no alerts yet", style=FADED))
        for step, _, i, entry, stands in rows:
            a = entry.alert
            color = level_color(a.level)
            source = "" if entry.source == "run" else " (evaluated here)"
            self.add_row(
                Text("●" if stands else "○", style=color),
                Text(board.runs[i].name, style=board.color(i)),
                Text(f"{step:,}", justify="right"),
                Text(a.level.upper(), style=f"bold {color}"),
                Text(a.metric, style=color if stands else ""),
                Text(fmt_value(a.value), justify="right"),
                Text(a.message + source, style="" if stands else FADED),
                height=None,  # as many lines as the message needs at the column's width: never cut
            )
