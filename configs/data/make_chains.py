"""Writes chains_train.jsonl and chains_heldout.jsonl, the data of configs/qwen_think.yaml.

Sums of three 2-digit numbers ("Compute 87 + 11 + 43."), then the form drawn out: a reasoning block for the
working, one operation per line, then an answer block with the number alone. Asked this way,
Qwen2.5-Coder-0.5B-Instruct untrained keeps the form about half the time when sampled, and its wrong answers
are mostly sums guessed in one line ("The sum of 58, 69 and 64 is 181.") instead of worked pair by pair. Asked
for the form in one sentence instead, it opened the reasoning block and almost never closed it, at any length
of training. Each chain belongs to one split by a fixed hash of its text (make_sums.py's write_splits).
2,000 training rows, 64 held out.
Run: python configs/data/make_chains.py
"""

from __future__ import annotations

import random
from pathlib import Path

from make_sums import write_splits

TERMS = 3
FORM = ("Reply in this form:\n<reasoning>\n(your working, one operation per line)\n</reasoning>\n"
        "<answer>\n(the final number only)\n</answer>")


def draw(rng: random.Random) -> tuple[str]:
    numbers = [rng.randint(10, 99) for _ in range(TERMS)]
    # no subtraction: untrained, the model gets most differences below zero wrong (74 - 91 = 83), at any length
    return (" + ".join(map(str, numbers)),)


def key(chain: str) -> str:
    return chain


def row(chain: str) -> dict:
    total = sum(int(term) for term in chain.replace("- ", "-").replace("+ ", "").split())
    return {"prompt": f"Compute {chain}.\n{FORM}", "answer": str(total)}


def main(out_dir: Path = Path(__file__).parent) -> None:
    write_splits(out_dir, "chains", random.Random("qwen-think-chains"), draw, key, row, heldout_rows=64)


if __name__ == "__main__":
    main()
