"""Short, fixed-width text for numbers, durations and steps on a dashboard."""

from __future__ import annotations

import math


def fmt_value(v: float | None, width: int = 7) -> str:
    """A number in at most ~`width` characters: 0.0123, 1.23k, 4.5e-05, 12.3M.

    Anything else a hand-edited or foreign file may hold (text, true/false) is shown as its text, cut to `width`.
    """
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)[:width]
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    a = abs(v)
    if a == 0:
        return "0"
    if a >= 1e4:
        for div, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
            if a >= div:
                return f"{v / div:.3g}{suffix}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 1e-3:
        text = f"{v:.4g}" if width >= 7 else f"{v:.3g}"
        return text
    return f"{v:.2g}"


def fmt_duration(seconds: float | None) -> str:
    """H:MM:SS (or D d H:MM:SS); '–' when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "–"
    seconds = int(round(max(0.0, seconds)))
    days, rest = divmod(seconds, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    text = f"{h}:{m:02d}:{s:02d}"
    return f"{days}d {text}" if days else text


def fmt_count(n) -> str:
    """An integer with thousands separators; anything else as its text."""
    return f"{n:,}" if isinstance(n, int) and not isinstance(n, bool) else str(n)


def fmt_step(step: int | None, total: int | None) -> str:
    """The header's step text: "step 60/100 (60%)", or without a total "step 60"."""
    if step is None:
        return "step –" + (f"/{total:,}" if total else "")
    if total:
        return f"step {step:,}/{total:,} ({100.0 * step / total:.0f}%)"
    return f"step {step:,}"


_BLOCKS = "▁▂▃▄▅▆▇█"


def fmt_spark(values, width: int, scale_range: tuple[float, float] | None = None) -> str:
    """The last `width` values as a one-line block sparkline, scaled to their own range or to
    `scale_range` (a percentage against 0-100, as btop draws it)."""
    vals = [v for v in values if v == v][-width:]
    if not vals:
        return ""
    lo, hi = scale_range if scale_range is not None else (min(vals), max(vals))
    vals = [min(max(v, lo), hi) for v in vals]
    if hi <= lo:
        return _BLOCKS[3] * len(vals)
    scale = (len(_BLOCKS) - 1) / (hi - lo)
    return "".join(_BLOCKS[int((v - lo) * scale + 0.5)] for v in vals)
