"""Typed YAML: a config declared as dataclasses, read from plain mappings with every key checked.

A key is a dataclass field made with `key()`: its default, its help text and what its value must be (a `Bound`
or choices). `build_dataclass` reads a mapping into such a dataclass, converting each value to its annotated
type and refusing unknown keys and wrong types with one line naming the key and where it came from. A
dataclass with an `EXPECTED` text also takes a plain string (its first field), as a reward's name is written.
The declarations themselves are in train_config.py. Imports no mlx.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import yaml

from ..common.errors import UserError
from ..common.user_files import load_yaml, read_yaml_file
from .alias_table import unknown_key_hint


@dataclass(frozen=True)
class Bound:
    """What a key's value must be: a test, and how the expectation reads when the value fails it."""

    test: Callable[[Any], bool]
    expected: str


def at_least(low: float, note: str = "") -> Bound:
    return Bound(lambda v: v >= low, f"at least {low}{note}")


def non_negative(note: str = "") -> Bound:
    return Bound(lambda v: v >= 0, f"non-negative{note}")


POSITIVE = Bound(lambda v: v > 0, "positive")


def within(low: float, high: float, closed: str = "[]") -> Bound:
    """`low` to `high`; `closed` says which ends belong: "[]", "[)", "(]" or "()"."""
    def test(v: Any) -> bool:
        return ((low <= v) if closed[0] == "[" else (low < v)) and ((v <= high) if closed[1] == "]" else (v < high))
    return Bound(test, f"in {closed[0]}{low:g}, {high:g}{closed[1]}")


def key(default: Any = dataclasses.MISSING, help: str = "", *, factory: Any = dataclasses.MISSING,
        check: Bound | None = None, choices: tuple[str, ...] | None = None) -> Any:
    """A config key: its default (`factory` for a mutable one), its help text, and what its value must be (a
    `check`, or one of `choices`), kept in the field's metadata as mlx-lm and TRL declare theirs;
    `TrainConfig.validate`, `mlx-grpo train --help` and `key_help()` read them there. A None value (an
    optional key left unset) is not checked."""
    return field(default=default, default_factory=factory, metadata={"help": help, "check": check, "choices": choices})


def declared_keys(config: Any, prefix: str = "") -> Iterator[tuple[str, Any, Mapping[str, Any]]]:
    """(dotted name, value, field metadata) of every key, nested sections' keys too, in declaration order."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            yield from declared_keys(value, f"{prefix}{f.name}.")
        else:
            yield prefix + f.name, value, f.metadata


def get_dotted(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


# ----------------------------------------------------------------------------- type coercion

def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _type_name(a) for a in typing.get_args(tp))
    if origin is list:
        if hasattr(typing.get_args(tp)[0], "EXPECTED_LIST"):
            return typing.get_args(tp)[0].EXPECTED_LIST
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string",
            dict: "a mapping"}.get(tp, str(tp))


def _coerce(value: Any, tp: Any, key: str, source: str) -> Any:
    """Check `value` against the annotated type `tp`; return it converted."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # YAML's "\ud83d" escapes give lone surrogates: no file or name takes them
            raise UserError(f"{source}: key '{key}' is not valid text (a lone surrogate); write the character "
                            f"itself") from None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key, source)
            except UserError:
                continue
        raise _type_error(value, tp, key, source)
    if origin is list:
        if not isinstance(value, list):
            raise _type_error(value, tp, key, source)
        (item_tp,) = typing.get_args(tp)
        return [_coerce(v, item_tp, f"{key}[{i}]", source) for i, v in enumerate(value)]
    if hasattr(tp, "EXPECTED"):  # a dataclass also written as a plain string: its first field
        if isinstance(value, str):
            return tp(value)
        if isinstance(value, dict):
            return build_dataclass(tp, value, key, source)
        raise UserError(f"{source}: key '{key}' is {value!r}; expected {tp.EXPECTED}")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise _type_error(value, tp, key, source)
        return build_dataclass(tp, value, key, source)
    return _coerce_plain(value, tp, key, source)


def _coerce_plain(value: Any, tp: Any, key: str, source: str) -> Any:
    """A mapping, true/false, an integer, a finite number or a string, as `tp` says."""
    if tp is dict:
        if isinstance(value, dict) and all(isinstance(k, str) for k in value):
            return value
        raise _type_error(value, tp, key, source)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _type_error(value, tp, key, source)
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _type_error(value, tp, key, source)
    if tp is float:
        return _finite_number(value, tp, key, source)
    if tp is str:
        if isinstance(value, str):
            return value
        raise _type_error(value, tp, key, source)
    raise TypeError(f"unsupported config type {tp!r} for {key}")


def _finite_number(value: Any, tp: Any, key: str, source: str) -> float:
    number = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        # YAML 1.1 reads "1e-5" (no dot) as a string; people write learning rates that way.
        try:
            number = float(value)
        except ValueError:
            pass
    if number is None:
        raise _type_error(value, tp, key, source)
    if not math.isfinite(number):  # .inf/.nan pass `> 0` checks, then break the run or its resume
        raise UserError(f"{source}: key '{key}' is {value!r}; expected a finite number")
    return number


def _type_error(value: Any, tp: Any, key: str, source: str) -> UserError:
    return UserError(f"{source}: key '{key}' is {value!r}; expected {_type_name(tp)}")


def field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def build_dataclass(cls: type, mapping: dict, prefix: str, source: str, base: Any = None) -> Any:
    """Make `cls` from a mapping, starting from `base` (or the defaults)."""
    types_by_name = field_types(cls)
    values = {} if base is None else {n: getattr(base, n) for n in types_by_name}
    for key, value in mapping.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key not in types_by_name:
            raise UserError(f"{source}: unknown key '{dotted}'{unknown_key_hint(str(key), types_by_name)}")
        tp = types_by_name[key]
        if dataclasses.is_dataclass(tp) and isinstance(value, dict):
            values[key] = build_dataclass(tp, value, dotted, source, base=values.get(key))
        else:
            values[key] = _coerce(value, tp, dotted, source)
    return cls(**values)


# ----------------------------------------------------------------------------- loading

def read_yaml_mapping(path: Path) -> dict:
    """Safe-load a YAML file that must hold a mapping; errors name the file and line."""
    data = read_yaml_file(path, "config file")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of config keys at the top level, got {type(data).__name__}")
    return data


def parse_override(text: str) -> tuple[str, Any]:
    """`key=value` from the command line; the value is read as YAML (so 3, true, [a, b] work)."""
    if "=" not in text:
        raise UserError(f"--set {text!r}: expected KEY=VALUE")
    key, raw = text.split("=", 1)
    try:
        value = load_yaml(raw, f"--set {key.strip()}") if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def nest(dotted: dict[str, Any]) -> dict:
    """{'a.b': 1} -> {'a': {'b': 1}}"""
    out: dict = {}
    for key, value in dotted.items():
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out
