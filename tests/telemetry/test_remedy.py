"""A rule's remedy: read from YAML with one-line errors, applied to a config, kept in a checkpoint's state."""

from dataclasses import dataclass

import pytest

from mlx_grpo.common.errors import UserError
from mlx_grpo.telemetry.alerts.config import rules_from_config
from mlx_grpo.telemetry.alerts.remedy import Remedy


@dataclass(frozen=True)
class Settings:
    learning_rate: float
    beta: float
    temperature: float = 1.0


def rule_with(remedy) -> dict:
    return {"name": "r", "kind": "threshold", "metric": "m", "op": ">", "value": 1, "action": "rollback",
            "remedy": remedy}


def test_a_rules_remedy_multiplies_the_learning_rate_and_beta_and_nothing_else():
    (rule,) = rules_from_config({"defaults": False, "rules": [rule_with({"learning_rate": 0.5, "beta": 2})]})
    assert rule.remedy.applied(Settings(1e-4, 0.04, 0.9)) == Settings(5e-5, 0.08, 0.9)
    assert Remedy().applied(Settings(1e-4, 0.04)) == Settings(1e-4, 0.04) and not Remedy()


@pytest.mark.parametrize("remedy, message", [
    ({"temperature": 2}, "key 'remedy' may change learning_rate and beta, not 'temperature'"),
    ({"beta": 0}, "key 'remedy': the factor of beta must be a positive number, got 0.0"),
    ({"beta": float("inf")}, "key 'remedy': the factor of beta must be a positive number, got inf"),
    ("halve", "key 'remedy' must map what to change to a factor, e.g. {learning_rate: 0.5, beta: 2}, got 'halve'"),
    ({"beta": True}, "key 'remedy' must map what to change to a factor"),
])
def test_a_bad_remedy_is_refused_in_one_line_naming_the_rule_and_key(remedy, message):
    with pytest.raises(UserError) as err:
        rules_from_config({"defaults": False, "rules": [rule_with(remedy)]}, "mine.yaml")
    assert str(err.value).startswith(f"mine.yaml: rules[0] (r): {message}") and "\n" not in str(err.value)


def test_two_rollbacks_multiply_and_the_checkpoint_keeps_the_same_object():
    halve = Remedy((("learning_rate", 0.5),))
    both = halve.then(Remedy((("learning_rate", 0.5), ("beta", 2.0))))
    assert both.to_state() == {"learning_rate": 0.25, "beta": 2.0}
    assert list(both.to_state()) == ["learning_rate", "beta"]  # state.json's key order, as before
    assert Remedy.from_state(both.to_state()) == both
    assert Remedy.from_state({}) == Remedy()


@pytest.mark.parametrize("saved", [[0.5], {"beta": -1}, {"beta": "2"}, {"beta": True}, {"beta": 10**400},
                                   {"beta": float("nan")}])
def test_a_damaged_saved_remedy_is_refused(saved):
    with pytest.raises(ValueError, match="not an object of positive factors"):
        Remedy.from_state(saved)
