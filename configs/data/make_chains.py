"""Writes chains_train.jsonl and chains_heldout.jsonl, the data of configs/qwen_think.yaml.

Sums of four 2-digit numbers ("Compute 87 + 11 + 43 + 25."), then the form drawn out: a reasoning block for the
working, one operation per line, then an answer block with the number alone. Four terms because there working
pays: untrained and greedy, on 32 such sums, Qwen2.5-Coder-0.5B-Instruct is right on 10 of the 20 it works
pair by pair and on 1 of the 12 it guesses in one line ("The sum of 60, 88, 26, and 32 is 180."). With three
terms a guess was right often enough (81% greedy overall) that a run could learn to guess instead of to work.
Asked for the form in one sentence instead of drawn out, the model opened the reasoning block and almost never
closed it. Each chain belongs to one split by a fixed hash of its text (make_sums.py's write_splits).
2,000 training rows, 64 held out.
Run: python configs/data/make_chains.py
"""

from __future__ import annotations

import random
from pathlib import Path

from make_sums import write_splits

TERMS = 4
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
