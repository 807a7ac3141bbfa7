"""Datasets and prompts: the built-in arithmetic task, JSONL prompt/answer files, GSM8K rows, and Parquet,
CSV and Hugging Face Hub datasets through Hugging Face `datasets` (an optional extra).

A row is a dict with "prompt" and "answer" strings plus any extra columns (for
example "difficulty"), which reach reward functions as keyword lists. This package
imports no mlx: rows.py reads a record, files.py JSONL and JSON files, tables.py what goes through
Hugging Face `datasets`, prompts.py turns rows into prompt tokens.
"""

from __future__ import annotations

import dataclasses
import math
import random
import sys
from pathlib import Path
from typing import Any

from ..common.errors import UserError
from ..tasks import arithmetic, reasoning_gym
from .files import read_jsonl_dataset
from .prompts import MAX_CHARS_PER_TOKEN, EncodedPrompt, PromptOrder, encode_prompt, longest_prompt, render_prompt
from .rows import ANSWER_LIKE
from .tables import FILE_SUFFIXES, HF_PREFIX, HUB_NAME, TABLE_FORMATS, read_hub_dataset, read_table_dataset

# what the rest of the package reads from here: the datasets above, the prompts in prompts.py
__all__ = ["MAX_CHARS_PER_TOKEN", "EncodedPrompt", "PromptOrder", "encode_prompt", "epoch_steps", "extra_columns",
           "load_datasets", "longest_prompt", "read_dataset", "read_dataset_file", "read_jsonl_dataset",
           "render_prompt"]


def read_dataset_file(path: Path, fmt: str, prompt_field: str, answer_field: str) -> list[dict]:
    """Rows from a local file: .parquet and .csv through Hugging Face datasets, anything else as JSONL."""
    if path.suffix.lower() in TABLE_FORMATS:
        return read_table_dataset(path, fmt, prompt_field, answer_field)
    if path.suffix.lower() == ".tsv":
        raise UserError(f"{path}: tab-separated files are not read; save it as .csv (comma-separated) or .jsonl")
    return read_jsonl_dataset(path, fmt, prompt_field, answer_field)


def read_dataset(source: str, base_dir: Path, split: str, config: Any) -> list[dict]:
    """A config's dataset: a local file (relative to `base_dir`), or else, when `source` reads as
    `owner/name[:config]` or `hf:NAME[:config]`, the `split` of that Hugging Face dataset."""
    if source.startswith(HF_PREFIX):
        return read_hub_dataset(source[len(HF_PREFIX):], split, config.dataset_format, config.prompt_field,
                                config.answer_field, cache_first=True)
    path = Path(source).expanduser()
    path = path if path.is_absolute() else base_dir / path
    fields = (config.dataset_format, config.prompt_field, config.answer_field)
    # A name whose first part is a local directory is a mistyped path, not a hub dataset: say so at once
    # instead of after the hub's ~20 s of retries.
    local_dir = (base_dir / source.split("/", 1)[0]).is_dir()
    if path.is_dir():
        return read_dataset_file(mlx_lm_split(path, split), *fields)
    if path.exists() or path.suffix.lower() in FILE_SUFFIXES or not HUB_NAME.fullmatch(source) or local_dir:
        return read_dataset_file(path, *fields)
    return read_hub_dataset(source, split, *fields)


# mlx-lm's data directory: `data: DIR` holds train.jsonl and, for validation, valid.jsonl (test.jsonl is its
# `--test` set, unused here).
MLX_LM_SPLITS = {"train": "train.jsonl", "test": "valid.jsonl"}


def mlx_lm_split(directory: Path, split: str) -> Path:
    """The file of `split` in an mlx-lm data directory (train.jsonl; valid.jsonl for held-out)."""
    path = directory / MLX_LM_SPLITS[split]
    if not path.is_file():
        found = ", ".join(sorted(p.name for p in directory.glob("*.jsonl"))) or "no .jsonl files"
        raise UserError(f"{directory}: a dataset directory is read as mlx-lm reads it, with train.jsonl for "
                        f"training and valid.jsonl for held-out; it has no {path.name} (found: {found})")
    return path


def _has_valid_split(source: str, base_dir: Path) -> bool:
    path = Path(source).expanduser()
    path = path if path.is_absolute() else base_dir / path
    return path.is_dir() and (path / MLX_LM_SPLITS["test"]).is_file()


def load_datasets(config: Any, base_dir: Path) -> tuple[list[dict], list[dict]]:
    """(train rows, held-out rows) for a run config."""
    if config.dataset == "arithmetic":
        train = arithmetic.make_split("train", config.train_size, config.seed)
        heldout = arithmetic.make_split("heldout", config.eval_size, config.seed)
    elif reasoning_gym.is_task(config.dataset) and config.eval_dataset is None:
        train, heldout = reasoning_gym.splits(config.dataset, config.dataset_options, config.train_size,
                                              config.eval_size, config.seed)
    else:
        train = read_dataset(config.dataset, base_dir, "train", config)
        if config.eval_dataset is not None:
            heldout = read_dataset(config.eval_dataset, base_dir, "test", config)
        elif _has_valid_split(config.dataset, base_dir):
            heldout = read_dataset(config.dataset, base_dir, "test", config)
        else:
            # Hold out a fixed slice so evaluation never sees training prompts.
            shuffled = train[:]
            random.Random(config.seed).shuffle(shuffled)
            n_eval = min(config.eval_size, max(1, len(shuffled) // 20)) if len(shuffled) > 1 else 0
            heldout, train = shuffled[:n_eval], shuffled[n_eval:] or shuffled
        heldout = heldout[: config.eval_size]
    _refuse_answer_rewards(train, config)
    return train, heldout


# Built-in rewards and checks that compare a completion with the row's reference answer.
NEEDS_ANSWER = ("answer_check", "answer_in_form", "check_answer", "number_check", "check_numbers", "digit_match",
                "last_number_check", "last_number_digits", "task_score")


def _refuse_answer_rewards(rows: list[dict], config: Any) -> None:
    """Prompts-only data trains with rewards that need no reference answer; one that does is named."""
    if any(row["answer"] for row in rows):
        return
    needs = [spec.name for spec in config.rewards if spec.name in NEEDS_ANSWER]
    if config.correctness in ("answer", "last_number"):
        needs.append(f"correctness: {config.correctness}")
    if needs:
        raise UserError(f"{config.dataset}: the rows have no reference answer (no column answer, "
                        f"{', '.join(ANSWER_LIKE)}), and {', '.join(needs)} compare completions with one: set "
                        "answer_field to the column that holds it, or use rewards that need none (e.g. format_exact "
                        "or your own file.py:function)")


def epoch_steps(config: Any, base_dir: Path) -> Any:
    """`config` with its `epochs` turned into `num_steps` (each step draws batch_size training rows), said in a
    note; run.json then records the steps."""
    rows = len(load_datasets(config, base_dir)[0])
    steps = max(1, math.ceil(config.epochs * rows / config.batch_size))
    print(f"mlx-grpo: note: epochs: {config.epochs:g} is {steps} steps ({rows} training rows, {config.batch_size} "
          "prompts per step)", file=sys.stderr)
    return dataclasses.replace(config, num_steps=steps, epochs=None)


def extra_columns(rows: list[dict]) -> dict[str, list]:
    """Columns beyond prompt/answer, aligned with rows (missing values become None)."""
    names = sorted({k for row in rows for k in row} - {"prompt", "answer"})
    return {name: [row.get(name) for row in rows] for name in names}

