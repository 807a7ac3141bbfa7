"""A view of metric tiles above charts, built from a ViewSpec (views.py).

The arrow keys (or h j k l) move a selection over the tiles and charts; Enter
opens the selected one as a chart of its own.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Vertical, VerticalScroll
from textual.widget import Widget
from textual.widgets import Static

from ..telemetry.metrics.names import legend_names
from .board import Board
from .board_widget import BoardView
from .chart import MetricChart
from .tile import MetricTile
from .views import ViewSpec, resolve


def split_for_runs(title: str, metrics: list[str], runs: int) -> list[tuple[str, tuple[str, ...]]]:
    """(title, metrics) of the charts that show these metrics.

    With several runs each run gets one colour, so a chart of several metrics
    is split into one chart per metric.
    """
    if runs > 1 and len(metrics) > 1:
        return [(f"{title}: {name}", (m,)) for m, name in zip(metrics, legend_names(metrics))]
    return [(title, tuple(metrics))]


def waiting_text(board: Board) -> str:
    """What a run with no metric record yet is doing, so the first minutes are not a blank screen: the
    held-out evaluation before the first update (minutes for a real model), or loading and the first step."""
    lines = []
    for run in board.runs:
        config = run.info.config if run.info is not None and isinstance(run.info.config, dict) else {}
        if not run.exists:
            lines.append(f"{run.name}: waiting for the run directory to appear")
        elif config.get("eval_every"):
            size = config.get("eval_size")
            lines.append(f"{run.name}: evaluating held-out accuracy{f' ({size} prompts)' if size else ''} before "
                         "the first update, then the first step; charts appear with the first metrics")
        else:
            lines.append(f"{run.name}: loading the model and running the first step; charts appear with its metrics")
    return "\n".join(lines)


TILES_PER_ROW = 4  # watch.tcss: .tiles grid-size


class ChartsView(BoardView, VerticalScroll):
    """A view of metric tiles above charts, as its ViewSpec says; arrows select, enter opens."""

    BINDINGS = [
        Binding("down,j", "select('down')", "down", show=False),
        Binding("up,k", "select('up')", "up", show=False),
        Binding("right,l", "select('right')", "right", show=False),
        Binding("left,h", "select('left')", "left", show=False),
        Binding("enter", "open_selected", "open as chart", show=False),
    ]

    def __init__(self, board: Board, spec: ViewSpec, *, id: str | None = None):
        super().__init__(board, id=id, classes="charts-view")
        self.spec = spec
        self._plan: list[tuple[str, tuple[str, ...]]] | None = None

    def compose(self) -> ComposeResult:
        """The tiles, the extra widgets of a subclass, and a box the charts are mounted in."""
        yield Static("", classes="waiting-note")
        # the tiles past the first row give way in a short terminal (watch.tcss: -short), so the charts' legends fit
        tiles = [MetricTile(self.board, label, metric) for label, metric in self.spec.tiles]
        for tile in tiles[TILES_PER_ROW:]:
            tile.add_class("-second-row")
        yield Grid(*tiles, classes="tiles")
        yield from self.compose_extra()
        yield Vertical(classes="charts")

    def compose_extra(self) -> ComposeResult:
        """Widgets between the tiles and the charts (the system view's sparklines)."""
        return iter(())

    def chart_plan(self, board: Board) -> list[tuple[str, tuple[str, ...]]]:
        """(title, metrics) of each chart for the metrics the runs have."""
        available = board.available_metrics()
        plan, families = [], []
        for spec in self.spec.charts:
            metrics = resolve(spec, available)
            charts = split_for_runs(spec.title, metrics, len(board.runs)) if metrics else []
            # Several runs split a family of metrics (one chart per reward function) into many charts:
            # they follow the view's other charts, so accuracy stays on the first screen.
            (families if len(charts) > 2 else plan).extend(charts)
        return plan + families

    def update_data(self) -> None:
        """Show the tiles and charts the runs have data for and the filter keeps; redraw them."""
        board = self.board
        available = set(board.available_metrics())
        note = self.query_one(".waiting-note", Static)
        waiting = waiting_text(board) if not available else ""
        if note.display != bool(waiting):
            note.display = bool(waiting)
        if waiting:
            note.update(waiting)
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

    # ------------------------------------------------------------------ selection
    def _grid(self) -> list[tuple[MetricTile | MetricChart, int, float]]:
        """Each shown tile and chart with its row and the middle of its column (0..1), top to bottom."""
        cells: list[tuple[MetricTile | MetricChart, int, float]] = []
        row = 0
        for box, kind in ((self.query_one(".tiles"), MetricTile), (self.query_one(".charts"), MetricChart)):
            columns = max(1, box.styles.grid_size_columns or 1)
            shown = [w for w in box.query(kind) if w.display]
            cells.extend((w, row + i // columns, (i % columns + 0.5) / columns) for i, w in enumerate(shown))
            row += -(-len(shown) // columns)
        return cells

    def action_select(self, direction: str) -> None:
        """Move the selection to the nearest tile or chart in `direction`."""
        cells = self._grid()
        if not cells:
            return
        at = next((i for i, (w, _, _) in enumerate(cells) if w is self.screen.focused), None)
        target: Widget | None
        if at is None:
            target = cells[0][0]
        elif direction in ("left", "right"):
            target = cells[max(0, min(len(cells) - 1, at + (1 if direction == "right" else -1)))][0]
        else:
            _, row, middle = cells[at]
            wanted = row + (1 if direction == "down" else -1)
            beside = [(abs(x - middle), w) for w, r, x in cells if r == wanted]
            # Up from the top row gives the keyboard back to the view (nothing selected).
            target = min(beside, key=lambda c: c[0])[1] if beside else (self if direction == "up" else None)
        if target is not None:
            # Now, not on the next idle as Widget.focus() does: keys typed fast act on the new selection.
            self.screen.set_focus(target)

    def action_open_selected(self) -> None:
        """Open the selected tile or chart as a chart of its own."""
        selected = self.screen.focused  # this binding fires only while the focus is in this view
        if isinstance(selected, (MetricTile, MetricChart)):
            self.post_message(selected.chart_request())
