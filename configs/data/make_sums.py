"""Writes sums_train.jsonl and sums_heldout.jsonl, the data of configs/smollm2_sums.yaml (same files every time).

Rows ask "What is a + b?" in plain words; the answer is the sum. Each operand is one digit (0-9) or two
(10-29) with equal probability, so difficulty (how many operands have two digits: 1, 2 or 3 for none, one,
both) is about 1/4, 1/2, 1/4. Each unordered pair {a, b} belongs to one split by a fixed hash (30% held
out), so a held-out sum is never trained on in either order. The held-out file holds 200 distinct prompts;
the training file 2,000 rows drawn with replacement. Run: python configs/data/make_sums.py
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

HELDOUT_PERCENT = 30
HELDOUT_ROWS = 200
TRAIN_ROWS = 2000


def is_heldout(a: int, b: int) -> bool:
    lo, hi = sorted((a, b))
    return hashlib.sha256(f"{lo}+{hi}".encode()).digest()[0] * 100 < HELDOUT_PERCENT * 256


def draw(rng: random.Random) -> tuple[int, int]:
    return tuple(rng.randint(0, 9) if rng.random() < 0.5 else rng.randint(10, 29) for _ in range(2))


def row(a: int, b: int) -> dict:
    return {"prompt": f"What is {a} + {b}?", "answer": str(a + b), "difficulty": 1 + (a >= 10) + (b >= 10)}


def main(out_dir: Path = Path(__file__).parent) -> None:
    rng = random.Random("smollm2-sums")
    heldout: dict[tuple[int, int], dict] = {}
    while len(heldout) < HELDOUT_ROWS:
        pair = draw(rng)
        if is_heldout(*pair):
            heldout.setdefault(pair, row(*pair))
    train: list[dict] = []
    while len(train) < TRAIN_ROWS:
        pair = draw(rng)
        if not is_heldout(*pair):
            train.append(row(*pair))
    for name, rows in (("sums_train.jsonl", train), ("sums_heldout.jsonl", list(heldout.values()))):
        (out_dir / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
