"""One metric (or one chart's metrics) on a screen of its own: a big chart, what the metric is, and per run
its last, lowest, highest and mean value. It follows the run like the views do; Escape or Enter goes back.
"""

from __future__ import annotations

import numpy as np
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Static

from ..telemetry.metrics.catalogue import find_entry
from .board import Board
from .board_widget import BoardWidget
from .chart import MetricChart
from .chart_view import split_for_runs
from .fmt import fmt_value
from .messages import OpenChart
from .palette import LABEL, MUTED


def describe(metrics: tuple[str, ...]) -> Text:
    """Each metric's name, unit and description from the catalogue (names it does not know are listed bare)."""
    text = Text()
    for i, metric in enumerate(metrics):
        entry = find_entry(metric)
        if i:
            text.append("\n")
        text.append(metric, style="bold")
        if entry is not None:
            text.append(f"  ({entry.unit})  " if entry.unit else "  ", style=MUTED)
            text.append(entry.description)
    return text


def stats_table(board: Board, metrics: tuple[str, ...]) -> Table:
    """Per run and metric: last, lowest, highest and mean of the logged values, and how many there are."""
    table = Table(box=None, header_style=f"bold {LABEL}", padding=(0, 2, 0, 0), expand=False)
    for column in ("run", "metric", "last", "min", "max", "mean", "points", "last step"):
        table.add_column(column, justify="left" if column in ("run", "metric") else "right")
    for metric in metrics:
        for i, run in enumerate(board.runs):
            points = board.series(i, metric)
            if points is None or not len(points[0]):
                continue
            steps, values, _ = points
            table.add_row(Text(run.name, style=board.color(i)), metric, fmt_value(float(values[-1])),
                          fmt_value(float(values.min())), fmt_value(float(values.max())),
                          fmt_value(float(np.mean(values))), f"{len(values):,}", f"{int(steps[-1]):,}")
    return table


class ChartScreen(BoardWidget, Screen):
    """One chart over the whole screen; escape or enter goes back."""

    BINDINGS = [Binding("escape,enter", "app.pop_screen", "back")]

    def __init__(self, board: Board, title: str, metrics: tuple[str, ...]):
        super().__init__(board)
        self.chart_title = title
        self.metrics = metrics
        self._generation = -1

    def compose(self) -> ComposeResult:
        """The chart and a footer."""
        yield Static(describe(self.metrics), id="chart-about")
        with Vertical(id="chart-box"):
            for title, metrics in split_for_runs(self.chart_title, list(self.metrics), len(self.board.runs)):
                chart = MetricChart(self.board, title, list(metrics))
                chart.can_focus = False  # nothing to select here: the keys go to the screen
                yield chart
        yield Static("", id="chart-stats")
        yield Static("escape or enter: back · s smoothing · p pause · q quit", id="chart-keys")

    def on_mount(self) -> None:
        """Draw the chart once it has a size."""
        self.update_data()

    def update_data(self) -> None:
        """Redraw when the runs' data changed."""
        for chart in self.query(MetricChart):
            chart.update_data()
        if self.board.generation != self._generation:
            self._generation = self.board.generation
            self.query_one("#chart-stats", Static).update(stats_table(self.board, self.metrics))

    def on_open_chart(self, event: OpenChart) -> None:
        """A click on the chart shown here: it is open already, so the request stops here."""
        event.stop()  # a click on the chart shown here: it is open already
