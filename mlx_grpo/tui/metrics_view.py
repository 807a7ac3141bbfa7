"""Every metric the runs log, with last value per run, range and trend; `/` filters it, Enter charts it.

A line-API widget rather than a DataTable: on every new step only the rows on
screen are formatted again (a DataTable re-renders each changed cell through
rich, which cost more than the refresh budget for ~100 metrics).
"""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from .board import Board
from .board_widget import BoardView
from .fmt import fmt_spark, fmt_value
from .messages import OpenChart
from .palette import ACCENT, CURSOR_BG, LABEL, level_color

SPARK_WIDTH = 16
VALUE_WIDTH = 10
_HEADER = Style(bold=True, color=LABEL)
_CURSOR = Style(bgcolor=CURSOR_BG)
_DIM = Style(color=LABEL)
_TREND = Style(color=ACCENT)


class MetricsView(BoardView, ScrollView, can_focus=True):
    """Every metric of the runs with its last value, one line each; enter opens one as a chart."""

    BINDINGS = [
        Binding("down", "cursor_down", show=False),
        Binding("up", "cursor_up", show=False),
        Binding("enter", "open_chart", "open as chart", show=False),
    ]
    cursor = reactive(0)

    def __init__(self, board: Board, *, id: str | None = None):
        super().__init__(board, id=id)
        self._names: list[str] = []
        self._key: tuple | None = None
        self._rows: dict[str, tuple[tuple, list[tuple[str, Style]]]] = {}  # name -> (stamp, cells)
        self._name_width = 20

    @property
    def names(self) -> list[str]:
        """The metrics listed, in order (after the filter)."""
        return self._names

    def update_data(self) -> None:
        """Rebuild the rows from the runs' last values."""
        board = self.board
        names = sorted(n for n in board.available_metrics() if self.matches(n))
        key = (board.runs_version, len(board.runs), tuple(names))
        if key != self._key:
            self._key = key
            self._names = names
            self._name_width = max([len(n) + 2 for n in names] + [20])
            self.virtual_size = Size(self._name_width + (len(board.runs) + 2) * VALUE_WIDTH + SPARK_WIDTH + 4,
                                     len(names) + 1)
            self.cursor = min(self.cursor, max(0, len(names) - 1))
        self.refresh()

    # ------------------------------------------------------------------ keys and mouse
    def action_cursor_down(self) -> None:
        """Move the cursor one row down."""
        self._move(1)

    def action_cursor_up(self) -> None:
        """Move the cursor one row up."""
        self._move(-1)

    def _move(self, delta: int) -> None:
        if self._names:
            self.cursor = max(0, min(len(self._names) - 1, self.cursor + delta))

    def watch_cursor(self, old: int, new: int) -> None:
        """Keep the cursor row on screen (row i is drawn at line i + 1, under the header)."""
        top = int(self.scroll_y)
        visible = max(1, self.size.height - 1)
        if new < top:
            self.scroll_to(y=new, animate=False)
        elif new >= top + visible:
            self.scroll_to(y=new - visible + 1, animate=False)
        self.refresh()

    def action_open_chart(self) -> None:
        """Open the metric under the cursor as a chart."""
        if self._names:
            name = self._names[self.cursor]
            self.post_message(OpenChart(name, (name,)))

    def on_click(self, event: events.Click) -> None:
        """A click selects a row; a click on the selected row opens its chart."""
        row = int(self.scroll_y) + event.y - 1
        if event.y >= 1 and 0 <= row < len(self._names):
            if row == self.cursor:
                self.action_open_chart()
            self.cursor = row

    # ------------------------------------------------------------------ drawing
    def render_line(self, y: int) -> Strip:
        """Line `y` of the metric list."""
        width = self.size.width
        scroll_x = int(self.scroll_x)
        if y == 0:
            cells = [("metric".ljust(self._name_width), _HEADER)]
            board = self.board
            for i, run in enumerate(board.runs):
                cells.append((run.name[: VALUE_WIDTH - 1].rjust(VALUE_WIDTH), Style(bold=True, color=board.color(i))))
            cells += [("min".rjust(VALUE_WIDTH), _HEADER), ("max".rjust(VALUE_WIDTH), _HEADER),
                      ("  trend", _HEADER)]
            return _strip(cells, scroll_x, width)
        index = int(self.scroll_y) + y - 1
        if index >= len(self._names):
            return Strip.blank(width)
        strip = _strip(self._cells(self._names[index]), scroll_x, width)
        return strip.apply_style(_CURSOR) if index == self.cursor and self.has_focus else strip

    def _cells(self, name: str) -> list[tuple[str, Style]]:
        board = self.board
        stamp = (board.generation, board.standing.get(name))
        cached = self._rows.get(name)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        runs = board.runs
        level = board.alert_level([name])
        label = ("⚠ " if level else "") + name
        cells = [(label.ljust(self._name_width), Style(color=level_color(level)) if level else Style())]
        lo = hi = None
        trend: list[float] = []
        for i, run in enumerate(runs):
            value = run.table.last_value(name)
            style = Style(color=board.color(i)) if len(runs) > 1 else Style()
            cells.append((fmt_value(value).rjust(VALUE_WIDTH), style))
            span = run.table.column_range(name)
            if span is not None:
                lo = span[0] if lo is None else min(lo, span[0])
                hi = span[1] if hi is None else max(hi, span[1])
                if not trend:
                    trend = run.table.column(name)[-4 * SPARK_WIDTH :][::4].tolist()
        cells.append((fmt_value(lo).rjust(VALUE_WIDTH), _DIM))
        cells.append((fmt_value(hi).rjust(VALUE_WIDTH), _DIM))
        cells.append(("  " + fmt_spark(trend, SPARK_WIDTH), _TREND))
        self._rows[name] = (stamp, cells)
        return cells


def _strip(cells: list[tuple[str, Style]], scroll_x: int, width: int) -> Strip:
    strip = Strip([Segment(text, style) for text, style in cells])
    return strip.crop(scroll_x, scroll_x + width).extend_cell_length(width)
