"""Rewards for a base model completing a document of worked lines (configs/gemma3_subtraction.yaml).

A base model does not stop after its answer: it goes on writing the next line of the document ("9 - 4 = 5").
So only the completion's first line is its answer, and these read the first number there.
"""

from __future__ import annotations

import re

NUMBER = re.compile(r"-?\d+")


def first_line_number(completion: str) -> str | None:
    line = completion.strip().split("\n", 1)[0] if completion.strip() else ""
    found = NUMBER.search(line)
    return found.group() if found else None


def first_line_correct(prompts, completions, answers, **_) -> list[bool]:
    """Accuracy: the first line's number is the answer."""
    return [first_line_number(c) == str(a).strip() for c, a in zip(completions, answers)]


def first_line_check(prompts, completions, answers, **_) -> list[float]:
    """2.0 when the first line's number is the answer."""
    return [2.0 * ok for ok in first_line_correct(prompts, completions, answers)]
