"""An alert: what fired, where and when, as alerts.jsonl holds it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from ...common.secrets import scrub_text

LEVELS = ("info", "warning", "error")


# What the trainer does when a rule fires: "none" (report it), "stop" (checkpoint, close the logs, exit 3) or
# "rollback" (restore the last checkpoint from before the condition began, apply the rule's remedy, go on).
ACTIONS = ("none", "stop", "rollback")


@dataclass(frozen=True)
class Alert:
    """One fired alert, as written to alerts.jsonl (one JSON object per alert)."""

    step: int
    time: float | None
    level: str
    rule: str
    metric: str
    value: float | None
    message: str
    action: str = "none"  # "stop" / "rollback": what the rule makes the trainer do (written only then)

    def __post_init__(self) -> None:
        # Messages carry text from outside (a judge's error body, a reward function's exception): every
        # place an alert goes (alerts.jsonl, TensorBoard, W&B, the report, the console) gets it scrubbed.
        object.__setattr__(self, "message", scrub_text(self.message))

    def to_dict(self) -> dict[str, Any]:
        """The alerts.jsonl object: finite numbers or null (the message keeps "NaN"/"Inf"); the action only
        when there is one."""
        value = self.value if self.value is not None and math.isfinite(self.value) else None
        out = {"step": self.step, "time": self.time, "level": self.level, "rule": self.rule,
               "metric": self.metric, "value": value, "message": self.message}
        if self.action != "none":
            out["action"] = self.action
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Alert":
        """Read back one alerts.jsonl object (the dashboard and the report do)."""
        value, step, time = data.get("value"), data.get("step"), data.get("time")
        finite = isinstance(step, (int, float)) and not isinstance(step, bool) and math.isfinite(step)
        return cls(step=int(step) if finite else 0,
                   time=float(time) if isinstance(time, (int, float)) and math.isfinite(time) else None,
                   level=str(data.get("level", "info")),
                   rule=str(data.get("rule", "")), metric=str(data.get("metric", "")),
                   value=float(value) if isinstance(value, (int, float)) else None,
                   message=str(data.get("message", "")),
                   action=data["action"] if data.get("action") in ACTIONS else "none")
