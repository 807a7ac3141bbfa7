"""The built-in reward functions, chosen in a config by name.

They read completions in the task's answer format (``tasks/answer_format.py``:
``<reasoning>...</reasoning><answer>...</answer>``): ``format_exact``, ``format_approx``, ``answer_check``
(alias ``check_answer``), ``number_check`` (alias ``check_numbers``) and ``digit_match`` (partial credit per
digit); for replies in prose without tags, ``last_number_check`` and ``last_number_digits`` read the reply's
last number. Each has the signature of every reward function (scoring.py). This module imports no mlx.
"""

from __future__ import annotations

import re
from typing import Callable

from ..tasks.answer_format import NUMBER_IN_TEXT, TAGS, answer_value, extract_answer, is_correct, last_number, normalise

# A reasoning block directly followed by an answer block, only whitespace
# around and between. Tag uniqueness is checked separately (counts).
_LAYOUT = re.compile(r"\s*{}.*{}\s*{}.*{}\s*".format(*map(re.escape, TAGS)), re.DOTALL)


def _first_number(text: str) -> float | None:
    match = NUMBER_IN_TEXT.search(text)
    return float(match.group().replace(",", "")) if match else None


def _same_value(got: str, want: str) -> bool:
    """Equal once normalised; numbers by value, so "42.0" equals "42"."""
    if normalise(got) == normalise(want):
        return True
    got_n, want_n = answer_value(got), answer_value(want)
    return got_n is not None and got_n == want_n


# ---------------------------------------------------------- per-sample scores


def _format_exact_one(completion: str) -> float:
    once = all(completion.count(tag) == 1 for tag in TAGS)
    return 3.0 if once and _LAYOUT.fullmatch(completion) else 0.0


def _format_approx_one(completion: str) -> float:
    score = sum(0.5 if completion.count(tag) == 1 else -0.5 for tag in TAGS)
    starts = [completion.find(tag) for tag in TAGS]
    in_order = -1 not in starts and starts == sorted(starts)
    score += 0.25 if in_order else -0.25
    score += 0.25 if _LAYOUT.fullmatch(completion) else -0.25
    return score


def _answer_check_one(completion: str, answer: str) -> float:
    got = extract_answer(completion)
    if got is None:
        return -1.0
    if got == answer.strip():
        return 3.0
    if _same_value(got, answer):
        return 1.5
    got_n, want_n = answer_value(got), answer_value(answer)
    if got_n is None or want_n is None or want_n == 0:
        return -1.0
    ratio = got_n / want_n
    if 0.9 <= ratio <= 1.1:
        return 0.5
    if 0.8 <= ratio <= 1.2:
        return 0.25
    return -1.0


def _number_check_one(completion: str, answer: str) -> float:
    got = extract_answer(completion)
    if got is None:
        return 0.0
    got_n, want_n = _first_number(got), _first_number(answer)
    return 1.5 if got_n is not None and got_n == want_n else 0.0


def _digit_share(got: str | None, want: str) -> float:
    """The share of digit positions where two whole numbers agree, in [0, 1]; 0 unless both are whole numbers."""
    want = want.strip()
    if got is None or not got.isdigit() or not want.isdigit():
        return 0.0
    width = max(len(got), len(want))
    # Right-aligned, so units meet units; a missing or extra leading digit counts as a miss.
    matches = sum(g == w for g, w in zip(got.rjust(width, " "), want.rjust(width, "_")))
    return matches / width


def _digit_match_one(completion: str, answer: str) -> float:
    return 2.0 * _digit_share(extract_answer(completion), answer)


# ------------------------------------------------------------------ built-ins


def format_exact(prompts, completions, answers, **columns) -> list[float]:
    """3.0 when the completion is exactly one reasoning block then one answer
    block (whitespace allowed around and between them, nothing else), else 0."""
    return [_format_exact_one(c) for c in completions]


def format_approx(prompts, completions, answers, **columns) -> list[float]:
    """Partial format credit in [-2.5, +2.5], in steps of 0.25.

    ====================================================  =======  =======
    check                                                 pass     fail
    ====================================================  =======  =======
    each of the 4 tags appears exactly once (x4)          +0.5     -0.5
    all 4 tags present, first occurrences in order        +0.25    -0.25
    layout: reasoning block, then answer block, only      +0.25    -0.25
    whitespace before, between and after (no trailing)
    ====================================================  =======  =======

    No tags at all scores -2.5; +2.5 happens exactly when ``format_exact``
    gives 3.0.
    """
    return [_format_approx_one(c) for c in completions]


def answer_check(prompts, completions, answers, **columns) -> list[float]:
    """Correctness of the extracted answer, in [-1, +3].

    3.0 exact text; 1.5 same after normalising (whitespace, commas, '$',
    case, a final '.', and numbers by value so "42.0" matches "42"); 0.5 when
    the numeric ratio got/expected is within 10%; 0.25 within 20%; -1.0 for a
    wrong or missing answer (an expected 0 gets no ratio credit).
    """
    return [_answer_check_one(c, a) for c, a in zip(completions, answers)]


def answer_in_form(prompts, completions, answers, **columns) -> list[float]:
    """Correctness first, the form paid only with it: a right number in the answer block (by value) scores 1
    plus up to 1 for the form, graded by `format_approx`'s checks (2.0 exactly when the completion is one
    reasoning block then one answer block); a wrong or missing answer scores 0. A group with no right answer
    gives no signal, so nothing pays for the form alone (emptying the reasoning to get the form, format gaming,
    costs answers); and the form's credit is graded because a model that never writes the whole form when
    sampled would otherwise never be shown a step towards it (Qwen2.5-Coder-0.5B learnt to answer right in
    prose with an answer tag, and never once closed a reasoning block)."""
    scores = []
    for completion, answer in zip(completions, answers):
        got = extract_answer(completion)
        right = got is not None and _same_value(got, answer)
        scores.append(1.0 + (_format_approx_one(completion) + 2.5) / 5.0 if right else 0.0)
    return scores


def number_check(prompts, completions, answers, **columns) -> list[float]:
    """1.5 when the first number in the answer block equals the first number
    of the expected answer (commas ignored, compared by value), else 0."""
    return [_number_check_one(c, a) for c, a in zip(completions, answers)]


def digit_match(prompts, completions, answers, **columns) -> list[float]:
    """Partial credit for whole-number answers, in [0, 2]: 2.0 x the share of digit positions (aligned
    from the right, units with units) where the answer block agrees with the expected answer; 0 when
    either is not a whole number. A near miss ("359" for "349") earns 1.33, so a group with no correct
    sample still tells better attempts from worse ones."""
    return [_digit_match_one(c, a) for c, a in zip(completions, answers)]


def last_number_check(prompts, completions, answers, **columns) -> list[float]:
    """2.0 when the completion's last number is the expected answer (by value, thousands commas ignored),
    else 0: correctness for a model that answers in prose ("7 + 5 = 12.") instead of an answer block."""
    return [2.0 if is_correct(c, a, "last_number") else 0.0 for c, a in zip(completions, answers)]


def last_number_digits(prompts, completions, answers, **columns) -> list[float]:
    """Partial credit in [0, 1]: the share of digit positions (aligned from the right) where the
    completion's last number agrees with the expected whole-number answer. A near miss ("13" for "12")
    earns 0.5, so a group with no correct reply still tells better attempts from worse ones."""
    return [_digit_share(last_number(c), a) for c, a in zip(completions, answers)]


def environment(prompts, completions, answers, environment_reward=None, **columns) -> list[float]:
    """The rewards a multi-turn environment gave the trajectory, summed (0 for a single-turn run)."""
    return [float(r or 0.0) for r in (environment_reward or [0.0] * len(completions))]


def tool_success(prompts, completions, answers, tool_calls=None, tool_failures=None, **columns) -> list[float]:
    """0.5 when the trajectory called a tool and no call failed, -0.5 when a call failed, else 0: a small
    push towards well-formed tool calls (multi-turn runs with tools)."""
    calls, failures = tool_calls or [0] * len(completions), tool_failures or [0] * len(completions)
    return [-0.5 if f else 0.5 if c else 0.0 for c, f in zip(calls, failures)]


def task_score(prompts, completions, answers, reasoning_gym=None, **columns) -> list[float]:
    """A reasoning-gym task's own `score_answer` (0 to 1, partial credit where the task gives it), x 2 so that
    it weighs like answer_check's correct answer against the format rewards. Reads the answer block, or
    without one the reply's last number (tasks/reasoning_gym.py)."""
    from ..tasks import reasoning_gym as task

    metadata = reasoning_gym if reasoning_gym is not None else [None] * len(completions)
    return [2.0 * s for s in task.scores(completions, answers, metadata)]


BUILTINS: dict[str, Callable] = {
    "environment": environment,
    "tool_success": tool_success,
    "format_exact": format_exact,
    "format_approx": format_approx,
    "answer_check": answer_check,
    "answer_in_form": answer_in_form,
    "number_check": number_check,
    "digit_match": digit_match,
    "last_number_check": last_number_check,
    "last_number_digits": last_number_digits,
    "task_score": task_score,
    # Names other GRPO recipes use for the same functions.
    "check_answer": answer_check,
    "check_numbers": number_check,
}
