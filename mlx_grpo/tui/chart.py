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

from ..telemetry.metrics.names import legend_names
from .board import Board
from .board_widget import BoardWidget
from .braille import Layer, log_ticks, nice_range, nice_ticks, render_cells
from .downsample import bucketize
from .fmt import fmt_value
from .messages import OpenChart
from .palette import GRID, MUTED, RUN_COLORS, TEXT, dim

AXIS_WIDTH = 7
_AXIS_STYLE = Style(color=MUTED)
_LEGEND_STYLE = Style(color=TEXT)


class MetricChart(BoardWidget, Widget, can_focus=True):
    """Chart of `metrics` for every run on the board. Enter or a click opens it on a screen of its own."""

    def __init__(self, board: Board, title: str, metrics: list[str], *, id: str | None = None):
        super().__init__(board, id=id)
        self.chart_title = title
        self.metrics = list(metrics)
        self._key: tuple | None = None
        self._strips: list[Strip] = []
        self.legend: list[tuple[str, str, float | None]] = []  # (label, colour, last value)
        self.log_scale = False  # drawn on a log axis (asked for, and every value positive)

    def update_data(self) -> None:
        """Recompute if anything the drawing depends on changed."""
        board = self.board
        level = board.alert_level(self.metrics)
        self.set_class(level == "warning", "alert-warning")
        self.set_class(level == "error", "alert-error")
        key = (
            board.runs_version, tuple((len(r.table), r.table.version, r.table.epoch) for r in board.runs),
            self.size.width, self.size.height, board.smoothing, board.log_scale, level,
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
        plot_w = width - AXIS_WIDTH - 1
        series = self._series(board)
        self.legend = [(label, color, float(ys[-1])) for label, color, _, ys, _ in series]
        if plot_w < 4 or height < 2 or not series:
            message = "no data yet" if not series else ""
            return [Strip([Segment(message.center(width)[:width], _AXIS_STYLE)])] if height else []
        x0 = min(float(xs[0]) for _, _, xs, _, _ in series)
        x1 = max(float(xs[-1]) for _, _, xs, _, _ in series)
        legend_rows = legend_lines(series, plot_w, max(1, height - 4))
        plot_h = height - len(legend_rows)
        # Log scale only where every value is positive (a log axis has no zero); else the chart stays linear.
        self.log_scale = board.log_scale and all(float(ys.min()) > 0 for _, _, _, ys, _ in series)
        scale = np.log10 if self.log_scale else (lambda v: v)
        layers = []
        y_lo, y_hi = np.inf, -np.inf
        for label, color, xs, ys, smoothed in series:
            raw = bucketize(xs, scale(ys), x0, x1, 2 * plot_w)
            y_lo, y_hi = min(y_lo, float(raw.lo.min())), max(y_hi, float(raw.hi.max()))
            if board.smoothing > 0:
                layers.append(Layer(raw, dim(color), z=0))
                layers.append(Layer(bucketize(xs, scale(np.maximum(smoothed, 1e-300) if self.log_scale else smoothed),
                                              x0, x1, 2 * plot_w), color, z=1))
            else:
                layers.append(Layer(raw, color, z=1))
        y_lo, y_hi = nice_range(y_lo, y_hi) if not self.log_scale else _log_range(y_lo, y_hi)
        chars, owners = render_cells(layers, plot_w, plot_h, y_lo, y_hi)
        styles = [_style(layer.color) for layer in layers]
        labels = self._tick_labels(y_lo, y_hi, plot_h)
        if len(labels) < 2:  # too short for round values: the ends
            top, bottom = (10.0 ** y_hi, 10.0 ** y_lo) if self.log_scale else (y_hi, y_lo)
            labels = {0: fmt_value(top), plot_h - 1: fmt_value(bottom)}
        strips = []
        for row in range(plot_h):
            segs = [Segment(labels.get(row, "").rjust(AXIS_WIDTH)[:AXIS_WIDTH] + ("┼" if row in labels else "│"),
                            _AXIS_STYLE)]
            segs.extend(_runs(chars[row], owners[row], styles, grid=row in labels))
            strips.append(Strip(segs, width))
        strips.append(self._axis_line(x0, x1, width, plot_w, legend_rows[0], self.log_scale))
        strips += [Strip([Segment(" " * (AXIS_WIDTH + 1)), *row]).crop(0, width).extend_cell_length(width)
                   for row in legend_rows[1:]]
        return strips

    def _tick_labels(self, y_lo: float, y_hi: float, plot_h: int) -> dict[int, str]:
        """Row -> label of round values (with a gridline): as many as fit with an empty row between two."""
        make = log_ticks if self.log_scale else nice_ticks
        for most in range(max(2, (plot_h + 1) // 2), 1, -1):
            rows = {}
            for tick in make(y_lo, y_hi, most):
                row = int(round((y_hi - tick) / (y_hi - y_lo) * (plot_h - 1))) if y_hi > y_lo else 0
                if 0 <= row < plot_h:
                    rows[row] = fmt_value(10.0 ** tick if self.log_scale else tick)
            ordered = sorted(rows)
            if len(ordered) >= 2 and all(b - a >= 2 for a, b in zip(ordered, ordered[1:])):
                return rows
        return {}

    @staticmethod
    def _axis_line(x0: float, x1: float, width: int, plot_w: int, legend: list[Segment], log: bool) -> Strip:
        """The step range at both ends and, between them, the legend's first line."""
        left, right = f"{x0:,.0f}", f"{x1:,.0f}" + (" log" if log else "")
        used = sum(len(seg.text) for seg in legend)
        pad = max(0, plot_w - len(left) - len(right) - 2 - used)
        segs = [Segment(" " * (AXIS_WIDTH + 1) + left + " " * (1 + pad // 2), _AXIS_STYLE), *legend,
                Segment(" " * (1 + pad - pad // 2) + right, _AXIS_STYLE)]
        return Strip(segs).crop(0, width).extend_cell_length(width)


def legend_lines(series: list, plot_w: int, most: int) -> list[list[Segment]]:
    """The legend, every line's name and last value, wrapped onto as many lines as it needs (at most
    `most`; the first shares the line of the step axis). Names are never cut: a name that would not fit
    starts the next line, and only when `most` lines are full does the last end with '+N more'."""
    rows: list[list[Segment]] = [[]]
    room = plot_w - 16  # the first line leaves room for the step range at both ends
    used = 0
    for index, (label, color, _, ys, _) in enumerate(series):
        entry = f"{label} {fmt_value(float(ys[-1]))}"
        need = len(entry) + 2 + (2 if rows[-1] else 0)
        if used + need > room and rows[-1]:
            if len(rows) == most:
                rows[-1].append(Segment(f"  +{len(series) - index} more", _AXIS_STYLE))
                break
            rows.append([])
            room, used, need = plot_w, 0, len(entry) + 2
        if rows[-1]:
            rows[-1].append(Segment("  "))
        rows[-1] += [Segment("■ ", _style(color)), Segment(entry, _LEGEND_STYLE)]
        used += need
    return rows


def _log_range(lo: float, hi: float) -> tuple[float, float]:
    """A log10 range with a little headroom (and a decade's band around a flat series)."""
    if hi - lo < 1e-9:
        return lo - 0.5, hi + 0.5
    pad = (hi - lo) * 0.04
    return lo - pad, hi + pad


_STYLES: dict[str, Style] = {}
_PLAIN = Style()


def _style(color: str) -> Style:
    style = _STYLES.get(color)
    if style is None:
        style = _STYLES[color] = Style(color=color)
    return style


_GRID = "┈"
_GRID_STYLE = Style(color=GRID)


def _runs(chars: list[str], owners: list[int], styles: list[Style], grid: bool = False) -> list[Segment]:
    """Merge neighbouring cells coloured by the same layer into one segment; on a gridline row the empty
    cells draw the gridline."""
    if grid:
        chars = [_GRID if owner < 0 else c for c, owner in zip(chars, owners)]
        styles = [*styles, _GRID_STYLE]
        owners = [len(styles) - 1 if owner < 0 else owner for owner in owners]
    segs = []
    start = 0
    n = len(chars)
    for i in range(1, n + 1):
        if i == n or owners[i] != owners[start]:
            owner = owners[start]
            segs.append(Segment("".join(chars[start:i]), styles[owner] if owner >= 0 else _PLAIN))
            start = i
    return segs
