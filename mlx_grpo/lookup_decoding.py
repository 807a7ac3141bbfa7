"""Lookup decoding: a row's own text guesses its next tokens, and one forward pass checks the guess, exactly.

At the tail of a rollout one or two replies are often still going after the rest have ended (a long working,
or a loop running on to the token limit), and each of their decode steps reads all the weights for one token.
Replies copy their own text: the numbers of the prompt, a line they wrote before, a loop. So the tokens that
followed the latest earlier occurrence of a row's last few tokens are a guess that costs nothing to make
(prompt lookup). The model scores the current token and the guess in one forward pass of k + 1 positions,
which at a decode's few rows costs little more than one position (the weights are read once either way).

Each guessed token is kept with its probability under the sampling distribution, in order, and the first
one refused is replaced by a draw from that distribution with the refused token taken out: speculative
sampling with a one-point draft, so every reply is distributed exactly as one-token-at-a-time decoding's.
Greedy decoding keeps a guessed token when it is the argmax. The rows of a batch keep the same number of
positions (the fewest any row had accepted): a row that accepted more carries its next accepted token over to
the next step as a forced draw, which keeps its reply exact too (when a reply stops using its guess depends
only on what came before).
"""

from __future__ import annotations

import numpy as np

# Decoding switches to lookup once this few rows are left: each checked position costs a row's share of the
# matmuls, which at more rows stops being small next to reading the weights (real Qwen2.5-Coder-0.5B in
# float32 on a 2-core CPU: one row's step 165 ms for 1 position, 239 ms for 8; benchmarks/lookup_decoding.py).
LOOKUP_ROWS = 2
# Most tokens guessed per step. Always the most: on the thinking recipe's held-out sums, a looping reply took 84 s
# at 8 and 98 s when a step after a refusal guessed only 2(k + 1) (k: tokens the step before kept).
LOOKUP_TOKENS = 8
NGRAMS = (3, 2)  # the row's last n tokens looked up, longest first


def guess(history: list[int], most: int) -> list[int]:
    """Up to `most` tokens that followed the latest earlier occurrence of `history`'s last 3 (else 2) tokens,
    copied on past the end when that occurrence is near it (so a loop shorter than `most` is guessed whole
    and repeated). Empty when no such occurrence exists."""
    tokens = np.asarray(history)
    for n in NGRAMS:
        if len(tokens) <= n:
            continue
        tail = tokens[-n:]
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)
        matches = np.flatnonzero((windows == tail).all(axis=1))
        if len(matches):
            source = int(matches[-1]) + n
            copied = list(history)
            for _ in range(most):
                copied.append(copied[source])
                source += 1
            return copied[len(history):]
    return []


class LookupTexts:
    """Each lookup row's tokens so far (its prompt, then its reply), kept on the host: gathered from every
    decoded span when the batch of rows changes, then extended by each step's tokens."""

    def __init__(self, prompts: list[list[int]], rows: np.ndarray, spans: list):
        self.prompts, self.rows, self.spans = prompts, rows, spans  # rows: each batch row's prompt
        self.tokens: dict[int, list[int]] = {}
        self.span = None  # the span of rows (rollout._Span) the texts are of
        self.counted = 0  # tokens of self.span already in self.tokens

    def guesses(self, span, most: int) -> np.ndarray | None:
        """[rows, K] guessed tokens for the span's rows (K the shortest guess, at most `most`), or None when a
        row has none or `most` < 1."""
        if span is not self.span:
            self._gather(span)
        elif self.counted < len(span.ids):
            for row, tokens in zip(span.rows.tolist(), _columns(span.ids[self.counted:]).tolist()):
                self.tokens[row].extend(tokens)
            self.counted = len(span.ids)
        if most < 1:
            return None
        found = [guess(self.tokens[row], most) for row in span.rows.tolist()]
        k = min(len(g) for g in found)
        return np.array([g[:k] for g in found]) if k else None

    def _gather(self, span) -> None:
        self.tokens = {row: list(self.prompts[self.rows[row]]) for row in span.rows.tolist()}
        for decoded in self.spans:
            if decoded.ids:
                position = {row: i for i, row in enumerate(decoded.rows.tolist())}
                ids = _columns(decoded.ids)
                for row in span.rows.tolist():
                    if row in position:
                        self.tokens[row].extend(ids[position[row]].tolist())
        self.span, self.counted = span, len(span.ids)


def _columns(steps: list) -> np.ndarray:
    """[rows, steps] from one [rows] array of sampled ids per step (MLX arrays read through numpy)."""
    return np.stack([np.asarray(ids) for ids in steps], axis=1)
