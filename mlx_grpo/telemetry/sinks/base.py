"""The text helpers every sink shares (the Sink seam itself and the events are telemetry/events.py)."""

from __future__ import annotations

import json
import math
from typing import Any, Mapping, Sequence

from ..rundir.writer import RunInfo, json_safe

# Sample columns shown in text and tables; long texts are cut so a step's table stays readable.
TEXT_LIMIT = 600


def _clip(text: Any, limit: int = TEXT_LIMIT) -> str:
    text = "" if text is None else str(text)
    return text if len(text) <= limit else text[:limit] + " [...]"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "null" if not math.isfinite(value) else f"{value:.4g}"
    return "" if value is None else str(value)


def _md_cell(value: Any) -> str:
    return _clip(value).replace("\\", "\\\\").replace("|", "\\|").replace("\n", "<br>")


def samples_markdown(samples: Sequence[Mapping[str, Any]]) -> str:
    """Sample completions as a markdown table (TensorBoard's text view)."""
    fns = list(dict.fromkeys(k for s in samples for k in (s.get("rewards") or {})))
    header = ["prompt", "completion", "answer", *fns, "total", "advantage", "length", "truncated", "correct"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for s in samples:
        rewards = s.get("rewards") or {}
        row = [_md_cell(s.get("prompt")), _md_cell(s.get("completion")), _md_cell(s.get("answer")),
               *(_fmt(rewards.get(fn)) for fn in fns), _fmt(s.get("total")), _fmt(s.get("advantage")),
               _fmt(s.get("length")), _fmt(s.get("truncated")), _fmt(s.get("correct"))]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, bool | int | float | str]:
    """Nested config as `a.b` keys with plain values (lists as JSON text); None values are dropped."""
    out: dict[str, bool | int | float | str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten_config(value, name + "."))
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        elif value is not None:
            out[name] = json.dumps(json_safe(value))
    return out


def tracker_config(info: RunInfo) -> dict[str, Any]:
    """What an external tracker records as the run's config: the config, plus where and with what it ran."""
    return {**info.config, "run_id": info.run_id, "versions": info.versions, "device": info.device}
