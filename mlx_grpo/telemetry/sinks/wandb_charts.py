"""The pictures the W&B sink logs, as plain data: no wandb import here, so they are tested without it.

- `chart_interval(chart_every, total_steps)`: how often the 3D charts and the heatmap are redrawn.
- `value_cloud(xyz, value)` and `category_cloud(xyz, category)`: [N, 6] point clouds (x, y, z, r, g, b) for
  `wandb.Object3D`, which renders offline; each axis scaled to 0..10 so one axis does not flatten the others.
- `heatmap_svg(rows, steps, values)`: a labelled heatmap (one row per rubric criterion, one column per
  logged step) as a standalone SVG for `wandb.Html`; W&B has no built-in heatmap panel that renders offline.
"""

from __future__ import annotations

import math
from html import escape
from typing import Sequence

import numpy as np

from ..metrics.charts import scale_colour

# About ten redraws per run: often enough to watch, rare enough that the 3D clouds (up to 10,000 points
# each) stay a small share of the W&B worker's time.
REDRAWS_PER_RUN = 10
# Distinct colours for the reward components (Okabe-Ito, readable by colour-blind people).
CATEGORY_COLOURS = ((0, 114, 178), (230, 159, 0), (0, 158, 115), (204, 121, 167), (86, 180, 233),
                    (213, 94, 0), (240, 228, 66), (120, 120, 120))


def chart_interval(chart_every: int, total_steps: int | None) -> int:
    """`chart_every` steps, or with 0 about ten times per run (every step for runs under 10 steps)."""
    if chart_every > 0:
        return chart_every
    return max(1, (total_steps or 500) // REDRAWS_PER_RUN)


def _scaled(xyz: np.ndarray) -> np.ndarray:
    lo, hi = xyz.min(axis=0), xyz.max(axis=0)
    return 10.0 * (xyz - lo) / np.where(hi > lo, hi - lo, 1.0)


def value_cloud(xyz: np.ndarray, value: np.ndarray) -> np.ndarray:
    """Points coloured from blue (low `value`) to red (high)."""
    v_lo, v_hi = value.min(), value.max()
    t = (value - v_lo) / (v_hi - v_lo) if v_hi > v_lo else np.full_like(value, 0.5)
    colour = np.stack([255 * t, np.full_like(t, 60.0), 255 * (1 - t)], axis=1)
    return np.concatenate([_scaled(xyz), colour], axis=1)


def category_cloud(xyz: np.ndarray, category: np.ndarray) -> np.ndarray:
    """Points coloured by an integer category (a reward component): one colour each."""
    palette = np.array(CATEGORY_COLOURS, dtype=float)
    return np.concatenate([_scaled(xyz), palette[category.astype(int) % len(palette)]], axis=1)


def heatmap_svg(rows: Sequence[str], steps: Sequence[int], values: np.ndarray, title: str = "", cell_h: int = 22,
                value_label: str = "score") -> str:
    """`values[i, j]` of row i at steps[j] (NaN: not logged) as coloured cells, row labels on the left (an
    empty label: none), a few step labels below and the colour scale's ends in the legend."""
    values = np.asarray(values, dtype=float)
    label_w, top, plot_w = 12 + 7 * max((len(r) for r in rows), default=4), 30, 600
    cell_w = plot_w / max(1, len(steps))
    height = top + cell_h * len(rows) + 50
    finite = values[np.isfinite(values)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    span = hi - lo if hi > lo else 1.0
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_w + plot_w + 20:.0f}" height="{height}" '
           'font-family="sans-serif" font-size="12">',
           f'<text x="{label_w}" y="18" font-weight="bold">{escape(title)}</text>']
    for i, row in enumerate(rows):
        y = top + i * cell_h
        if row:
            out.append(f'<text x="{label_w - 6}" y="{y + cell_h / 2 + 4}" text-anchor="end">{escape(row)}</text>')
        for j, step in enumerate(steps):
            value = values[i, j]
            tip = f"{row} at step {step}: {value:.3g}" if math.isfinite(value) else f"{row} at step {step}: -"
            out.append(f'<rect x="{label_w + j * cell_w:.1f}" y="{y}" width="{cell_w + 0.5:.1f}" '
                       f'height="{max(1, cell_h - 1)}" '
                       f'fill="{scale_colour((value - lo) / span)}"><title>{escape(tip)}</title></rect>')
    axis_y = top + cell_h * len(rows) + 16
    ticks = sorted({0, len(steps) - 1, *range(0, len(steps), max(1, len(steps) // 6))}) if steps else []
    for j in ticks:
        out.append(f'<text x="{label_w + (j + 0.5) * cell_w:.1f}" y="{axis_y}" text-anchor="middle">{steps[j]}</text>')
    legend_y = axis_y + 20
    out.append(f'<text x="{label_w}" y="{legend_y}">step → · {escape(value_label)} {lo:.3g}</text>')
    for k in range(20):
        out.append(f'<rect x="{label_w + 140 + 6 * k}" y="{legend_y - 10}" width="6" height="12" '
                   f'fill="{scale_colour(k / 19)}"/>')
    out.append(f'<text x="{label_w + 266}" y="{legend_y}">{hi:.3g}</text></svg>')
    return "\n".join(out)
