"""Example user reward functions for mlx-grpo.

Name one in a run config's rewards as ``rewards_example.py:brevity`` (the
path is relative to the config file's folder, or absolute), with a weight,
next to or instead of the built-ins (format_exact, format_approx,
answer_check, number_check).

Every reward function has this signature::

    fn(prompts: list[str], completions: list[str], answers: list[str], **columns)
        -> list[float | None]

- The three lists are aligned: sample i is (prompts[i], completions[i], answers[i]).
- ``columns`` holds any extra dataset columns (here ``difficulty``), each a list
  aligned with ``completions``. Always accept ``**columns``.
- Return exactly one score per completion. ``None`` means "no score for this
  sample": it is recorded as missing and counts 0 in the weighted total.
- If the function raises, its scores for that batch are missing and the error
  is reported once; the run continues. Returning the wrong number of scores or
  a non-numeric score stops the run with an error naming the function.
"""

from mlx_grpo.tasks.answer_format import extract_answer, is_correct


def brevity(prompts, completions, answers, **columns):
    """Up to 0.5 for short reasoning: full credit under 200 characters, none
    past 600. None when there is no answer block, so unfinished completions
    are not rewarded for being short."""
    scores = []
    for completion in completions:
        if extract_answer(completion) is None:
            scores.append(None)
            continue
        excess = max(0, len(completion) - 200)
        scores.append(0.5 * max(0.0, 1.0 - excess / 400))
    return scores


def difficulty_bonus(prompts, completions, answers, **columns):
    """The row's ``difficulty`` (a number) for a correct answer, 0 otherwise.
    Scores nothing on datasets without a difficulty column."""
    difficulty = columns.get("difficulty")
    if difficulty is None:
        return [None] * len(completions)
    return [float(d) if is_correct(c, a) else 0.0 for c, a, d in zip(completions, answers, difficulty)]
