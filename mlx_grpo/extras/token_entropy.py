"""Per-token entropy and varentropy of the policy, taken from the logits the update already computes.

Entropy H = -sum_v p_v log p_v; varentropy = Var_{v~p}[-log p_v] = sum_v p_v (-log p_v - H)^2,
the spread of the surprisal: low entropy with high varentropy means "confident, but with a
few plausible alternatives far from the top one". Both in nats, of softmax(logits / T),
the distribution tokens were sampled from (before top-k/top-p/min-p filtering).

The loss function returns these per-token arrays inside its stats dict (so its output keeps
the (stats, logp) shape other callers unpack); `take_token_stats` removes them again.
"""

from __future__ import annotations

import mlx.core as mx

TOKEN_KEYS = ("token_entropy", "token_varentropy")


def entropy_and_varentropy(logits: mx.array) -> tuple[mx.array, mx.array]:
    """(entropy, varentropy) over the last axis, float32, shape logits.shape[:-1]; -inf logits allowed."""
    logits = logits.astype(mx.float32)
    # shifting by the row maximum keeps large logits from losing digits in the subtraction below
    logits = logits - logits.max(axis=-1, keepdims=True)
    logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    p = mx.exp(logp)
    # a banned token (p = 0, logp = -inf) contributes 0 to both sums; select so -inf never meets a 0
    surprisal = mx.where(p > 0, -logp, 0.0)
    entropy = (p * surprisal).sum(axis=-1)
    varentropy = (p * mx.square(surprisal - entropy[..., None])).sum(axis=-1)
    return entropy, varentropy


def token_stats(logits: mx.array) -> dict[str, mx.array]:
    """The per-token arrays the loss function hands back, stop-gradient'ed."""
    entropy, varentropy = entropy_and_varentropy(mx.stop_gradient(logits))
    return dict(zip(TOKEN_KEYS, (entropy, varentropy)))


def take_token_stats(stats: dict) -> dict[str, mx.array]:
    """Remove the per-token arrays from a loss stats dict (leaving its scalars) and return them."""
    return {key: stats.pop(key) for key in TOKEN_KEYS if key in stats}
