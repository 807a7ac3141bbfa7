"""The default task: add two whole numbers of one to three digits.

Prompts are the two operands zero-padded to three digits, `"047+302="`, so every
prompt has the same length (8 characters) and a batch needs no padding. The
answer is the plain decimal sum, `"349"`. The target completion writes the column
carries in the reasoning block, units first, then the sum in the answer block:
`<reasoning>000</reasoning><answer>349</answer>` for 047+302, and
`<reasoning>110</reasoning><answer>125</answer>` for 058+067 (7+8 carries, 5+6+1
carries, 0+0+1 does not). The answer is written most significant digit first, and
each of its digits is a column sum plus the carry into that column, so with the
carries written out every answer digit is a function of three things the model can
look up instead of a chain it must work out in one step. Measured on the default
run: the shipped model built this way gained 26.7 points of held-out accuracy in 200
steps where the same recipe without carries (an empty reasoning block) gained 24.3,
and the carries give the reasoning-length metrics, the adaptive window and S-GRPO's
exits a real block to work on.

Splits. Each unordered pair {a, b} belongs to exactly one split, decided by a
fixed integer hash of the pair (about 10% held out). Because the hash ignores
order, "047+302=" and "302+047=" are always in the same split, so a held-out
sum is never seen in training in either order. The assignment does not depend
on the seed; the seed only chooses which rows are drawn.

Sampling weights. Each operand independently gets 1, 2 or 3 digits with equal
probability (one digit means 0-9, two 10-99, three 100-999), then a value
uniformly within that width. Difficulty is the digit count of the larger
operand, so rows are about 1/9 difficulty 1, 3/9 difficulty 2 and 5/9
difficulty 3. Uniform sampling over all pairs would make 99% of rows 3-digit;
this mix keeps some easy problems, which gives GRPO groups with a correct
sample early on. Rows of both splits are drawn independently (with
replacement), so an accuracy measured on n held-out rows estimates the same
quantity whatever n is. Duplicates occur, mostly among one-digit sums: of the
100 one-digit pairs, 95 are training pairs and 5 held out, so held-out rows hold
about 6% difficulty 1 (rather than 11%), 35% difficulty 2 and 59% difficulty 3.
"""

from __future__ import annotations

import random

from ..common.errors import UserError
from .answer_format import CLOSE_ANSWER, CLOSE_REASONING, OPEN_ANSWER, OPEN_REASONING

SPLITS = ("train", "heldout")
WIDTH = 3  # operands are zero-padded to this many digits
HELDOUT_PERCENT = 10

_DIGIT_RANGES = {1: (0, 9), 2: (10, 99), 3: (100, 999)}
_MASK64 = (1 << 64) - 1


def split_of(a: int, b: int) -> str:
    """The split the unordered pair {a, b} belongs to (same for a+b and b+a)."""
    lo, hi = sorted((a, b))
    # splitmix64 finaliser: a fixed, well-mixed hash that does not depend on
    # PYTHONHASHSEED or the Python version.
    x = (lo * 1000 + hi + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    x ^= x >> 31
    return "heldout" if x % 100 < HELDOUT_PERCENT else "train"


def make_row(a: int, b: int) -> dict:
    """One task row for a + b."""
    if not (0 <= a <= 999 and 0 <= b <= 999):
        raise ValueError(f"operands must be in 0..999, got {a} and {b}")
    return {
        "prompt": f"{a:0{WIDTH}d}+{b:0{WIDTH}d}=",
        "answer": str(a + b),
        "difficulty": len(str(max(a, b))),
    }


def _draw_operand(rng: random.Random) -> int:
    lo, hi = _DIGIT_RANGES[rng.randint(1, 3)]
    return rng.randint(lo, hi)


def make_split(split: str, n: int, seed: int) -> list[dict]:
    """`n` rows of `split` ("train" or "heldout"), the same rows for the same seed."""
    if split not in SPLITS:
        raise UserError(f"arithmetic task: unknown split {split!r} (expected one of {', '.join(SPLITS)})")
    if n < 0:
        raise UserError(f"arithmetic task: number of rows must be >= 0, got {n}")
    # A string seed is hashed with SHA-512 by `random`, so it is stable across
    # processes; including the split keeps the two streams independent.
    rng = random.Random(f"arithmetic:{split}:{seed}")
    rows: list[dict] = []
    while len(rows) < n:
        a, b = _draw_operand(rng), _draw_operand(rng)
        # Rejection keeps each split's rows distributed like the weights above,
        # restricted to that split's pairs.
        if split_of(a, b) == split:
            rows.append(make_row(a, b))
    return rows


def carries(a: int, b: int) -> str:
    """The carry out of each column of a + b, units first: carries(58, 67) == "110"."""
    out, carry = [], 0
    for column in range(WIDTH):
        carry = int((a // 10**column) % 10 + (b // 10**column) % 10 + carry >= 10)
        out.append(str(carry))
    return "".join(out)


def format_completion(row: dict) -> str:
    """The target completion for a row, without the end-of-sequence token."""
    a, b = (int(x) for x in row["prompt"].rstrip("=").split("+"))
    return f"{OPEN_REASONING}{carries(a, b)}{CLOSE_REASONING}{OPEN_ANSWER}{row['answer']}{CLOSE_ANSWER}"

