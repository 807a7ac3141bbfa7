"""The rule that watches for NaN and infinity in a run's metrics. Imports no mlx."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from .rules import Rule
from .state import _fmt


def _nonfinite(value: Any) -> bool:
    if value is None or isinstance(value, str):
        return False
    try:
        return not math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


@dataclass(frozen=True, kw_only=True)
class NonFiniteRule(Rule):
    """A NaN or an infinity in any matching metric: one alert per record, however many metrics it breaks.

    A NaN loss turns a dozen policy metrics NaN at once; they are one problem, so the rule has a single
    latch that re-arms when a record is finite again.
    """

    kind: ClassVar[str] = "nonfinite"
    metric: str = "**"
    level: str = "error"

    def update(self, step, time, record, names, out):
        """One alert for a record holding NaN or infinity in a watched metric."""
        if self.metric == "**":
            # Fast path: a NaN or Inf anywhere makes the sum non-finite. filter(None, ...)
            # drops nulls and zeros, which cannot change that.
            try:
                finite = math.isfinite(sum(filter(None, record.values())))
            except TypeError:
                finite = False  # text in a record: look at every value
            if finite:
                self.fire(False, "*", step)
                return
        bad = [name for name in names if _nonfinite(record[name])]
        if self.fire(bool(bad), "*", step):
            value = float(record[bad[0]])
            listed = ", ".join(f"{name}={_fmt(float(record[name]))}" for name in bad[:5])
            more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
            out.append(self.alert(step, time, bad[0], value, f"non-finite values at step {step}: {listed}{more}"))


