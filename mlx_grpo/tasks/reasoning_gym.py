"""reasoning-gym tasks as datasets: `dataset: reasoning-gym:chain_sum` (the optional `reasoning-gym` extra).

reasoning-gym's generators make question/answer rows from a seed, and each task scores an answer with its
own `score_answer` (1.0 right, partial credit for some tasks). Training rows come from the run's seed and
held-out rows from another seed, with any question that is also a training question dropped, so evaluation
never sees a prompt trained on. Each row keeps its generator's metadata in a `reasoning_gym` column, which is
what `score_answer` reads. Imports no mlx; reasoning-gym itself is imported only when such a task is used.
"""

from __future__ import annotations

from typing import Any

from ..common.errors import UserError, install_hint
from .answer_format import answer_value, extract_answer, last_number

PREFIX = "reasoning-gym:"
COLUMN = "reasoning_gym"  # the generator's metadata of each row, for score_answer
HELDOUT_SEED_OFFSET = 1_000_003  # the held-out rows' seed, apart from the training rows'


def is_task(dataset: str) -> bool:
    return dataset.startswith(PREFIX)


def _module() -> Any:
    try:
        import reasoning_gym
    except ImportError:
        raise UserError(f"a reasoning-gym dataset needs the reasoning-gym package, which is not installed: "
                        f"{install_hint('reasoning-gym')}") from None
    return reasoning_gym


def _generate(name: str, options: dict, seed: int, size: int) -> list[dict]:
    rg = _module()
    try:
        data = rg.create_dataset(name, seed=seed, size=size, **options)
    except Exception as err:  # an unknown task or a bad option: the generator says which, in one line
        detail = " ".join(str(err).split())[:300]
        known = ""
        if "not registered" in str(err) or isinstance(err, KeyError):
            from reasoning_gym.factory import DATASETS

            known = f" (tasks: {', '.join(sorted(DATASETS)[:12])}, ... {len(DATASETS)} in all)"
        raise UserError(f"reasoning-gym:{name}: the generator refused {options or 'its defaults'}: "
                        f"{type(err).__name__}: {detail}{known}") from None
    return [{"prompt": entry["question"], "answer": str(entry["answer"]),
             COLUMN: {**entry["metadata"], "source_dataset": entry["metadata"].get("source_dataset", name)}}
            for entry in data]


def splits(dataset: str, options: dict | None, train_size: int, eval_size: int, seed: int) -> tuple[list, list]:
    """(training rows, held-out rows) of `reasoning-gym:TASK`; the held-out rows hold no training question."""
    name = dataset[len(PREFIX):]
    if not name:
        raise UserError(f"dataset {dataset!r}: name the task, e.g. reasoning-gym:chain_sum")
    options = dict(options or {})
    train = _generate(name, options, seed, train_size)
    seen = {row["prompt"] for row in train}
    heldout = [row for row in _generate(name, options, seed + HELDOUT_SEED_OFFSET, eval_size)
               if row["prompt"] not in seen]
    if not heldout:
        raise UserError(f"{dataset}: every held-out question is also a training question (the task has few "
                        "distinct questions): lower train_size or widen the generator's options")
    return train, heldout


def read_answer(completion: str, reference: str) -> str:
    """What a completion answers: its answer block; without one, its last number when the reference is a
    number (a chat model replying in prose), else its last non-empty line."""
    tagged = extract_answer(completion)
    if tagged is not None:
        return tagged
    if answer_value(reference) is not None:
        return last_number(completion) or ""
    lines = [line.strip() for line in completion.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def scores(completions: list[str], answers: list[str], metadata: list[dict | None]) -> list[float]:
    """Each completion's score from its task's own `score_answer` (0 to 1)."""
    rg = _module()
    out = []
    for text, answer, meta in zip(completions, answers, metadata):
        if not isinstance(meta, dict) or "source_dataset" not in meta:
            raise UserError("the task_score reward and check read a reasoning-gym dataset's rows "
                            "(dataset: reasoning-gym:TASK); this row has no reasoning_gym column")
        score = rg.get_score_answer_fn(meta["source_dataset"])
        entry = {"answer": answer, "metadata": meta}
        out.append(float(score(read_answer(text, answer), entry) or 0.0))
    return out
