"""Alert rules from YAML: a user's file (`--alerts`), a run config's `alerts:` section,
and the built-in GRPO set in default_alerts.yaml.

The format is documented in docs/ALERTS.md. Files are read with yaml.safe_load only;
every mistake is a UserError naming the file, the rule index and the key. This
module imports no mlx.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import MISSING, fields, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from ...common.errors import UserError
from ...common.user_files import parse_yaml, read_user_text
from ..metrics.catalogue import CATALOGUE, find_entry
from .detector_rules import RiseRule, SaturationRule
from .nonfinite_rule import NonFiniteRule
from .pathology_rules import ExhaustionRule
from .remedy import Remedy
from .rules import BaselineRule, DropRule, Rule, SpikeRule, ThresholdRule
from .state import metric_pattern
from .trend_rules import HackingRule, PlateauRule, TrendRule

# The kinds a rule file may name.
RULE_KINDS: dict[str, type[Rule]] = {
    cls.kind: cls for cls in (ThresholdRule, TrendRule, SpikeRule, BaselineRule, HackingRule, DropRule,
                              PlateauRule, NonFiniteRule, ExhaustionRule, RiseRule, SaturationRule)
}


def _convert(key: str, type_name: str, value: Any) -> Any:
    if type_name == "bool":
        if isinstance(value, bool):
            return value
        raise ValueError(f"key '{key}' must be true or false, got {value!r}")
    if type_name == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ValueError(f"key '{key}' must be a whole number, got {value!r}")
    if type_name == "float":
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
        raise ValueError(f"key '{key}' must be a finite number, got {value!r}")
    if type_name == "str":
        if isinstance(value, str):
            return value
        raise ValueError(f"key '{key}' must be text, got {value!r}")
    if type_name == "tuple[str, ...]":
        items = [value] if isinstance(value, str) else value
        if isinstance(items, list) and items and all(isinstance(item, str) for item in items):
            return tuple(items)
        raise ValueError(f"key '{key}' must be a metric name or a list of them, got {value!r}")
    if type_name == "Remedy":  # {learning_rate: 0.5, beta: 2}
        return Remedy.from_yaml(key, value)
    raise AssertionError(f"unhandled field type {type_name}")


def rule_from_mapping(entry: Any) -> Rule:
    """One rule from its YAML mapping; ValueError names the offending key."""
    if not isinstance(entry, dict):
        raise ValueError(f"a rule must be a mapping with 'name', 'kind' and 'metric', got {type(entry).__name__}")
    kind = entry.get("kind")
    cls = RULE_KINDS.get(kind) if isinstance(kind, str) else None  # a list or a mapping is no kind
    if cls is None:
        raise ValueError(f"key 'kind' must be one of {', '.join(RULE_KINDS)}, got {kind!r}")
    spec = {f.name: f for f in fields(cls)}
    unknown = [key for key in entry if key != "kind" and key not in spec]
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r} for a {kind} rule; known keys: kind, {', '.join(spec)}")
    kwargs = {}
    for name, f in spec.items():
        if name in entry:
            kwargs[name] = _convert(name, str(f.type), entry[name])
        elif f.default is f.default_factory is MISSING:
            raise ValueError(f"missing key '{name}' (a {kind} rule needs {', '.join(_required(cls))})")
    return cls(**kwargs)


def _required(cls: type[Rule]) -> list[str]:
    return [f.name for f in fields(cls) if f.default is f.default_factory is MISSING]


def _parse_rule_list(items: Any, source: str) -> list[Rule]:
    if not isinstance(items, list):
        raise UserError(f"{source}: key 'rules' must be a list of rule mappings")
    rules: list[Rule] = []
    seen: set[str] = set()
    for index, entry in enumerate(items):
        label = entry.get("name") if isinstance(entry, dict) else None
        where = f"{source}: rules[{index}]" + (f" ({label})" if isinstance(label, str) else "")
        try:
            rule = rule_from_mapping(entry)
        except ValueError as err:
            raise UserError(f"{where}: {err}") from None
        if rule.name in seen:
            raise UserError(f"{where}: rule name '{rule.name}' is used twice")
        seen.add(rule.name)
        rules.append(rule)
    return rules


_TOP_KEYS = ("defaults", "disable", "rules")


def rules_from_config(data: Any, source: str = "alerts", *, defaults: bool = True) -> list[Rule]:
    """Resolve an `alerts` mapping: built-in rules (unless turned off) plus the user's.

    Keys: `defaults` (bool, default true: keep the built-in rules), `disable` (list of
    built-in rule names to drop), `rules` (list of rules; a rule with the name of a
    built-in one replaces it). `defaults=False` (the trainer's `--no-alerts`) drops the
    built-in rules whatever the mapping says.
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"{source}: alert rules must be a mapping with keys {', '.join(_TOP_KEYS)}")
    unknown = [key for key in data if key not in _TOP_KEYS]
    if unknown:
        raise UserError(f"{source}: unknown key {unknown[0]!r}; known keys: {', '.join(_TOP_KEYS)}")
    keep_defaults = data.get("defaults", True)
    if not isinstance(keep_defaults, bool):
        raise UserError(f"{source}: key 'defaults' must be true or false, got {keep_defaults!r}")
    disable = data.get("disable", [])
    if isinstance(disable, str):
        disable = [disable]
    if not isinstance(disable, list) or not all(isinstance(name, str) for name in disable):
        raise UserError(f"{source}: key 'disable' must be a list of built-in rule names")
    user_rules = _parse_rule_list(data.get("rules", []), source)
    builtin = default_rules() if (defaults and keep_defaults) else []
    builtin_names = {rule.name for rule in default_rules()}
    for index, name in enumerate(disable):
        if name not in builtin_names:
            raise UserError(f"{source}: disable[{index}]: no built-in rule named '{name}'; "
                            f"built-in rules: {', '.join(sorted(builtin_names))}")
    by_name = {rule.name: rule for rule in user_rules}
    merged = [by_name.pop(rule.name, rule) for rule in builtin if rule.name not in disable]
    merged.extend(rule for rule in user_rules if rule.name in by_name)
    return merged


def _load_yaml(path: Path, source: str) -> Any:
    if not path.exists():
        raise UserError(f"alert rules file not found: {source}")
    return parse_yaml(read_user_text(path, "alert rules file"), source)


def with_on_alert(rules: list[Rule], mode: str) -> list[Rule]:
    """The built-in rules' actions under the config's `on_alert`: "default" as shipped (the collapse and
    memory-pressure rules stop the run), "warn" every built-in rule only reports, "rollback" the built-in
    rules with a remedy roll back instead. Rules of the user's own keep the action they were given."""
    if mode == "default":
        return rules
    shipped = {rule.name: rule for rule in default_rules()}
    out = []
    for rule in rules:
        if shipped.get(rule.name) is rule:
            action = "none" if mode == "warn" else ("rollback" if rule.remedy else rule.action)
            rule = replace(rule, action=action)
        out.append(rule)
    return out


def load_alert_rules(path: str | Path, *, defaults: bool = True) -> list[Rule]:
    """Rules from a YAML file (see `rules_from_config`); safe_load only."""
    path = Path(path)
    return rules_from_config(_load_yaml(path, str(path)), str(path), defaults=defaults)


@lru_cache(maxsize=1)
def _default_rules() -> tuple[Rule, ...]:
    ref = resources.files("mlx_grpo.telemetry.alerts").joinpath("default_alerts.yaml")
    source = "default_alerts.yaml"
    data = parse_yaml(ref.read_text(encoding="utf-8"), source)
    if not isinstance(data, dict) or set(data) != {"rules"}:
        raise UserError(f"{source}: expected a mapping with the single key 'rules'")
    return tuple(_parse_rule_list(data["rules"], source))


def default_rules() -> list[Rule]:
    """The built-in GRPO rules of default_alerts.yaml (documented in docs/ALERTS.md)."""
    return list(_default_rules())


def check_rule_metrics(rules: list[Rule], source: str) -> list[str]:
    """Rules watching a plain metric name the metric catalogue does not know (a typo never fires): a rule
    with `action: stop` is refused, since it could never stop the run; the others get one warning each.
    Patterns are checked against the first record (`pattern_warnings`)."""
    warnings = []
    builtin = {rule.name for rule in default_rules()}
    for rule in rules:
        if rule.name in builtin:
            continue
        for name in (rule.metric, *getattr(rule, "together", ())):
            if metric_pattern(name) is not None or find_entry(name) is not None:
                continue
            close = difflib.get_close_matches(name, [spec.name for spec in CATALOGUE], n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            problem = f"rule '{rule.name}' watches '{name}', which no run logs{hint}"
            if rule.action == "stop":
                raise UserError(f"{source}: {problem}, so its action: stop could never stop the run")
            warnings.append(f"{source}: {problem}; it will never fire (mlx-grpo metrics lists every metric)")
    return warnings


def pattern_warnings(rules: list[Rule], record: dict) -> list[str]:
    """Rules whose metric pattern matches no key of a run's first record."""
    return [f"alert rule '{rule.name}': the pattern '{rule.metric}' matches no metric this run logs"
            for rule in rules if metric_pattern(rule.metric) is not None and not rule.metrics_in(record)]
