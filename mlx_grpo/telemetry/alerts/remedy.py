"""A rule's remedy: the factors a rollback multiplies the learning rate and beta by (docs/ALERTS.md).

Declared by a rule in YAML (`remedy: {learning_rate: 0.5, beta: 2}`), applied by the trainer to its config,
kept in a checkpoint's state.json as an object of factors so a resume goes on remedied. Imports no mlx.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, TypeVar

# What a remedy may change, each by a factor: the learning rate and beta (the KL coefficient).
REMEDY_KEYS = ("learning_rate", "beta")

Config = TypeVar("Config")


def _positive(value: Any) -> bool:
    """A finite number above zero (an int beyond float's range is not one)."""
    try:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 and math.isfinite(value)
    except OverflowError:
        return False


@dataclass(frozen=True)
class Remedy:
    """Factors per config key, in the order they were given: e.g. (("learning_rate", 0.5), ("beta", 2.0)).
    Empty: no remedy (false in a test)."""

    factors: tuple[tuple[str, float], ...] = ()

    @classmethod
    def from_yaml(cls, key: str, value: Any) -> Remedy:
        """A remedy from a rule's YAML mapping; ValueError names `key`. Its keys and factors are checked by
        `check`, which the rule calls with its other keys' checks."""
        if isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, (int, float))
                                           and not isinstance(v, bool) for k, v in value.items()):
            return cls(tuple((k, float(v)) for k, v in value.items()))
        raise ValueError(f"key '{key}' must map what to change to a factor, e.g. {{learning_rate: 0.5, beta: 2}}, "
                         f"got {value!r}")

    def check(self) -> None:
        """ValueError naming the first key a remedy may not change or the first factor that is not positive."""
        for key, factor in self.factors:
            if key not in REMEDY_KEYS:
                raise ValueError(f"key 'remedy' may change {' and '.join(REMEDY_KEYS)}, not {key!r}")
            if not _positive(factor):
                raise ValueError(f"key 'remedy': the factor of {key} must be a positive number, got {factor!r}")

    def __bool__(self) -> bool:
        return bool(self.factors)

    def changes(self, key: str) -> bool:
        """Whether the remedy changes `key`."""
        return any(name == key for name, _ in self.factors)

    def factor(self, key: str) -> float:
        """What `key` is multiplied by (1.0 when the remedy leaves it)."""
        return next((factor for name, factor in self.factors if name == key), 1.0)

    def then(self, other: Remedy) -> Remedy:
        """This remedy followed by `other`: their factors multiplied (a second rollback's on the first's)."""
        merged = dict(self.factors)
        for key, factor in other.factors:
            merged[key] = merged.get(key, 1.0) * factor
        return Remedy(tuple(merged.items()))

    def applied(self, config: Config) -> Config:
        """The config (a dataclass with `learning_rate` and `beta`) with both multiplied by their factors."""
        return dataclasses.replace(config, learning_rate=config.learning_rate * self.factor("learning_rate"),
                                   beta=config.beta * self.factor("beta"))

    def to_state(self) -> dict[str, float]:
        """The object a checkpoint's state.json keeps under 'remedy'."""
        return dict(self.factors)

    @classmethod
    def from_state(cls, value: Any) -> Remedy:
        """The remedy a checkpoint's state.json kept (it is data: checked); ValueError when it is not an object
        of positive factors."""
        if not (isinstance(value, dict) and all(_positive(v) for v in value.values())):
            raise ValueError("not an object of positive factors")
        return cls(tuple(value.items()))
