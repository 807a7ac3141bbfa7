"""Writes larger_train.jsonl and larger_heldout.jsonl, the data of configs/gemma3_larger.yaml (the same files
every time).

Rows are "larger of 37 and 52:" for a base model to complete with the larger number: two different numbers from
10 to 99, in either order. There are 4,005 such pairs; a fixed hash holds out half of them (in both orders), so a
held-out question is never trained on. difficulty: 1 when the tens digits differ, 2 when only the units decide.
Run: python configs/data/make_larger.py
"""

from __future__ import annotations

import random
from pathlib import Path

from make_sums import write_splits

HELDOUT_PERCENT = 50
HELDOUT_ROWS = 100
TRAIN_ROWS = 2000


def draw(rng: random.Random) -> tuple[int, int]:
    a, b = rng.sample(range(10, 100), 2)
    return a, b


def key(a: int, b: int) -> str:
    return f"{min(a, b)}<{max(a, b)}"


def row(a: int, b: int) -> dict:
    return {"prompt": f"larger of {a} and {b}:", "answer": str(max(a, b)), "difficulty": 1 + (a // 10 == b // 10)}


def main(out_dir: Path = Path(__file__).parent) -> None:
    write_splits(out_dir, "larger", random.Random("gemma3-larger"), draw, key, row,
                 HELDOUT_ROWS, TRAIN_ROWS, HELDOUT_PERCENT)


if __name__ == "__main__":
    main()
