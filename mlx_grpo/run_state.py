"""The run loop's bookkeeping in a checkpoint, so a resumed run's records equal an uninterrupted run's.

checkpoint.py saves weights, optimiser, RNG and data order. `RunState` saves what `train()`
accumulates across steps:

- the reward tracker (recent means, cumulative reward, waiting histogram values, epoch and run
  statistics) and the throughput trackers (run averages and percentiles),
- the alert engine: every rule's cooldowns, windows and baselines (`alert_engine_state`),
- which reward functions already had their first failure reported (it is reported once per run),
- reward functions with state of their own (`state_dict` / `load_state_dict`, e.g. the rubric reward),
- named components of the step with state of their own (same two methods, e.g. the adaptive
  generation window's controller),
- the count of non-finite updates in a row, and the training seconds so far (`timing/elapsed_s`
  continues rather than restarting at 0).

Everything is plain JSON: a run directory is data, never code, so nothing is pickled and restoring
never imports or calls anything a file names.

The alert engine's rule states are small objects of plain data (latches, windows of points, baseline
lists), one class per rule kind. Rather than a save/load pair per class, `alert_engine_state` walks
their fields, so a new rule kind made of the same plain data is covered without code here; an
object of any other kind raises TypeError (tests/test_run_state.py feeds every built-in rule kind).
States are matched back to rules by the rule's full definition: a rule that was added or changed
before the resume starts fresh.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from .rewards import RewardFunction
from .telemetry import alerts
from .telemetry.reward_stats import RewardTracker, ThroughputTracker

# Fields of a rule state that are not state: the rule itself comes from the (re)loaded configuration.
_NOT_STATE = ("rule",)


@dataclass
class RunState:
    rewards: RewardTracker
    throughput: Sequence[ThroughputTracker]
    alert_engine: alerts.AlertEngine
    reward_fns: Sequence[RewardFunction]
    nonfinite_in_a_row: int = 0
    components: Mapping[str, Any] = field(default_factory=dict)  # name -> object with state_dict/load_state_dict

    def state_dict(self, elapsed_s: float) -> dict[str, Any]:
        return {
            "rewards": self.rewards.state_dict(),
            "throughput": {tracker.name: tracker.state_dict() for tracker in self.throughput},
            "alerts": alert_engine_state(self.alert_engine),
            "reward_errors_reported": [fn.name for fn in self.reward_fns if fn.error_reported],
            "reward_functions": {fn.name: fn.fn.state_dict() for fn in self.reward_fns
                                 if hasattr(fn.fn, "state_dict")},
            "components": {name: component.state_dict() for name, component in self.components.items()},
            "nonfinite_in_a_row": self.nonfinite_in_a_row,
            "elapsed_s": elapsed_s,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> float:
        """Restore everything; returns the training seconds before the checkpoint."""
        self.rewards.load_state_dict(state["rewards"])
        for tracker in self.throughput:
            if tracker.name in state["throughput"]:
                tracker.load_state_dict(state["throughput"][tracker.name])
        load_alert_engine_state(self.alert_engine, state["alerts"])
        reported = set(state["reward_errors_reported"])
        for fn in self.reward_fns:
            fn.error_reported = fn.name in reported
            saved = state["reward_functions"].get(fn.name)
            if saved is not None and hasattr(fn.fn, "load_state_dict"):
                fn.fn.load_state_dict(saved)
        saved = state.get("components", {})  # absent in checkpoints older than components
        for name, component in self.components.items():
            if name in saved:  # a component turned on only at resume starts fresh
                component.load_state_dict(saved[name])
        self.nonfinite_in_a_row = int(state["nonfinite_in_a_row"])
        return float(state["elapsed_s"])


# ----------------------------------------------------------------------------- alert engine

def alert_engine_state(engine: alerts.AlertEngine) -> dict[str, Any]:
    return {
        "records": engine._records,
        "rules": [{"rule": repr(state.rule), "fields": _encode_fields(state)} for state in engine._states],
    }


def load_alert_engine_state(engine: alerts.AlertEngine, saved: Mapping[str, Any]) -> None:
    by_rule = {item["rule"]: item["fields"] for item in saved["rules"]}
    engine._records = int(saved["records"])
    for state in engine._states:
        fields = by_rule.get(repr(state.rule))
        if fields is not None:
            for name, value in fields.items():
                setattr(state, name, _decode(value))


def _field_names(obj: Any) -> list[str]:
    names = list(getattr(obj, "__dict__", {}))
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        names.extend([slots] if isinstance(slots, str) else slots)
    return [n for n in dict.fromkeys(names) if n not in _NOT_STATE and hasattr(obj, n)]


def _encode_fields(obj: Any) -> dict[str, Any]:
    return {name: _encode(getattr(obj, name)) for name in _field_names(obj)}


def _encode(value: Any) -> Any:
    """JSON for plain data. Every JSON object in the output is tagged with what it stands for."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, tuple):
        return {"tuple": [_encode(v) for v in value]}
    if isinstance(value, deque):
        return {"deque": [_encode(v) for v in value], "maxlen": value.maxlen}
    if isinstance(value, dict):
        return {"dict": [[_encode(k), _encode(v)] for k, v in value.items()]}
    cls = type(value)
    if cls.__module__ == alerts.__name__ and not isinstance(value, alerts.Rule):
        return {"object": cls.__name__, "fields": _encode_fields(value)}
    raise TypeError(f"alert engine state holds a {cls.__module__}.{cls.__name__}, which a checkpoint cannot store")


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "float" in value:
        return float(value["float"])
    if "tuple" in value:
        return tuple(_decode(v) for v in value["tuple"])
    if "deque" in value:
        return deque((_decode(v) for v in value["deque"]), maxlen=value["maxlen"])
    if "dict" in value:
        return {_decode(k): _decode(v) for k, v in value["dict"]}
    return _decode_object(value["object"], value["fields"])


def _decode_object(name: str, fields: Mapping[str, Any]) -> Any:
    # Only a state class of the alerts module, made without running its __init__: no code is named by data.
    cls = getattr(alerts, name, None)
    if not (isinstance(cls, type) and cls.__module__ == alerts.__name__) or issubclass(cls, alerts.Rule):
        raise ValueError(f"checkpoint names an unknown alert state type {name!r}")
    obj = cls.__new__(cls)
    for field_name, value in fields.items():
        setattr(obj, field_name, _decode(value))
    return obj
