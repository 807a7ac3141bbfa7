"""The answer format of every task, and its one correctness check.

A completion writes its working in a reasoning block, then its answer in an answer block:
``<reasoning>...</reasoning><answer>...</answer>``. Everything that reads a completion asks this module:
the built-in rewards, accuracy in the trainer and in held-out evaluation, S-GRPO's forced exits, the
default model's tokenizer and the samples table. Imports no mlx.
"""

from __future__ import annotations

import re

OPEN_REASONING, CLOSE_REASONING = "<reasoning>", "</reasoning>"
OPEN_ANSWER, CLOSE_ANSWER = "<answer>", "</answer>"
TAGS = (OPEN_REASONING, CLOSE_REASONING, OPEN_ANSWER, CLOSE_ANSWER)

_PLAIN_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)")
# A number inside free text; "1,234.5" is one number, "12,34" is 12.
NUMBER_IN_TEXT = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")


def extract_answer(completion: str) -> str | None:
    """The stripped text of the last complete answer block, or None."""
    _, found, tail = completion.rpartition(OPEN_ANSWER)
    if not found:
        return None
    inner, closed, _ = tail.partition(CLOSE_ANSWER)
    return inner.strip() if closed else None


def extract_reasoning(completion: str) -> str:
    """The stripped text of the last complete reasoning block; without one, the whole text."""
    _, found, tail = completion.rpartition(OPEN_REASONING)
    inner, closed, _ = tail.partition(CLOSE_REASONING)
    return inner.strip() if found and closed else completion.strip()


def normalise(text: str) -> str:
    """Drop whitespace, thousands commas, '$', a final '.', and case."""
    return re.sub(r"[\s,$]", "", text).lower().rstrip(".")


def answer_value(text: str) -> float | None:
    """The value of a text that is a plain number once normalised ("$1,000.0" -> 1000.0), else None."""
    text = normalise(text)
    return float(text) if _PLAIN_NUMBER.fullmatch(text) else None


def last_number(text: str) -> str | None:
    """The last number in free text, thousands commas dropped ("7 + 5 = 12." -> "12"), or None."""
    found = NUMBER_IN_TEXT.findall(text)
    return found[-1].replace(",", "") if found else None


# Where a completion's answer is read: the answer block, or the reply's last number, for models that
# answer in prose and never write tags ("7 + 5 = 12.").
ANSWER_SOURCES = {"answer_tag": extract_answer, "last_number": last_number}


def is_correct(completion: str, answer: str, read_from: str = "answer_tag") -> bool:
    """Accuracy and evaluation criterion: the answer read from the completion (`read_from`, a key of
    ANSWER_SOURCES) is the expected one.

    Exact text after stripping outer whitespace, or, when both are numbers,
    the same value ("1,000", "$1000" and "1000.0" all equal "1000"). Text is
    case-sensitive here; only the ``answer_check`` reward gives partial credit.
    """
    got = ANSWER_SOURCES[read_from](completion)
    if got is None:
        return False
    if got == answer.strip():
        return True
    got_n, want_n = answer_value(got), answer_value(answer)
    return got_n is not None and got_n == want_n
