"""Every metric the runs log, with last value, range and trend; `/` filters it."""

from __future__ import annotations

import numpy as np
from rich.text import Text
from textual.widgets import DataTable

from .board import Board
from .fmt import fmt_spark, fmt_value
from .palette import LEVEL_COLORS

SPARK_WIDTH = 16


class MetricsView(DataTable):
    def __init__(self, *, id: str | None = None):
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self._key: tuple | None = None
        self._columns_for: int | None = None

    @property
    def board(self) -> Board:
        return self.app.board  # type: ignore[attr-defined]

    def update_data(self) -> None:
        board = self.board
        key = (board.generation, board.filter)
        if key == self._key:
            return
        self._key = key
        runs = board.runs
        if self._columns_for != len(runs):
            self.clear(columns=True)
            self.add_column("metric")
            for i, run in enumerate(runs):
                self.add_column(Text(run.name, style=board.color(i)))
            self.add_columns("min", "max", "trend")
            self._columns_for = len(runs)
        cursor = self.cursor_row
        self.clear()
        for name in sorted(board.available_metrics()):
            if not board.matches_filter(name):
                continue
            level = board.alert_level([name])
            cells = [Text(("⚠ " if level else "") + name, style=LEVEL_COLORS[level] if level else "")]
            lo, hi, trend = np.inf, -np.inf, []
            for i, run in enumerate(runs):
                col = run.table.column(name)
                last = run.table.last_value(name) if col is not None else None
                cells.append(Text(fmt_value(last), justify="right", style=board.color(i) if len(runs) > 1 else ""))
                if col is not None and np.isfinite(col).any():
                    lo, hi = min(lo, float(np.nanmin(col))), max(hi, float(np.nanmax(col)))
                    if not trend:
                        trend = col[-4 * SPARK_WIDTH :][::4].tolist()
            cells.append(Text(fmt_value(lo if lo <= hi else None), justify="right"))
            cells.append(Text(fmt_value(hi if lo <= hi else None), justify="right"))
            cells.append(Text(fmt_spark(trend, SPARK_WIDTH), style="#4ea1ff"))
            self.add_row(*cells, key=name)
        if self.row_count:
            self.move_cursor(row=min(max(cursor, 0), self.row_count - 1))
