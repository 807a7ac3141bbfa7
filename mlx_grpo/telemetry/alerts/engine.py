"""The alert engine: rules evaluated over metric records, one record at a time.

A metric record is a mapping `{"step": int, "time": float, "<metric>": number, ...}`
with the canonical names of docs/RUN_DIRECTORY.md. The trainer feeds each step's
record to `AlertEngine.check` as it is logged; the dashboard and `mlx-grpo report`
replay a whole metrics.jsonl through the same engine. Rule syntax, the built-in
GRPO rules and the reason for each threshold are in docs/ALERTS.md.

Cost per record is kept flat (the dashboard replays 100k records): the rules that
apply to a record's set of keys are worked out once per distinct key set, rolling
windows keep running sums instead of re-scanning, and the non-finite check sums the
record's values in C before looking at any value one by one.

Rules come from YAML through config.py. This module imports no mlx.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, Iterable, Mapping, Sequence

from ...common.errors import UserError
from .alert import Alert
from .rules import Rule
from .state import STATE_TYPES

_MAX_PLANS = 1024  # distinct record key sets remembered (a run has a handful)


class AlertEngine:
    """Evaluates rules over metric records in step order and returns the alerts that fire."""

    def __init__(self, rules: Sequence[Rule] = ()) -> None:
        self._rules: list[Rule] = []
        self._plans: dict[tuple[str, ...], list[tuple[Rule, tuple[str, ...]]]] = {}
        self._records = 0
        for rule in rules:
            self.add_rule(rule)

    @property
    def rules(self) -> list[Rule]:
        """The rules evaluated, each holding its state of this run."""
        return list(self._rules)

    def add_rule(self, rule: Rule) -> None:
        """Evaluate one more rule, with fresh state (the rule given is left untouched)."""
        if any(r.name == rule.name for r in self._rules):
            raise UserError(f"alert rule '{rule.name}' is defined twice")
        self._rules.append(rule.fresh())
        self._plans.clear()

    def check(self, record: Mapping[str, Any]) -> list[Alert]:
        """Feed one metric record; returns the alerts it fires (usually none)."""
        self._records += 1
        step = record.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            step = self._records
        time = record.get("time")
        keys = tuple(record)
        plan = self._plans.get(keys)
        if plan is None:
            if len(self._plans) >= _MAX_PLANS:
                self._plans.clear()  # a stream whose key sets keep changing: stay bounded
            plan = []
            for rule in self._rules:
                names = rule.plan(keys)
                if names is not None:
                    plan.append((rule, names))
            self._plans[keys] = plan
        out: list[Alert] = []
        for rule, names in plan:
            rule.observe(record)
            rule.update(step, time, record, names, out)
        return out

    def check_all(self, records: Iterable[Mapping[str, Any]]) -> list[Alert]:
        """Feed every record in order; returns all the alerts fired."""
        out: list[Alert] = []
        for record in records:
            out.extend(self.check(record))
        return out

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Every rule's cooldowns, windows and baselines as plain JSON, matched back by the rule's definition.

        A rule's state is its `state()` fields, made of plain data and the small types of STATE_TYPES; they
        are walked rather than saved by a method per kind, so a new kind of the same data needs no code here.
        """
        return {"records": self._records,
                "rules": [{"rule": repr(rule), "fields": {name: _encode(getattr(rule, name))
                                                          for name in rule.state_fields()}}
                          for rule in self._rules]}

    def load_state_dict(self, saved: Mapping[str, Any]) -> None:
        """Restore `state_dict`'s output; a rule added or changed since starts fresh."""
        by_rule = {item["rule"]: item["fields"] for item in saved["rules"]}
        self._records = int(saved["records"])
        for rule in self._rules:
            fields = by_rule.get(repr(rule))
            if fields is not None:
                for name in rule.state_fields():
                    if name in fields:
                        object.__setattr__(rule, name, _decode(fields[name]))


def _slots(obj: Any) -> list[str]:
    return [name for cls in type(obj).__mro__ for name in cls.__dict__.get("__slots__", ())]


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
    if STATE_TYPES.get(cls.__name__) is cls:
        return {"object": cls.__name__, "fields": {name: _encode(getattr(value, name)) for name in _slots(value)}}
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
    # Only a type of STATE_TYPES, made without running its __init__: no code is named by data.
    cls = STATE_TYPES.get(value["object"])
    if cls is None:
        raise ValueError(f"checkpoint names an unknown alert state type {value['object']!r}")
    obj = cls.__new__(cls)
    for field_name, field_value in value["fields"].items():
        setattr(obj, field_name, _decode(field_value))
    return obj
