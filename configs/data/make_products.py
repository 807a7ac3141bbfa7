"""Writes products_train.jsonl and products_heldout.jsonl, the data of configs/qwen_calculator.yaml.

Word problems whose answer is a product of a 3-digit and a 4-digit number ("A depot ships 487 crates of 3916
nails each. How many nails does it ship?"): a 0.5B model gets few of these right in its head, and every one
right with a calculator. Each unordered pair of numbers belongs to one split by a fixed hash (make_sums.py's
write_splits), so no held-out product is trained on, in any wording. 2,000 training rows, 64 held out.
Run: python configs/data/make_products.py
"""

from __future__ import annotations

import random
from pathlib import Path

from make_sums import write_splits

STORIES = [
    "A depot ships {a} crates with {b} nails in each crate. How many nails does it ship?",
    "A farm has {a} rows of trees with {b} apples on each row. How many apples are there?",
    "A printer makes {b} pages an hour for {a} hours. How many pages does it make?",
    "Each of {a} buses carries {b} letters. How many letters do the buses carry in all?",
    "A library has {a} shelves holding {b} pages of notes each. How many pages of notes are there?",
    "A factory packs {b} screws into each of {a} boxes. How many screws are packed?",
]


def draw(rng: random.Random) -> tuple[int, int, int]:
    return rng.randint(100, 999), rng.randint(1000, 9999), rng.randrange(len(STORIES))


def key(a: int, b: int, story: int) -> str:
    return f"{a}*{b}"


def row(a: int, b: int, story: int) -> dict:
    return {"prompt": STORIES[story].format(a=a, b=b), "answer": str(a * b)}


def main(out_dir: Path = Path(__file__).parent) -> None:
    write_splits(out_dir, "products", random.Random("qwen-calculator-products"), draw, key, row, heldout_rows=64)


if __name__ == "__main__":
    main()
