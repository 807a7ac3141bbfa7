"""System view: resource tiles, a sparkline per resource, accelerator memory against its limit."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Label, Sparkline

from mlx_grpo.telemetry.downsample import bucketize, finite_points

from .chart_view import ChartsView
from .fmt import fmt_value
from .views import SYSTEM, SYSTEM_SPARKLINES

# Points handed to a Sparkline: it buckets them to its width itself, so keep
# the list short and the cost flat whatever the run length.
SPARK_POINTS = 120


class SparkRow(Horizontal):
    def __init__(self, label: str, metric: str):
        super().__init__(classes="spark-row")
        self.label = label
        self.metric = metric

    def compose(self) -> ComposeResult:
        yield Label(self.label, classes="spark-label")
        yield Sparkline([], summary_function=max, classes="spark")
        yield Label("", classes="spark-value")


class SystemView(ChartsView):
    def __init__(self, *, id: str | None = None):
        super().__init__(SYSTEM, id=id)

    def compose_extra(self) -> ComposeResult:
        yield Vertical(*(SparkRow(label, metric) for label, metric in SYSTEM_SPARKLINES), classes="sparks")

    def update_extra(self) -> None:
        board = self.board
        # The first run's resources: overlaying machines in one sparkline would mislead.
        run = board.runs[0]
        for row in self.query(SparkRow):
            col = run.table.column(row.metric)
            show = col is not None and board.matches_filter(row.label, row.metric)
            if row.display != show:
                row.display = show
            if not row.display:
                continue
            xs, ys = finite_points(run.table.steps, col)
            if not len(xs):
                continue
            buckets = bucketize(xs, ys, float(xs[0]), float(xs[-1]), SPARK_POINTS)
            row.query_one(Sparkline).data = buckets.hi.tolist()
            limit = ""
            if row.metric == "system/accel_active_gb":
                cap = run.table.last_value("system/accel_limit_gb")
                limit = f" / {fmt_value(cap)}" if cap else ""
            row.query_one(".spark-value", Label).update(fmt_value(float(ys[-1])) + limit, layout=False)
