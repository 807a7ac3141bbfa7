"""Line charts drawn with braille characters (2x4 dots per terminal cell).

Everything is vectorised with numpy over screen columns: the input is one
min/max bucket per dot column (see mlx_grpo.telemetry.downsample), so the cost
depends on the chart's size, never on the run's length.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .downsample import Buckets

# Bit of each dot in a braille cell, indexed [row 0..3][col 0..1] (Unicode order).
_DOT_BITS = np.array([[0x01, 0x08], [0x02, 0x10], [0x04, 0x20], [0x40, 0x80]], dtype=np.int64)
_CHARS = [chr(0x2800 + m) if m else " " for m in range(256)]


@dataclass
class Layer:
    """One series to draw: buckets over the dot columns, a colour, and a z-order."""

    buckets: Buckets
    color: str
    z: int = 0


def dot_spans(b: Buckets, ncols: int, y_lo: float, y_hi: float, nrows: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Top and bottom dot row per dot column (-1 where nothing is drawn).

    Columns without points between two that have them are filled by linear
    interpolation, and each column's span reaches back to the previous column's
    last value, so the result reads as a continuous line that keeps spikes.
    """
    if len(b.columns) == 0:
        return None
    cols = np.arange(ncols)
    c0, c1 = int(b.columns[0]), int(b.columns[-1])
    first = np.interp(cols, b.columns, b.first)
    last = np.interp(cols, b.columns, b.last)
    lo = np.interp(cols, b.columns, b.lo)
    hi = np.interp(cols, b.columns, b.hi)
    # An empty column is a point on the straight line between its neighbours.
    empty = np.ones(ncols, dtype=bool)
    empty[b.columns] = False
    lo[empty] = hi[empty] = first[empty] = last[empty] = (first[empty] + last[empty]) / 2
    prev_last = np.concatenate(([first[0]], last[:-1]))
    span_lo = np.minimum(lo, prev_last)
    span_hi = np.maximum(hi, prev_last)
    span_lo[c0] = lo[c0]
    span_hi[c0] = hi[c0]
    scale = (nrows - 1) / (y_hi - y_lo) if y_hi > y_lo else 0.0
    # rounded to a millionth of a dot first: a flat series' float noise (a smoothed constant learning rate sits
    # half a dot from a row) would otherwise flip dots from one machine's floating point to another's
    top = np.rint(np.round((y_hi - span_hi) * scale, 6)).astype(np.int64)
    bottom = np.rint(np.round((y_hi - span_lo) * scale, 6)).astype(np.int64)
    if scale == 0.0:
        top[:] = bottom[:] = nrows // 2
    np.clip(top, 0, nrows - 1, out=top)
    np.clip(bottom, 0, nrows - 1, out=bottom)
    outside = (cols < c0) | (cols > c1)
    top[outside] = bottom[outside] = -1
    return top, bottom


def cell_masks(top: np.ndarray, bottom: np.ndarray, width: int, height: int) -> np.ndarray:
    """Braille bit masks, shape (height, width), for dot spans over 2*width columns."""
    rows = np.arange(4 * height)[:, None]
    on = (rows >= top[None, :]) & (rows <= bottom[None, :]) & (top[None, :] >= 0)
    # (4H, 2W) -> (H, 4, W, 2); weight each dot by its bit and sum per cell.
    grid = on.reshape(height, 4, width, 2)
    return np.einsum("hrwc,rc->hw", grid.astype(np.int64), _DOT_BITS)


def render_cells(layers: list[Layer], width: int, height: int, y_lo: float,
                 y_hi: float) -> tuple[list[list[str]], list[list[int]]]:
    """Braille characters per cell, and per cell the index in `layers` of the
    layer that owns it (-1: empty), which gives the cell its colour.

    A cell shows the dots of its highest-z layers only: a smoothed line stays a
    clean line where it crosses the dim raw points beneath it.
    """
    masks = np.zeros((height, width), dtype=np.int64)
    owner = np.full((height, width), -1, dtype=np.int64)
    owner_z = np.full((height, width), np.iinfo(np.int64).min, dtype=np.int64)
    for index in sorted(range(len(layers)), key=lambda i: layers[i].z):
        z = layers[index].z
        spans = dot_spans(layers[index].buckets, 2 * width, y_lo, y_hi, 4 * height)
        if spans is None:
            continue
        m = cell_masks(*spans, width, height)
        hit = m != 0
        above = hit & (owner_z < z)
        same = hit & (owner_z == z)
        masks[above] = m[above]
        masks[same] |= m[same]
        owner[hit] = index
        owner_z[above] = z
    chars = [[_CHARS[m] for m in row] for row in masks.tolist()]
    return chars, owner.tolist()


def nice_range(lo: float, hi: float) -> tuple[float, float]:
    """A y-range with a little headroom; a flat series gets a band around it. The headroom never crosses
    zero: a metric that is never negative (KL, grad norm, a fraction) never shows a negative axis, and one
    that is never positive never shows a positive one."""
    if not np.isfinite(lo) or not np.isfinite(hi):
        return 0.0, 1.0
    if hi - lo < 1e-12 * max(1.0, abs(hi)):
        pad = max(abs(hi) * 0.05, 1e-6)
    else:
        pad = (hi - lo) * 0.04
    lower, upper = lo - pad, hi + pad
    if lo >= 0 > lower:
        lower = 0.0
    if hi <= 0 < upper:
        upper = 0.0
    return lower, upper


def nice_ticks(lo: float, hi: float, most: int) -> list[float]:
    """At most `most` round values (1, 2 or 5 times a power of ten apart) inside [lo, hi], for labels and
    gridlines, as TensorBoard and matplotlib place them."""
    if most < 2 or not np.isfinite(lo) or not np.isfinite(hi) or hi <= lo:
        return []
    raw = (hi - lo) / (most - 1)
    power = 10.0 ** np.floor(np.log10(raw))

    def ticks(step: float) -> list[float]:
        first, last = int(np.ceil(lo / step - 1e-9)), int(np.floor(hi / step + 1e-9))
        return [float(f"{k * step:.12g}") for k in range(first, last + 1)]  # 0.6, not 0.6000000000000001

    # The smallest round step that gives at most `most` ticks, and at least two (a range such as 0.2..16.6
    # with room for 4 labels gets 5, 10, 15, not the single 10 that the first step above 5.5 would give).
    steps = sorted(m * p for p in (power / 10, power, power * 10) for m in (1, 2, 2.5, 5))
    fitting = [t for t in (ticks(step) for step in steps) if 2 <= len(t) <= most]
    return max(fitting, key=len) if fitting else []


def log_ticks(lo: float, hi: float, most: int) -> list[float]:
    """Ticks of a log10 axis, given in log10 units: whole powers of ten, thinned to at most `most`; a range
    within about one decade gets round values instead (1, 2, 3, 4 between 0.3 and 4.5)."""
    if most < 2 or hi <= lo:
        return []
    powers = list(range(int(np.ceil(lo - 1e-9)), int(np.floor(hi + 1e-9)) + 1))
    every = max(1, -(-len(powers) // most))
    if len(powers[::every]) >= 2:
        return [float(p) for p in powers[::every]]
    return [float(np.log10(v)) for v in nice_ticks(10.0 ** lo, 10.0 ** hi, most) if v > 0]
