"""Drawing token ids from a model's logits: temperature, top-k/top-p/min-p, one draw per row with its log-prob,
and the check of a lookup step's guessed tokens (lookup_decoding.py) that keeps decoding exact."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from .models.cpu_kernels import shifted_exp


@dataclass(frozen=True)
class SamplingSettings:
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0

    @property
    def filters(self) -> bool:
        return self.top_p < 1.0 or self.top_k > 0 or self.min_p > 0.0


def filter_logits(logits: mx.array, settings: SamplingSettings) -> mx.array:
    """Apply top-k, top-p and min-p by setting excluded logits to -inf.

    Not mlx_lm.sample_utils' apply_top_k/top_p/min_p: its top-p sorts the whole vocabulary every decode step
    (152k logits per row cost more than the step's matmul), where top_p_keep sorts 1,024 candidates. The
    masks are the same token for token (tests/core/test_rollout.py checks each against mlx-lm's), so the sampled
    ids and the log-probs taken under them are what mlx-lm's sampler would give."""
    neg_inf = mx.array(-float("inf"), dtype=logits.dtype)
    if settings.top_k > 0 and settings.top_k < logits.shape[-1]:
        # a partition finds the k-th largest without sorting the whole vocabulary
        kth = mx.partition(logits, -settings.top_k, axis=-1)[..., -settings.top_k][..., None]
        logits = mx.where(logits < kth, neg_inf, logits)
    if settings.min_p > 0.0:
        probs = mx.softmax(logits, axis=-1)
        floor = settings.min_p * probs.max(axis=-1, keepdims=True)
        logits = mx.where(probs < floor, neg_inf, logits)
    if settings.top_p < 1.0:
        logits = mx.where(top_p_keep(logits, settings.top_p), logits, neg_inf)
    return logits


TOP_P_CANDIDATES = 1024  # sorted instead of the whole vocabulary, when they hold the top_p mass
SAMPLING_BLOCK_LOGITS = 1 << 20  # logits drawn from at a time: past this, shifted_exp's loops leave the caches


def top_p_keep(logits: mx.array, top_p: float) -> mx.array:
    """Which tokens top-p keeps: those whose higher-probability predecessors hold less than `top_p` of
    the mass (the top token always stays). Sorting 152k logits per row costs more than the decode step's
    matmul, so only the `TOP_P_CANDIDATES` largest are sorted when they hold the `top_p` mass (the usual
    case); the rest are then excluded anyway. Flat rows fall back to sorting everything."""
    probs = mx.softmax(logits, axis=-1)
    vocab = logits.shape[-1]
    if vocab > TOP_P_CANDIDATES:
        candidates = mx.argpartition(-logits, TOP_P_CANDIDATES - 1, axis=-1)[..., :TOP_P_CANDIDATES]
        order = mx.take_along_axis(candidates, mx.argsort(-mx.take_along_axis(logits, candidates, axis=-1),
                                                          axis=-1), axis=-1)
        sorted_probs = mx.take_along_axis(probs, order, axis=-1)
        if bool((sorted_probs.sum(axis=-1) >= top_p).all()):
            keep_sorted = mx.cumsum(sorted_probs, axis=-1) - sorted_probs < top_p
            return mx.put_along_axis(mx.zeros(logits.shape, dtype=mx.bool_), order, keep_sorted, axis=-1)
    order = mx.argsort(-logits, axis=-1)
    sorted_probs = mx.take_along_axis(probs, order, axis=-1)
    keep_sorted = mx.cumsum(sorted_probs, axis=-1) - sorted_probs < top_p
    return mx.put_along_axis(mx.zeros_like(keep_sorted), order, keep_sorted, axis=-1)


def sampling_logits(logits: mx.array, settings: SamplingSettings) -> mx.array:
    """The logits of the distribution a sampled id is drawn from: temperature, then the filters."""
    logits = logits.astype(mx.float32)
    if settings.temperature not in (0, 1.0):
        logits = logits / settings.temperature
    return filter_logits(logits, settings) if settings.filters and settings.temperature else logits


def sample_tokens(logits: mx.array, settings: SamplingSettings, key: mx.array,
                  rows: tuple[mx.array, int] | None = None,
                  carried: tuple[mx.array, mx.array] | None = None) -> tuple[mx.array, mx.array]:
    """Sample one id per row; return (ids, log-prob of each id under the sampling distribution). `rows`:
    (which rows of a batch of n these are, n), so each row gets the draw it would get in the whole batch.
    `carried`: after a lookup step (lookup_decoding.py), per row a guessed token it accepted and must emit
    now, and a guessed token it refused and must not draw (-1: none); greedy needs neither (an accepted
    guess is the argmax, a refused one is not)."""
    logits = sampling_logits(logits, settings)
    if settings.temperature == 0:
        ids = mx.argmax(logits, axis=-1)
        return ids, mx.zeros(ids.shape, dtype=mx.float32)
    if carried is None:
        return sample_with_logprobs(logits, key, rows)
    accepted, refused = carried
    vocab = mx.arange(logits.shape[-1])
    drawn, _ = sample_with_logprobs(mx.where(vocab == refused[:, None], -mx.inf, logits), key, rows)
    ids = mx.where(accepted >= 0, accepted, drawn)
    logprobs = mx.take_along_axis(logits, ids[:, None], axis=-1)[:, 0] - mx.logsumexp(logits, axis=-1)
    return ids, logprobs


def first_crossing(cumulative: mx.array, threshold: mx.array) -> mx.array:
    """Per row, the first id whose cumulative sum passes `threshold` ([N, 1]); the first id reaching the
    total when rounding puts the threshold at it (never an id without mass). Found as a first crossing,
    not by counting sums at or below the threshold: a GPU's parallel scan rounds neighbours along
    different paths, so its cumulative sum can step down by an ulp, and a count then lands elsewhere."""
    crossed = cumulative > threshold
    reaching_total = mx.argmax(cumulative >= cumulative[:, -1:], axis=-1)
    return mx.where(crossed[:, -1], mx.argmax(crossed, axis=-1), reaching_total).astype(mx.int32)


def sample_with_logprobs(logits: mx.array, key: mx.array,
                         rows: tuple[mx.array, int] | None = None) -> tuple[mx.array, mx.array]:
    """One id per row drawn from softmax(logits) by inverting its cumulative sum, and the id's log-prob.

    The log-prob needs exp over the vocabulary anyway; drawing from the same exponentials spares the
    Gumbel noise of `mx.random.categorical` (a uniform and two logs per logit): at a 152k vocabulary
    that was ~10 ms of a ~100 ms decode step on the CPU (benchmarks/sampling_cost.py). The exponentials
    are the streamed head's (`shifted_exp`), over blocks of rows of about a million logits, the size it
    is fast at: 8 rows of 152k logits in 6 ms against 19 with `mx.exp` (docs/PERFORMANCE.md)."""
    if rows is None:
        uniform = mx.random.uniform(shape=(logits.shape[0], 1), key=key)
    else:
        uniform = mx.random.uniform(shape=(rows[1], 1), key=key)[rows[0]]
    step = max(1, SAMPLING_BLOCK_LOGITS // logits.shape[-1])
    if logits.shape[0] <= step:
        return _draw(logits, uniform)
    drawn = [_draw(logits[start:start + step], uniform[start:start + step])
             for start in range(0, logits.shape[0], step)]
    return mx.concatenate([ids for ids, _ in drawn]), mx.concatenate([logprobs for _, logprobs in drawn])


def _draw(logits: mx.array, uniform: mx.array) -> tuple[mx.array, mx.array]:
    """`sample_with_logprobs` on rows whose uniform draws ([N, 1]) are given."""
    top = logits.max(axis=-1, keepdims=True)
    cumulative = mx.cumsum(shifted_exp(logits, top), axis=-1)
    total = cumulative[:, -1:]
    ids = first_crossing(cumulative, uniform * total)
    logprobs = mx.take_along_axis(logits, ids[:, None], axis=-1) - top - mx.log(total)
    return ids, logprobs[:, 0]


def check_guesses(logits: mx.array, guesses: mx.array, greedy: bool, key: mx.array,
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
