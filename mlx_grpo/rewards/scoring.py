"""A reward function as the run holds it, and scoring a batch with the run's functions.

Every reward function, built-in or user-written, has one signature::

    fn(prompts: list[str], completions: list[str], answers: list[str], **columns)
        -> list[float | None]

``prompts[i]``, ``completions[i]`` and ``answers[i]`` describe sample i (a
prompt appears once per completion of its group). ``columns`` carries every
extra dataset column (e.g. ``difficulty=[...]``) as a list aligned with
``completions``; accept ``**columns`` even if you use none, so new columns never
break your function. Return one score per completion; ``None`` (or NaN) means
"no score for this sample", which is recorded as missing. On a chat dataset (prompts given
as lists of messages) a user function gets TRL's conversational form: each prompt
is its list of messages and each completion ``[{"role": "assistant", "content": text}]``.

`RewardFunction` (name, callable, weight), `RewardHooks` (what a stateful function tells the run besides its
scores), `call_reward`, `RewardScores` (a batch's scores, which slice and join themselves) and
`score_completions`. The built-ins are builtin.py's, loading is loading.py's. This module imports no mlx.
"""

from __future__ import annotations

import inspect
import math
import numbers
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from ..common.errors import UserError

# A reasoning block directly followed by an answer block, only whitespace
# around and between. Tag uniqueness is checked separately (counts).


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
                                f"row: {one_line(exc)}{_where(exc)}") from None
            if not reward.error_reported:
                reward.error_reported = True
                new_errors.append(
                    f"reward function '{reward.name}' raised {one_line(exc)}{_where(exc)}; "
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


def one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _where(exc: BaseException) -> str:
    """' at file.py:12' for the innermost frame, so the user finds the failing line."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
