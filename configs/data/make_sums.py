"""Writes sums_train.jsonl and sums_heldout.jsonl, the data of configs/smollm2_sums.yaml (same files every time).

Rows ask "What is a + b?" in plain words; the answer is the sum. Each operand is one digit (0-9) or two
(10-29) with equal probability, so difficulty (how many operands have two digits: 1, 2 or 3 for none, one,
both) is about 1/4, 1/2, 1/4. Each unordered pair {a, b} belongs to one split by a fixed hash (30% held
out), so a held-out sum is never trained on in either order. The held-out file holds 200 distinct prompts;
the training file 2,000 rows drawn with replacement. Run: python configs/data/make_sums.py

write_splits is the writer the other generators here share (configs/data/make_subtraction.py).
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Callable

HELDOUT_PERCENT = 30
HELDOUT_ROWS = 200
TRAIN_ROWS = 2000


def is_heldout(key: str, percent: int = HELDOUT_PERCENT) -> bool:
    """A fixed hash of the question's key puts it in the held-out split (percent of keys) or the training one."""
    return hashlib.sha256(key.encode()).digest()[0] * 100 < percent * 256


def write_splits(out_dir: Path, stem: str, rng: random.Random, draw: Callable[[random.Random], tuple],
                 key: Callable[..., str], row: Callable[..., dict], heldout_rows: int = HELDOUT_ROWS,
                 train_rows: int = TRAIN_ROWS, heldout_percent: int = HELDOUT_PERCENT) -> None:
    """Writes STEM_train.jsonl (train_rows rows drawn with replacement) and STEM_heldout.jsonl (heldout_rows
    distinct prompts; heldout_percent of the keys), drawing operands with draw(rng). key(*operands) splits them:
    it is the same for every order of operands that asks the same thing, so no held-out question is trained on
    in any order."""
    heldout: dict[str, dict] = {}
    while len(heldout) < heldout_rows:
        operands = draw(rng)
        if is_heldout(key(*operands), heldout_percent):
            held = row(*operands)
            heldout.setdefault(held["prompt"], held)
    train: list[dict] = []
    while len(train) < train_rows:
        operands = draw(rng)
        if not is_heldout(key(*operands), heldout_percent):
            train.append(row(*operands))
    for split, rows in (("train", train), ("heldout", list(heldout.values()))):
        (out_dir / f"{stem}_{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def draw(rng: random.Random) -> tuple[int, int]:
    return tuple(rng.randint(0, 9) if rng.random() < 0.5 else rng.randint(10, 29) for _ in range(2))


def key(a: int, b: int) -> str:
    return f"{min(a, b)}+{max(a, b)}"


def row(a: int, b: int) -> dict:
    return {"prompt": f"What is {a} + {b}?", "answer": str(a + b), "difficulty": 1 + (a >= 10) + (b >= 10)}


def main(out_dir: Path = Path(__file__).parent) -> None:
    write_splits(out_dir, "sums", random.Random("smollm2-sums"), draw, key, row)


if __name__ == "__main__":
    main()
