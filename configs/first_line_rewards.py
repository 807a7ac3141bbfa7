"""Rewards for a base model answering in a question-and-answer document (configs/gemma3_sums.yaml).

A base model does not stop after its answer: it goes on writing the next "Q: ..." of the document. So only
the completion's first line is its answer, and these read the first number there.
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


def first_line_digits(prompts, completions, answers, **_) -> list[float]:
    """Up to 1.0 for the digits of the answer the first line's number gets right (units aligned): a signal from
    groups where no completion is right yet."""
    out = []
    for completion, answer in zip(completions, answers):
        got, want = first_line_number(completion), str(answer).strip()
        if got is None or not got.lstrip("-").isdigit():
            out.append(0.0)
            continue
        width = max(len(got), len(want))
        out.append(sum(g == w for g, w in zip(got.rjust(width), want.rjust(width, "_"))) / width)
    return out
