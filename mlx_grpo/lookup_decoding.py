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

import mlx.core as mx
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


def check(logits: mx.array, guesses: mx.array, greedy: bool, key: mx.array,
          rows: tuple[mx.array, int] | None = None) -> tuple[np.ndarray, mx.array]:
    """How many of each row's guessed tokens are kept, in order, and each guessed token's log-prob.

    `logits`: [R, K + 1, V], the sampling distribution's (temperature and filters applied) at the current token
    and after each guessed one; `guesses`: [R, K]. Sampled: guess j is kept with its probability under
    position j's distribution; greedy: when it is that position's argmax (log-probs are then 0, as greedy
    decoding records them). `rows`: (which rows of a batch of n these are, n), so each row gets the draw it
    would get in the whole batch."""
    k = guesses.shape[1]
    if greedy:
        kept = mx.argmax(logits[:, :k], axis=-1) == guesses
        logprobs = mx.zeros(guesses.shape, dtype=mx.float32)
    else:
        scored = logits[:, :k]
        logprobs = (mx.take_along_axis(scored, guesses[..., None], axis=-1)[..., 0]
                    - mx.logsumexp(scored, axis=-1))
        if rows is None:
            uniform = mx.random.uniform(shape=guesses.shape, key=key)
        else:
            uniform = mx.random.uniform(shape=(rows[1], k), key=key)[rows[0]]
        kept = uniform < mx.exp(logprobs)
    leading = mx.cumprod(kept.astype(mx.int32), axis=1).sum(axis=1)
    return np.array(leading), logprobs
