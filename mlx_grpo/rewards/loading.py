"""Loading the run's reward functions: built-in names, a user's ``path/to/file.py:function`` and the rubric.

A user function is named as ``path/to/file.py:function_name``, the path relative to the config's folder
or absolute. See ``configs/rewards_example.py``. This module imports no mlx.
"""

from __future__ import annotations

import difflib
import math
import numbers
import sys
from pathlib import Path
from typing import Callable, Iterable

from ..common.errors import UserError
from ..common.user_code import import_file
from ..config.train_config import TrainConfig
from ..telemetry.reward_names import TRL_BUILTINS, TRL_NO_EQUIVALENT, reward_name, translate_reward
from .builtin import BUILTINS
from .rubric import load_rubric
from .rubric_reward import RubricReward
from .scoring import RewardFunction


# A reasoning block directly followed by an answer block, only whitespace
# around and between. Tag uniqueness is checked separately (counts).
def load_rewards(config: TrainConfig, base_dir: Path) -> list[RewardFunction]:
    """The run's reward functions: the config's list, and its rubric as one more (named "rubric")."""
    functions = load_reward_functions([(r.name, r.weight) for r in config.rewards], base_dir)
    if config.rubric_file is not None:
        path = Path(config.rubric_file)
        rubric = load_rubric(path if path.is_absolute() else base_dir / path)
        functions.append(RewardFunction("rubric", RubricReward(rubric, criteria_every=config.log_every),
                                        config.rubric_weight))
    return functions


def load_reward_functions(specs: Iterable[tuple[str, float]], base_dir: str | Path) -> list[RewardFunction]:
    """Resolve ``(spec, weight)`` pairs (a dict's ``.items()`` works).

    A spec is a built-in name, or ``file.py:function`` with the file relative to
    ``base_dir`` (normally the config file's folder) or absolute; TRL's spellings
    are read too (reward_names.py). The reward's name is the built-in name as
    written or the function name; names must be unique because they become
    metric names.
    """
    modules: dict[Path, object] = {}
    loaded: list[RewardFunction] = []
    for spec, weight in specs:
        if not isinstance(weight, numbers.Real) or not math.isfinite(weight):
            raise UserError(f"reward '{spec}': weight must be a finite number, got {weight!r}")
        name, fn, from_file = _resolve(spec, Path(base_dir), modules)
        if any(r.name == name for r in loaded):
            raise UserError(f"reward function '{name}' is listed twice")
        loaded.append(RewardFunction(name, fn, float(weight), from_file=from_file))
    return loaded


def _resolve(spec: str, base_dir: Path, modules: dict[Path, object]) -> tuple[str, Callable, bool]:
    """(the reward's name, its function, whether it came from a user's file)."""
    spec, note = translate_reward(spec)
    if note is not None:
        print(f"mlx-grpo: note: reward {note}", file=sys.stderr)
    if ":" not in spec:
        if spec not in BUILTINS:
            if spec in TRL_NO_EQUIVALENT:
                raise UserError(f"reward function '{spec}' (TRL's) has no equivalent here: {TRL_NO_EQUIVALENT[spec]}")
            known = ", ".join(sorted(BUILTINS))
            raise UserError(f"unknown reward function '{spec}'{_did_you_mean(spec, [*BUILTINS, *TRL_BUILTINS])}; "
                            f"built-ins are {known}, or use 'file.py:function'")
        return spec, BUILTINS[spec], False
    file_part, _, func_name = spec.rpartition(":")
    if not file_part or not func_name:
        raise UserError(f"reward '{spec}': expected 'path/to/file.py:function_name'")
    path = (base_dir / file_part).resolve()
    if path not in modules:
        modules[path] = import_file(path)
    fn = getattr(modules[path], func_name, None)
    if fn is None:
        functions = [n for n, v in vars(modules[path]).items() if callable(v) and not n.startswith("_")]
        raise UserError(f"reward file {path} has no function '{func_name}'{_did_you_mean(func_name, functions)}")
    if not callable(fn):
        raise UserError(f"reward file {path}: '{func_name}' is a {type(fn).__name__}, not a function")
    return reward_name(spec), fn, True


def _did_you_mean(name: str, candidates: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.75)
    return f" (did you mean '{close[0]}'?)" if close else ""


