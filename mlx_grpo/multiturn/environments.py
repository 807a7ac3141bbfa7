"""Environments: what answers the model between its turns.

An environment is any class with two methods (a new instance per trajectory):

    reset(row: dict) -> None          # the dataset row this trajectory answers
    step(text: str) -> Turn           # the model's turn, as text; returns what comes next

`Turn.messages` are chat messages appended after the model's turn (`{"role": "tool", "content": ...}` for a
tool's result, `{"role": "user", ...}` for the world's answer), `Turn.reward` an optional reward for this turn
(summed over the trajectory into the `environment` reward), and `Turn.done` ends the trajectory. Tools are one
such environment (`ToolEnvironment`); `number_guess` is a built-in game; `environment: file.py:Class` names
your own."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from ..common.errors import UserError
from ..common.user_code import import_file
from .calls import CallFormat, Malformed, parse_calls
from .tools import ToolRunner


@dataclass
class Turn:
    messages: list[dict] = field(default_factory=list)
    reward: float | None = None
    done: bool = False
    calls: list[tuple[str, bool]] = field(default_factory=list)  # (tool name, failed) of each call made


class Environment(Protocol):
    def reset(self, row: dict) -> None: ...

    def step(self, text: str) -> Turn: ...


class ToolEnvironment:
    """The model calls tools: each call in its turn is run and its result appended as a `tool` message; a turn
    without a call ends the trajectory (it is the answer)."""

    def __init__(self, runner: ToolRunner, fmt: CallFormat):
        self.runner, self.fmt = runner, fmt

    def reset(self, row: dict) -> None:
        pass

    def step(self, text: str) -> Turn:
        calls = parse_calls(text, self.fmt, self.runner.schemas)
        if not calls:
            return Turn(done=True)
        turn = Turn()
        for call in calls:
            if isinstance(call, Malformed):
                turn.messages.append({"role": "tool", "content": f"error: malformed tool call: {call.reason}"})
                turn.calls.append(("malformed", True))
                continue
            result = self.runner.call(call.name, call.arguments)
            turn.messages.append({"role": "tool", "name": call.name, "content": result.text})
            turn.calls.append((call.name, result.failed))
        return turn


class NumberGuess:
    """Guess the row's number (its `answer`, an integer): after each guess the model is told "higher" or
    "lower". Reward 1 when found. Its dataset: any rows whose prompt states the game and range and whose answer
    is the number, e.g. `Guess my number between 1 and 100. Reply with one number per turn.`"""

    def reset(self, row: dict) -> None:
        self.secret = int(str(row["answer"]).strip())

    def step(self, text: str) -> Turn:
        numbers = re.findall(r"-?\d+", text)
        if not numbers:
            return Turn([{"role": "user", "content": "Reply with one whole number."}])
        guess = int(numbers[-1])
        if guess == self.secret:
            return Turn(reward=1.0, done=True)
        return Turn([{"role": "user", "content": "Higher." if guess < self.secret else "Lower."}])


BUILTIN_ENVIRONMENTS: dict[str, type] = {"number_guess": NumberGuess}


def environment_factory(spec: str, base_dir: Path) -> Callable[[], Any]:
    """A maker of fresh environments from a built-in name or `file.py:Class` (imported because the config or
    command line names it)."""
    if ":" not in spec:
        if spec not in BUILTIN_ENVIRONMENTS:
            raise UserError(f"unknown environment '{spec}'; built-in: {', '.join(BUILTIN_ENVIRONMENTS)}, "
                            "or use 'file.py:Class'")
        return BUILTIN_ENVIRONMENTS[spec]
    file_part, _, name = spec.rpartition(":")
    path = (base_dir / file_part).resolve()
    cls = getattr(import_file(path, "environment file"), name, None)
    if cls is None or not all(callable(getattr(cls, m, None)) for m in ("reset", "step")):
        raise UserError(f"environment file {path}: '{name}' is not a class with reset(row) and step(text) methods")
    return cls
