"""Reward functions: the built-ins, loading user files, and scoring a batch.

Every reward function, built-in or user-written, has one signature::

    fn(prompts: list[str], completions: list[str], answers: list[str], **columns)
        -> list[float | None]

``prompts[i]``, ``completions[i]`` and ``answers[i]`` describe sample i (a
prompt appears once per completion of its group). ``columns`` carries every
extra dataset column (e.g. ``difficulty=[...]``) as a list aligned with
``completions``; accept ``**columns`` even if you use none, so new columns never
break your function. Return one score per completion; ``None`` (or NaN) means
"no score for this sample", which is recorded as missing.

The built-ins read completions in the task's answer format (``tasks/answer_format.py``:
``<reasoning>...</reasoning><answer>...</answer>``); they are chosen by name:
``format_exact``, ``format_approx``, ``answer_check`` (alias ``check_answer``),
``number_check`` (alias ``check_numbers``) and ``digit_match`` (partial credit per digit); for replies in
prose without tags, ``last_number_check`` and ``last_number_digits`` read the reply's last number. A user function is named as
``path/to/file.py:function_name``, the path relative to the config's folder
or absolute. See ``configs/rewards_example.py``. On a chat dataset (prompts given
as lists of messages) a user function gets TRL's conversational form: each prompt
is its list of messages and each completion ``[{"role": "assistant", "content": text}]``.

This module imports no mlx.
"""

from __future__ import annotations

import difflib
import hashlib
import inspect
import importlib.util
import math
import numbers
import re
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from mlx_grpo.errors import UserError
from mlx_grpo.telemetry.reward_names import TRL_BUILTINS, TRL_NO_EQUIVALENT, reward_name, translate_reward
from mlx_grpo.tasks.answer_format import (NUMBER_IN_TEXT, TAGS, answer_value, extract_answer, is_correct, last_number,
                                          normalise)

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


BUILTINS: dict[str, Callable] = {
    "format_exact": format_exact,
    "format_approx": format_approx,
    "answer_check": answer_check,
    "number_check": number_check,
    "digit_match": digit_match,
    "last_number_check": last_number_check,
    "last_number_digits": last_number_digits,
    # Names other GRPO recipes use for the same functions.
    "check_answer": answer_check,
    "check_numbers": number_check,
}


# -------------------------------------------------------------------- loading


class RewardHooks:
    """What a stateful reward function can tell the run besides its scores. Subclass it and override
    what you need; every method defaults to "nothing to say". The trainer calls each hook once per
    step (or epoch, checkpoint, run end) on every reward function, plain functions included.
    """

    def describe(self) -> str | None:
        """A line printed when the run starts (e.g. the rubric's criteria)."""
        return None

    def step_metrics(self, step: int) -> dict[str, float | None]:
        """Metrics of the batches scored since the last call, added to the step's record."""
        return {}

    def take_alerts(self) -> list[dict]:
        """Alert bodies (level, rule, metric, value, message) raised since the last call."""
        return []

    def end_epoch(self) -> dict[str, float]:
        """Metrics of the epoch that just ended."""
        return {}

    def state_dict(self) -> dict | None:
        """Plain-JSON state for a checkpoint (None: nothing to keep)."""
        return None

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned."""

    def final_metrics(self, run_dir: Path | None) -> dict[str, float | None]:
        """Metrics of the whole run at its end; write any summary files into `run_dir` (None: another rank)."""
        return {}


NO_HOOKS = RewardHooks()


def call_reward(fn: Callable, prompts: list, completions: list, answers: list, columns: Mapping[str, list]):
    """Call a reward function by keyword, as TRL does: `prompts`, `completions`, `answers` (and `answer`,
    TRL's usual column name, for a function that does not take `answers`) and every dataset column under its
    own name (the answer field's too). A function written in the positional form
    `f(p, c, a, **columns)`, whose parameters name none of those, is called positionally. A keyword-style
    function (it names `prompts` or `completions`) with a parameter no column fills is a UserError naming
    that parameter: calling it anyway would fail on every batch with a misleading TypeError."""
    offered = {"prompts": prompts, "completions": completions, "answers": answers, **columns}
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a callable whose signature cannot be read
        return fn(prompts, completions, answers, **columns)
    params = signature.parameters
    if "answers" not in params:
        offered.setdefault("answer", answers)
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        kwargs = offered
    else:
        kwargs = {name: value for name, value in offered.items() if name in params}
    try:
        signature.bind(**kwargs)
    except TypeError:
        unfilled = [p.name for p in params.values() if p.name not in kwargs and p.default is p.empty
                    and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        if unfilled and ({"prompts", "completions"} & set(params)):
            raise UnfilledParameter(_unfilled_message(unfilled, offered)) from None
        return fn(prompts, completions, answers, **columns)
    return fn(**kwargs)


class UnfilledParameter(UserError):
    """A keyword-style reward function names a parameter that no column of the batch fills."""


def _unfilled_message(unfilled: list[str], offered: Mapping[str, list]) -> str:
    names = ", ".join(f"'{n}'" for n in unfilled)
    return (f"takes {names} but the batch has no column of that name (it gets: {', '.join(offered)}); rename "
            "the parameter, or add the column to the dataset")


# A reward function that raises on this many batches in a row stops the run with its error.
MAX_FAILED_BATCHES = 3


@dataclass
class RewardFunction:
    """One configured reward: its metric name, the callable and its weight.

    ``error_reported`` is set the first time ``fn`` raises, so a function that
    fails every step is reported once per run; ``failures_in_a_row`` counts the
    batches it failed on since it last worked.
    """

    name: str
    fn: Callable[..., Sequence[float | None]]
    weight: float
    error_reported: bool = False
    failures_in_a_row: int = 0
    from_file: bool = False  # a user's `file.py:function`: gets TRL's conversational form on chat datasets

    @property
    def hooks(self) -> RewardHooks:
        """The function's hooks, or ones that say nothing for a plain function."""
        return self.fn if isinstance(self.fn, RewardHooks) else NO_HOOKS


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
        modules[path] = _import_file(path)
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


def _import_file(path: Path):
    if not path.is_file():
        raise UserError(f"reward file not found: {path}")
    # A unique module name per path; registered so dataclasses/pickling in the user file work.
    module_name = "mlx_grpo_user_rewards_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        raise UserError(f"cannot import reward file {path}: {_one_line(exc)}") from None
    return module


# -------------------------------------------------------------------- scoring


@dataclass
class RewardScores:
    """Scores of one batch.

    ``per_function[i, j]`` is function i on sample j, NaN where missing.
    ``total[j]`` is the weighted sum over functions with missing scores counted
    as 0 (a sample no function scored totals 0). ``new_errors`` holds one line
    per function that raised for the first time in this run.
    """

    names: list[str]
    per_function: np.ndarray
    total: np.ndarray
    new_errors: list[str]

    def take(self, samples: Sequence[int]) -> "RewardScores":
        """The scores of `samples`, in that order; the batch's error lines stay with every part."""
        samples = list(samples)
        return RewardScores(self.names, self.per_function[:, samples], self.total[samples], self.new_errors)

    @staticmethod
    def concat(parts: Sequence["RewardScores"]) -> "RewardScores":
        """The parts' samples one after another (same functions); each error line once."""
        return RewardScores(parts[0].names, np.concatenate([p.per_function for p in parts], axis=1),
                            np.concatenate([p.total for p in parts]),
                            list(dict.fromkeys(e for p in parts for e in p.new_errors)))


def score_completions(
    functions: Sequence[RewardFunction],
    prompts: Sequence[str],
    completions: Sequence[str],
    answers: Sequence[str],
    columns: Mapping[str, Sequence] | None = None,
) -> RewardScores:
    """Run every reward function on the batch.

    A function that raises gets all-NaN for this batch and does not stop the
    run. A function that returns the wrong number of scores or a non-numeric
    or infinite score is a bug in user code: UserError.
    """
    n = len(completions)
    columns = dict(columns or {})
    matrix = np.full((len(functions), n), np.nan)
    new_errors: list[str] = []
    conversational = _conversational_form(completions, columns)
    for i, reward in enumerate(functions):
        prompts_in, completions_in = conversational if reward.from_file and conversational else (prompts, completions)
        try:
            raw = call_reward(reward.fn, list(prompts_in), list(completions_in), list(answers), columns)
        except UnfilledParameter as exc:
            raise UserError(f"reward function '{reward.name}' {exc}") from None
        except UserError:  # a configuration mistake inside the function (e.g. a rubric criterion): stop the run
            raise
        except (Exception, SystemExit) as exc:  # sys.exit() in a reward function must not end the run
            reward.failures_in_a_row += 1
            if reward.failures_in_a_row >= MAX_FAILED_BATCHES:
                # failing on every batch: training on its missing scores would teach nothing
                raise UserError(f"reward function '{reward.name}' failed on {reward.failures_in_a_row} batches in a "
                                f"row: {_one_line(exc)}{_where(exc)}") from None
            if not reward.error_reported:
                reward.error_reported = True
                new_errors.append(
                    f"reward function '{reward.name}' raised {_one_line(exc)}{_where(exc)}; "
                    "its scores are missing for this batch (further failures are not reported)"
                )
            continue
        reward.failures_in_a_row = 0
        matrix[i] = _validated(reward.name, raw, n)
    weights = np.array([r.weight for r in functions], dtype=float).reshape(-1, 1)
    with np.errstate(over="ignore", invalid="ignore"):
        total = np.nansum(weights * matrix, axis=0)
    if not np.isfinite(total).all():
        # Each score is finite but their weighted sum overflows: every advantage would be NaN and every
        # update skipped, so the run would train on nothing while looking healthy.
        largest = max(functions, key=lambda f: np.nanmax(np.abs(matrix[functions.index(f)]), initial=0.0))
        raise UserError(f"reward scores too large: the weighted total of a completion is not a finite number "
                        f"(reward function '{largest.name}' scores up to "
                        f"{np.nanmax(np.abs(matrix[functions.index(largest)])):.3g}); rescale them")
    return RewardScores([r.name for r in functions], matrix, total, new_errors)


def _conversational_form(completions: Sequence[str], columns: Mapping[str, Sequence]) -> tuple[list, list] | None:
    """TRL's form for a chat dataset (its prompts were lists of messages, kept in the `messages` column):
    each prompt is that list and each completion a one-message list, `[{"role": "assistant", "content": text}]`,
    so TRL functions reading `completion[0]["content"]` work as written. None for a plain-text dataset."""
    messages = columns.get("messages")
    if messages is None or len(messages) != len(completions) or not all(isinstance(m, list) for m in messages):
        return None
    return list(messages), [[{"role": "assistant", "content": text}] for text in completions]


def _validated(name: str, raw, n: int) -> list[float]:
    try:
        values = list(raw)
    except TypeError:
        kind = type(raw).__name__
        raise UserError(f"reward function '{name}' returned {kind}, expected a list of {n} scores") from None
    if len(values) != n:
        raise UserError(f"reward function '{name}' returned {len(values)} scores for {n} completions")
    scores = []
    for j, value in enumerate(values):
        if value is None:
            scores.append(math.nan)
        elif isinstance(value, numbers.Real) and not math.isinf(value):
            scores.append(float(value))
        else:
            raise UserError(
                f"reward function '{name}' returned {value!r} at index {j}; scores must be finite numbers or None"
            )
    return scores


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _where(exc: BaseException) -> str:
    """' at file.py:12' for the innermost frame, so the user finds the failing line."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
