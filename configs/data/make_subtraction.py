"""Writes subtraction_train.jsonl and subtraction_heldout.jsonl, the data of configs/gemma3_subtraction.yaml
(the same files every time).

Rows are a bare equation for a base model to complete, "23 - 7 =": a from 5 to 30, b a one-digit number no
larger than a, the answer a - b (the recipe's system_prompt puts three worked lines before it). There are 224
such questions; a fixed hash holds out half of them, so a held-out question is never trained on. difficulty: 1
without a borrow (27 - 4), 2 with one (23 - 7). The writer is make_sums.py's.
Run: python configs/data/make_subtraction.py
"""

from __future__ import annotations

import random
from pathlib import Path

from make_sums import write_splits

HELDOUT_PERCENT = 50
HELDOUT_ROWS = 100
TRAIN_ROWS = 2000


def draw(rng: random.Random) -> tuple[int, int]:
    a = rng.randint(5, 30)
    return a, rng.randint(1, min(9, a))


def key(a: int, b: int) -> str:
    return f"{a}-{b}"


def row(a: int, b: int) -> dict:
    return {"prompt": f"{a} - {b} =", "answer": str(a - b), "difficulty": 1 + (a % 10 < b)}


def main(out_dir: Path = Path(__file__).parent) -> None:
    write_splits(out_dir, "subtraction", random.Random("gemma3-subtraction"), draw, key, row,
                 HELDOUT_ROWS, TRAIN_ROWS, HELDOUT_PERCENT)


if __name__ == "__main__":
    main()
