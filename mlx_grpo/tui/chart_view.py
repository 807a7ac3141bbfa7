"""A view of metric tiles above charts, built from a ViewSpec (views.py)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Grid, Vertical, VerticalScroll

from .board import Board
from .board_widget import BoardView
from .chart import MetricChart, short_name
from .tile import MetricTile
from .views import ViewSpec, resolve


class ChartsView(BoardView, VerticalScroll):
    def __init__(self, board: Board, spec: ViewSpec, *, id: str | None = None):
        super().__init__(board, id=id, classes="charts-view")
        self.spec = spec
        self._plan: list[tuple[str, tuple[str, ...]]] | None = None

    def compose(self) -> ComposeResult:
        yield Grid(*(MetricTile(self.board, label, metric) for label, metric in self.spec.tiles), classes="tiles")
        yield from self.compose_extra()
        yield Vertical(classes="charts")

    def compose_extra(self) -> ComposeResult:
        """Widgets between the tiles and the charts (the system view's sparklines)."""
        return iter(())

    def chart_plan(self, board: Board) -> list[tuple[str, tuple[str, ...]]]:
        """(title, metrics) of each chart for the metrics the runs have.

        With several runs each run gets one colour, so a chart of several
        metrics is split into one chart per metric.
        """
        available = board.available_metrics()
        plan = []
        for spec in self.spec.charts:
            metrics = resolve(spec, available)
            if not metrics:
                continue
            if len(board.runs) > 1 and len(metrics) > 1:
                plan.extend((f"{spec.title}: {short_name(m)}", (m,)) for m in metrics)
            else:
                plan.append((spec.title, tuple(metrics)))
        return plan

    def update_data(self) -> None:
        board = self.board
        available = set(board.available_metrics())
        for tile in self.query(MetricTile):
            show = tile.metric in available and self.matches(tile.label, tile.metric)
            if tile.display != show:  # assigning display, even unchanged, costs a layout pass
                tile.display = show
            if show:
                tile.update_data()
        self.update_extra()
        plan = self.chart_plan(board)
        if plan != self._plan:
            self._plan = plan
            box = self.query_one(".charts", Vertical)
            box.remove_children()
            box.mount_all([MetricChart(board, title, list(metrics)) for title, metrics in plan])
            # Mounted charts get their first data on resize, once they have a size.
            return
        for chart in self.query(MetricChart):
            show = self.matches(chart.chart_title, *chart.metrics)
            if chart.display != show:
                chart.display = show
            if show:
                chart.update_data()

    def update_extra(self) -> None:
        """Refresh the widgets of compose_extra()."""
