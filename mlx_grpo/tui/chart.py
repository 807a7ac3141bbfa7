"""A braille line chart of one or more metrics over steps, for one or more runs.

Raw values are drawn dim as min/max per screen column (spikes stay visible),
the smoothed line bright on top. The drawing is cached and redone only when a
run's data, the size, the smoothing or the alert state changed.
"""

from __future__ import annotations

import numpy as np
from rich.segment import Segment
from rich.style import Style
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget

from .downsample import bucketize

from .board import Board
from .board_widget import BoardWidget
from .braille import Layer, nice_range, render_cells
from .fmt import fmt_value
from .messages import OpenChart
from .palette import MUTED, RUN_COLORS, TEXT, dim

AXIS_WIDTH = 7
_AXIS_STYLE = Style(color=MUTED)
_LEGEND_STYLE = Style(color=TEXT)


def short_name(metric: str) -> str:
    """`rewards/answer_check/mean` -> `answer_check/mean`: enough to tell lines apart."""
    parts = metric.split("/")
    return "/".join(parts[1:]) if len(parts) > 1 else metric


def legend_names(metrics: list[str]) -> list[str]:
    """Names without the path segments all of them share, front and back.

    [rewards/a/mean, rewards/b/mean] -> [a, b]; [accuracy/train, eval/accuracy]
    stay whole; a single metric keeps its full name.
    """
    if len(metrics) < 2:
        return list(metrics)
    parts = [m.split("/") for m in metrics]
    shortest = min(len(p) for p in parts)
    front = 0
    while front < shortest - 1 and len({p[front] for p in parts}) == 1:
        front += 1
    back = 0
    while back < shortest - front - 1 and len({p[-1 - back] for p in parts}) == 1:
        back += 1
    return ["/".join(p[front : len(p) - back]) for p in parts]


class MetricChart(BoardWidget, Widget, can_focus=True):
    """Chart of `metrics` for every run on the board. Enter or a click opens it on a screen of its own."""

    def __init__(self, board: Board, title: str, metrics: list[str], *, id: str | None = None):
        super().__init__(board, id=id)
        self.chart_title = title
        self.metrics = list(metrics)
        self._key: tuple | None = None
        self._strips: list[Strip] = []
        self.legend: list[tuple[str, str, float | None]] = []  # (label, colour, last value)

    def update_data(self) -> None:
        """Recompute if anything the drawing depends on changed."""
        board = self.board
        level = board.alert_level(self.metrics)
        self.set_class(level == "warning", "alert-warning")
        self.set_class(level == "error", "alert-error")
        key = (
            board.runs_version, tuple((len(r.table), r.table.version, r.table.epoch) for r in board.runs),
            self.size.width, self.size.height, board.smoothing, level,
        )
        if key == self._key:
            return
        resized = self._key is None or key[2:4] != self._key[2:4]
        self._key = key
        title = ("⚠ " if level else "") + self.chart_title
        if self.border_title != title:
            self.border_title = title
        old, self._strips = self._strips, self._draw(board)
        if resized or len(old) != len(self._strips):
            self.refresh()
            return
        # On a long run one more step changes few screen columns: repaint only changed lines.
        for y, (before, after) in enumerate(zip(old, self._strips)):
            if before != after:
                self.refresh(Region(0, y, self.size.width, 1))

    def on_resize(self) -> None:
        """Redraw for the new size."""
        self.update_data()

    def chart_request(self) -> OpenChart:
        """The message that opens this chart on a screen of its own."""
        return OpenChart(self.chart_title, tuple(self.metrics))

    def on_click(self) -> None:
        """A click opens the chart on its own screen."""
        self.post_message(self.chart_request())

    def render_line(self, y: int) -> Strip:
        """Line `y` of the drawn chart."""
        if y < len(self._strips):
            return self._strips[y]
        return Strip.blank(self.size.width)

    # ------------------------------------------------------------------ drawing
    def _series(self, board: Board) -> list[tuple[str, str, np.ndarray, np.ndarray, np.ndarray]]:
        """(legend label, colour, steps, values, smoothed values) of every line to draw."""
        out = []
        several_runs = len(board.runs) > 1
        names = legend_names(self.metrics)
        for ri, run in enumerate(board.runs):
            for mi, metric in enumerate(self.metrics):
                points = board.series(ri, metric)
                if points is None or not len(points[0]):
                    continue
                if several_runs:
                    label = run.name if len(self.metrics) == 1 else f"{run.name}:{names[mi]}"
                    color = board.color(ri)
                else:
                    label = names[mi]
                    color = RUN_COLORS[mi % len(RUN_COLORS)]
                out.append((label, color, *points))
        return out

    def _draw(self, board: Board) -> list[Strip]:
        width, height = self.size.width, self.size.height
        plot_w, plot_h = width - AXIS_WIDTH - 1, height - 1
        series = self._series(board)
        self.legend = [(label, color, float(ys[-1])) for label, color, _, ys, _ in series]
        if plot_w < 4 or plot_h < 1 or not series:
            message = "no data yet" if not series else ""
            return [Strip([Segment(message.center(width)[:width], _AXIS_STYLE)])] if height else []
        x0 = min(float(xs[0]) for _, _, xs, _, _ in series)
        x1 = max(float(xs[-1]) for _, _, xs, _, _ in series)
        layers = []
        y_lo, y_hi = np.inf, -np.inf
        for label, color, xs, ys, smoothed in series:
            raw = bucketize(xs, ys, x0, x1, 2 * plot_w)
            y_lo, y_hi = min(y_lo, float(raw.lo.min())), max(y_hi, float(raw.hi.max()))
            if board.smoothing > 0:
                layers.append(Layer(raw, dim(color), z=0))
                layers.append(Layer(bucketize(xs, smoothed, x0, x1, 2 * plot_w), color, z=1))
            else:
                layers.append(Layer(raw, color, z=1))
        y_lo, y_hi = nice_range(y_lo, y_hi)
        chars, owners = render_cells(layers, plot_w, plot_h, y_lo, y_hi)
        styles = [_style(layer.color) for layer in layers]
        labels = {0: fmt_value(y_hi), plot_h - 1: fmt_value(y_lo)}
        if plot_h >= 5:
            labels[(plot_h - 1) // 2] = fmt_value((y_lo + y_hi) / 2)
        strips = []
        for row in range(plot_h):
            segs = [Segment(labels.get(row, "").rjust(AXIS_WIDTH)[:AXIS_WIDTH] + "┤", _AXIS_STYLE)]
            segs.extend(_runs(chars[row], owners[row], styles))
            strips.append(Strip(segs, width))
        strips.append(self._axis_line(x0, x1, series, width, plot_w))
        return strips

    @staticmethod
    def _axis_line(x0: float, x1: float, series: list, width: int, plot_w: int) -> Strip:
        """The step range at both ends and, between them, the legend with each line's last value."""
        left, right = f"{x0:,.0f}", f"{x1:,.0f}"
        room = plot_w - len(left) - len(right) - 2
        legend: list[Segment] = []
        used = 0
        for label, color, _, ys, _ in series:
            entry = f"{label} {fmt_value(float(ys[-1]))}"
            need = len(entry) + 2 + (2 if legend else 0)
            if used + need > room:
                if room - used >= 1:
                    legend.append(Segment("…", _AXIS_STYLE))
                    used += 1
                break
            if legend:
                legend.append(Segment("  "))
            legend += [Segment("■ ", _style(color)), Segment(entry, _LEGEND_STYLE)]
            used += need
        pad = max(0, room - used)
        segs = [Segment(" " * (AXIS_WIDTH + 1) + left + " " * (1 + pad // 2), _AXIS_STYLE), *legend,
                Segment(" " * (1 + pad - pad // 2) + right, _AXIS_STYLE)]
        return Strip(segs).crop(0, width).extend_cell_length(width)


_STYLES: dict[str, Style] = {}
_PLAIN = Style()


def _style(color: str) -> Style:
    style = _STYLES.get(color)
    if style is None:
        style = _STYLES[color] = Style(color=color)
    return style


def _runs(chars: list[str], owners: list[int], styles: list[Style]) -> list[Segment]:
    """Merge neighbouring cells coloured by the same layer into one segment."""
    segs = []
    start = 0
    n = len(chars)
    for i in range(1, n + 1):
        if i == n or owners[i] != owners[start]:
            owner = owners[start]
            segs.append(Segment("".join(chars[start:i]), styles[owner] if owner >= 0 else _PLAIN))
            start = i
    return segs
