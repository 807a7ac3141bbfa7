"""System view: resource tiles, a sparkline per resource, accelerator memory against its limit."""

from __future__ import annotations

import numpy as np
from rich.segment import Segment
from rich.style import Style
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Label

from ..telemetry.metrics.names import ACCEL_ACTIVE_GB, ACCEL_LIMIT_GB
from .board import Board
from .chart_view import ChartsView
from .downsample import bucketize, finite_points
from .fmt import fmt_spark, fmt_value
from .palette import SPARK
from .views import SYSTEM, SYSTEM_SPARKLINES

_SPARK_STYLE = Style(color=SPARK)


class SparkLine(Widget):
    """One line of block characters: the maximum of each screen column's steps.

    Drawn from min/max buckets (cheap for any run length); Textual's Sparkline
    widget costs more per redraw than the whole refresh budget allows.
    """

    def __init__(self, metric: str):
        super().__init__(classes="spark")
        self.metric = metric
        # A percentage reads against its real range, 0-100% (18% memory is a short bar, not a full one).
        self.scale_range = (0.0, 100.0) if metric.endswith("_percent") else None
        self._points = None
        self._key: tuple | None = None
        self._text = ""

    def set_points(self, xs, ys) -> None:
        """Draw these points."""
        self._points = (xs, ys)
        self.refresh()

    def render_line(self, y: int) -> Strip:
        """The sparkline, made for the width it has."""
        width = self.size.width
        if y != 0 or self._points is None:
            return Strip.blank(width)
        xs, ys = self._points
        key = (len(xs), float(xs[-1]) if len(xs) else None, width)
        if key != self._key:  # drawn at render time: the width is known only once laid out
            self._key = key
            self._text = ""
            if len(xs) and width > 0:
                peaks = bucketize(xs, ys, float(xs[0]), float(xs[-1]), width).hi
                # Fewer points than columns: widen each point so the line spans the row.
                peaks = peaks[np.arange(width) * len(peaks) // width]
                self._text = fmt_spark(peaks.tolist(), width, self.scale_range)
        return Strip([Segment(self._text, _SPARK_STYLE)]).extend_cell_length(width)


class SparkRow(Horizontal):
    """A label, a sparkline of one metric and its last value."""

    def __init__(self, label: str, metric: str):
        super().__init__(classes="spark-row")
        self.label = label
        self.metric = metric

    def compose(self) -> ComposeResult:
        """The label, the line and the value."""
        yield Label(self.label, classes="spark-label")
        yield SparkLine(self.metric)
        yield Label("", classes="spark-value")


class SystemView(ChartsView):
    """Resource tiles, a sparkline per resource, accelerator memory against its limit."""

    def __init__(self, board: Board, *, id: str | None = None):
        super().__init__(board, SYSTEM, id=id)

    def compose_extra(self) -> ComposeResult:
        """The sparklines, under the tiles."""
        yield Vertical(*(SparkRow(label, metric) for label, metric in SYSTEM_SPARKLINES), classes="sparks")

    def update_extra(self) -> None:
        """Redraw the sparklines from the first run (one machine's resources)."""
        board = self.board
        # The first run's resources: overlaying machines in one sparkline would mislead.
        run = board.runs[0]
        for row in self.query(SparkRow):
            col = run.table.column(row.metric)
            show = col is not None and self.matches(row.label, row.metric)
            if row.display != show:
                row.display = show
            if not show:
                continue
            xs, ys = finite_points(run.table.steps, col)
            if not len(xs):
                continue
            row.query_one(SparkLine).set_points(xs, ys)
            limit = ""
            if row.metric == ACCEL_ACTIVE_GB:
                cap = run.table.last_value(ACCEL_LIMIT_GB)
                limit = f" / {fmt_value(cap)}" if cap else ""
            row.query_one(".spark-value", Label).update(fmt_value(float(ys[-1])) + limit, layout=False)
