"""Every metric the runs log, with last value, range and trend; `/` filters it.

Rows are rebuilt only when the set of metrics or the filter changes; on a new
step only the rows on screen are updated (the others when scrolled to).
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from .board import Board
from .fmt import fmt_spark, fmt_value
from .palette import LEVEL_COLORS

SPARK_WIDTH = 16


class MetricsView(DataTable):
    def __init__(self, *, id: str | None = None):
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self._layout_key: tuple | None = None
        self._names: list[str] = []
        self._fresh: dict[str, tuple] = {}  # metric -> data stamp its row shows

    @property
    def board(self) -> Board:
        return self.app.board  # type: ignore[attr-defined]

    def update_data(self) -> None:
        board = self.board
        runs = board.runs
        names = sorted(n for n in board.available_metrics() if board.matches_filter(n))
        layout_key = (len(runs), tuple(names))
        if layout_key != self._layout_key:
            self._layout_key = layout_key
            cursor = self.cursor_row
            self.clear(columns=True)
            self.add_column("metric", key="metric")
            for i, run in enumerate(runs):
                self.add_column(Text(run.name, style=board.color(i)), key=f"run{i}")
            self.add_column("min", key="min")
            self.add_column("max", key="max")
            self.add_column("trend", key="trend")
            for name in names:
                self.add_row(*self._cells(name), key=name)
            self._names = names
            self._fresh = dict.fromkeys(names, self._stamp())
            if self.row_count:
                self.move_cursor(row=min(max(cursor, 0), self.row_count - 1))
            return
        self._update_visible()

    def watch_scroll_y(self, old: float, new: float) -> None:
        super().watch_scroll_y(old, new)
        self._update_visible()

    def _stamp(self) -> tuple:
        return (self.board.generation, tuple(sorted(self.board.standing)))

    def _update_visible(self) -> None:
        if not self._names:
            return
        stamp = self._stamp()
        top = int(self.scroll_y)
        for name in self._names[top : top + self.size.height]:
            if self._fresh.get(name) == stamp:
                continue
            self._fresh[name] = stamp
            keys = ["metric", *(f"run{i}" for i in range(len(self.board.runs))), "min", "max", "trend"]
            for key, cell in zip(keys, self._cells(name)):
                self.update_cell(name, key, cell)

    def _cells(self, name: str) -> list[Text]:
        board = self.board
        runs = board.runs
        level = board.alert_level([name])
        cells = [Text(("⚠ " if level else "") + name, style=LEVEL_COLORS[level] if level else "")]
        lo, hi, trend = None, None, []
        for i, run in enumerate(runs):
            cells.append(Text(fmt_value(run.table.last_value(name)), justify="right",
                              style=board.color(i) if len(runs) > 1 else ""))
            span = run.table.column_range(name)
            if span is not None:
                lo = span[0] if lo is None else min(lo, span[0])
                hi = span[1] if hi is None else max(hi, span[1])
                if not trend:
                    trend = run.table.column(name)[-4 * SPARK_WIDTH :][::4].tolist()
        cells.append(Text(fmt_value(lo), justify="right"))
        cells.append(Text(fmt_value(hi), justify="right"))
        cells.append(Text(fmt_spark(trend, SPARK_WIDTH), style="#4ea1ff"))
        return cells
