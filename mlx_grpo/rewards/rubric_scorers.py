"""The scorers a rubric criterion can use; each turns a batch of completions into scores.

Rule scorers return 0..1 (1 = the criterion is met). Every scorer is called with the whole
batch: `scorer(prompts, completions, answers, columns)` where `columns` holds the dataset's
other columns, one list per column. `rubric.py` builds these from a validated rubric file.
"""

from __future__ import annotations

import math
import re
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..common.errors import UserError
from ..tasks.answer_format import extract_answer
from .judge import Judge, JudgeBatch

# Thousands separators are accepted ("1,234"); a plain run of digits is the common case ("0357").
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+")


class CriterionFailed(Exception):
    """A user function raised: its criterion is missing for this batch; the run goes on."""


def numbers_in(text: str) -> list[float]:
    return [float(match.replace(",", "")) for match in _NUMBER.findall(text)]


def completion_number(completion: str, require_tags: bool) -> float | None:
    """The number a completion answers with.

    Inside <answer> tags the first number counts (the tag holds the answer, maybe followed by
    units or words); without tags the last number counts (final answers come at the end).
    """
    tagged = extract_answer(completion)
    if tagged is not None:
        found = numbers_in(tagged)
        return found[0] if found else None
    if require_tags:
        return None
    found = numbers_in(completion)
    return found[-1] if found else None


@dataclass(frozen=True)
class RegexScorer:
    pattern: re.Pattern
    full: bool  # the whole completion must match, not just a part of it
    negate: bool  # score 1 when the pattern does NOT match

    def __call__(self, prompts, completions, answers, columns) -> list[float | None]:
        match = self.pattern.fullmatch if self.full else self.pattern.search
        return [float((match(c) is not None) != self.negate) for c in completions]


@dataclass(frozen=True)
class SubstringScorer:
    texts: tuple[str, ...]
    require_all: bool
    case_sensitive: bool
    negate: bool

    def __call__(self, prompts, completions, answers, columns) -> list[float | None]:
        needles = self.texts if self.case_sensitive else tuple(t.lower() for t in self.texts)
        combine = all if self.require_all else any
        scores = []
        for completion in completions:
            haystack = completion if self.case_sensitive else completion.lower()
            scores.append(float(combine(n in haystack for n in needles) != self.negate))
        return scores


@dataclass(frozen=True)
class LengthScorer:
    minimum: float | None
    maximum: float | None
    words: bool  # count whitespace-separated words instead of characters
    slack: float  # 0 = hard limits; else the score falls linearly to 0 this far outside the range

    def __call__(self, prompts, completions, answers, columns) -> list[float | None]:
        return [self.score_one(len(c.split()) if self.words else len(c)) for c in completions]

    def score_one(self, length: int) -> float:
        distance = 0.0
        if self.minimum is not None and length < self.minimum:
            distance = self.minimum - length
        elif self.maximum is not None and length > self.maximum:
            distance = length - self.maximum
        if distance == 0:
            return 1.0
        return max(0.0, 1.0 - distance / self.slack) if self.slack > 0 else 0.0


@dataclass(frozen=True)
class NumericAnswerScorer:
    tolerance: float  # absolute difference still counted as correct
    require_tags: bool  # an untagged completion scores 0 even if its last number is right

    def __call__(self, prompts, completions, answers, columns) -> list[float | None]:
        scores: list[float | None] = []
        for completion, answer in zip(completions, answers):
            expected = numbers_in(str(answer)) if answer is not None else []
            if not expected:
                scores.append(None)  # nothing to compare with: a data problem, not a wrong answer
                continue
            got = completion_number(completion, self.require_tags)
            scores.append(float(got is not None and abs(got - expected[0]) <= self.tolerance))
        return scores


@dataclass(frozen=True)
class PythonScorer:
    """A user function with the reward-function signature: fn(prompts, completions, answers, **columns).

    Like a reward function, one that raises gives missing scores (CriterionFailed) and the run goes
    on; one that returns the wrong shape or type is a bug to fix now (UserError).
    """

    function: Callable
    where: str  # "file.py:function" for error messages

    def __call__(self, prompts, completions, answers, columns) -> list[float | None]:
        try:
            result = self.function(prompts, completions, answers, **columns)
        except Exception as err:  # the user's code: report it as theirs, in one line
            frames = traceback.extract_tb(err.__traceback__)
            at = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if len(frames) > 1 else ""
            first_line = (str(err).strip().splitlines() or [""])[0]
            raise CriterionFailed(f"{self.where} raised {type(err).__name__}: {first_line}{at}") from err
        if not isinstance(result, (list, tuple)) or len(result) != len(completions):
            got = f"{len(result)} values" if isinstance(result, (list, tuple)) else type(result).__name__
            raise UserError(f"{self.where} must return a list of {len(completions)} scores, got {got}")
        scores: list[float | None] = []
        for value in result:
            if value is None:
                scores.append(None)
            elif isinstance(value, (bool, int, float)):
                scores.append(float(value) if math.isfinite(value) else None)
            else:
                raise UserError(f"{self.where} returned {type(value).__name__} {value!r}; "
                                "scores must be numbers or None")
        return scores


@dataclass(frozen=True)
class JudgeScorer:
    judge: Judge
    criterion: str
    template: str
    low: float
    high: float

    def __call__(self, prompts, completions, answers, columns) -> JudgeBatch:
        answers = ["" if a is None else str(a) for a in answers]
        return self.judge.score(self.criterion, self.template, self.low, self.high, prompts, completions, answers)
