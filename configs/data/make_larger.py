"""Writes larger_train.jsonl and larger_heldout.jsonl, the data of configs/gemma3_larger.yaml (the same files
every time).

Rows ask which of two different two-digit numbers is larger, in the question-and-answer form a base model
continues: "Q: Which is larger, 47 or 83?\nA:" (the recipe's system_prompt puts two worked examples before it).
Each unordered pair belongs to one split by a fixed hash (30% held out), so a held-out pair is never trained on
in either order. Run: python configs/data/make_larger.py
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
    return hashlib.sha256(f"larger {lo},{hi}".encode()).digest()[0] * 100 < HELDOUT_PERCENT * 256


def row(a: int, b: int) -> dict:
    return {"prompt": f"Q: Which is larger, {a} or {b}?\nA:", "answer": str(max(a, b))}


def main(out_dir: Path = Path(__file__).parent) -> None:
    rng = random.Random("gemma3-larger")
    heldout: dict[tuple[int, int], dict] = {}
    train: list[dict] = []
    while len(heldout) < HELDOUT_ROWS or len(train) < TRAIN_ROWS:
        a, b = rng.sample(range(10, 100), 2)
        if is_heldout(a, b):
            if len(heldout) < HELDOUT_ROWS:
                heldout.setdefault((min(a, b), max(a, b)), row(a, b))
        elif len(train) < TRAIN_ROWS:
            train.append(row(a, b))
    for name, rows in (("larger_train.jsonl", train), ("larger_heldout.jsonl", list(heldout.values()))):
        (out_dir / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
