"""Writes two_digit_sums_train.jsonl and two_digit_sums_heldout.jsonl, the data of configs/gemma3_sums.yaml
(the same files every time).

Rows ask for a sum of a two-digit number (10-59) and a one-digit one (1-9) in the question-and-answer form a
base model continues: "Q: What is 47 + 8?\nA:" (the recipe's system_prompt puts two worked examples before
it). Each unordered pair {a, b} belongs to one split by a fixed hash (30% held out), so a held-out sum is never trained on in
either order. difficulty: 1 without a carry, 2 with one. Run: python configs/data/make_two_digit_sums.py
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

HELDOUT_PERCENT = 30
HELDOUT_ROWS = 100
TRAIN_ROWS = 2000


def is_heldout(a: int, b: int) -> bool:
    lo, hi = sorted((a, b))
    return hashlib.sha256(f"two-digit {lo}+{hi}".encode()).digest()[0] * 100 < HELDOUT_PERCENT * 256


def row(a: int, b: int) -> dict:
    return {"prompt": f"Q: What is {a} + {b}?\nA:", "answer": str(a + b), "difficulty": 1 + (a % 10 + b % 10 >= 10)}


def main(out_dir: Path = Path(__file__).parent) -> None:
    rng = random.Random("gemma3-two-digit-sums")
    heldout: dict[tuple[int, int], dict] = {}
    train: list[dict] = []
    while len(heldout) < HELDOUT_ROWS or len(train) < TRAIN_ROWS:
        a, b = rng.randint(10, 59), rng.randint(1, 9)
        if is_heldout(a, b):
            if len(heldout) < HELDOUT_ROWS:
                heldout.setdefault((a, b), row(a, b))
        elif len(train) < TRAIN_ROWS:
            train.append(row(a, b))
    for name, rows in (("two_digit_sums_train.jsonl", train),
                       ("two_digit_sums_heldout.jsonl", list(heldout.values()))):
        (out_dir / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
