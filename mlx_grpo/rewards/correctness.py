"""Which completions are correct: the check behind accuracy/train, the held-out eval/accuracy and the
reports' correctness verdicts.

A check is called like a reward function, `check(prompts, completions, answers, **columns)`, and returns
one bool per completion. `correctness` in the config picks it:

- `auto` (default): for a reasoning-gym dataset, the task's own `score_answer` (a score of 1 is correct);
  else the built-in answer check when the run's task is one it fits (the built-in
  arithmetic task, or a reward set with a built-in answer reward, which reads the same `<answer>` tag);
  otherwise none: a custom task's accuracy is not measurable by us, so it is "n/a" rather than 0%;
- `answer`: the built-in answer check always (the `<answer>...</answer>` text equals the row's answer);
- `last_number`: the reply's last number equals the row's answer, for chat models that answer in prose and
  never write tags ("9 + 21 = 30."); `auto` picks it when the rewards include `last_number_check`;
- `none`: no check (accuracy n/a, no held-out evaluation);
- `file.py:function`: the user's own check, resolved like a reward function.
"""

from __future__ import annotations

import numbers
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..common.errors import UserError
from ..common.terminal import terminal_safe
from ..tasks.answer_format import is_correct
from .loading import load_reward_functions

Check = Callable[..., list]

# Built-in rewards that read the <answer> tag and compare it with the row's answer.
ANSWER_REWARDS = frozenset({"answer_check", "number_check", "digit_match"})


def answer_check(prompts: list, completions: list[str], answers: list[str], **columns: Any) -> list[bool]:
    """The built-in check: the text in <answer> tags is the row's answer (numbers compared by value)."""
    return [is_correct(text, answer) for text, answer in zip(completions, answers)]


def last_number_check(prompts: list, completions: list[str], answers: list[str], **columns: Any) -> list[bool]:
    """The reply's last number is the row's answer (numbers compared by value)."""
    return [is_correct(text, answer, "last_number") for text, answer in zip(completions, answers)]


def task_check(prompts: list, completions: list[str], answers: list[str], **columns: Any) -> list[bool]:
    """A reasoning-gym task's own check: its `score_answer` gives the completion full marks."""
    from ..tasks import reasoning_gym as task

    metadata = columns.get(task.COLUMN) or [None] * len(completions)
    return [score >= 1.0 for score in task.scores(completions, answers, metadata)]


def load_correctness(setting: str, dataset: str, reward_names: list[str], base_dir: Path) -> Check | None:
    """The run's correctness check, or None when accuracy cannot be measured."""
    if setting == "none":
        return None
    if setting == "auto" and dataset.startswith("reasoning-gym:"):
        return task_check
    if setting == "answer":
        return answer_check
    if setting == "last_number" or (setting == "auto" and "last_number_check" in reward_names):
        return last_number_check
    if setting == "auto":
        fits = dataset == "arithmetic" or any(name in ANSWER_REWARDS for name in reward_names)
        return answer_check if fits else None
    if ":" not in setting:
        raise UserError(f"key 'correctness' is {setting!r}; "
                        "expected auto, answer, last_number, none or file.py:function")
    try:
        fn = load_reward_functions([(setting, 1.0)], base_dir)[0].fn
    except UserError as err:
        raise UserError(f"key 'correctness': {err}") from None
    return user_check(setting, fn)


def user_check(spec: str, fn: Callable) -> Check:
    """A user's check, its answer validated: one bool-like value per completion."""

    def check(prompts: list, completions: list[str], answers: list[str], **columns: Any) -> list[bool]:
        try:
            out = list(fn(prompts, completions, answers, **columns))
        except Exception as exc:  # a user's function: say whose it is
            raise UserError(f"correctness function {spec} failed: {type(exc).__name__}: {exc}") from exc
        if len(out) != len(completions):
            raise UserError(f"correctness function {spec} returned {len(out)} values for {len(completions)} "
                            "completions")
        for i, value in enumerate(out):
            if not _is_verdict(value):
                raise UserError(f"correctness function {spec} returned {terminal_safe(repr(value))[:40]} at index {i}; "
                                "expected True/False (or 1/0) for each completion")
        return [bool(x) for x in out]

    return check


def _is_verdict(value: Any) -> bool:
    """True/False, numpy's bools, or the numbers 1 and 0: a string such as "no" is truthy and a NaN is
    neither, so anything else would count as a verdict it is not."""
    if isinstance(value, (bool, np.bool_)):
        return True
    return isinstance(value, numbers.Number) and not isinstance(value, complex) and value in (0, 1)
