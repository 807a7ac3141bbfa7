"""GRPO math as pure functions over MLX arrays.

Nothing here knows about models, tokenizers or configs: the trainer computes
per-token log-probabilities with a model and hands arrays in; these functions
turn rewards into advantages and log-probabilities into a loss plus the
policy statistics the run directory records under ``policy/...``.

Conventions used throughout:

* ``N`` sequences (completions) per batch, ``T`` completion positions per
  sequence (padded), ``V`` vocabulary size.
* A batch is ordered prompt-major: the ``G`` completions of one prompt are
  consecutive, so ``N = B * G``.
* ``mask`` is ``[N, T]`` (bool or numeric 0/1); 1 marks a completion token
  that takes part in the loss. Prompt and padding positions are 0 and have
  no influence on any result, even when their log-probabilities hold
  garbage (inf/NaN): masked inputs are replaced by 0 before any arithmetic,
  so neither values nor gradients can pick up NaN from them.
* Everything is computed in float32, whatever the input dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from .config.train_config import IMPORTANCE_LEVELS, LOSS_TYPES, SCALE_MODES


def group_advantages(
    rewards: mx.array, group_size: int, scale: str = "group", eps: float = 1e-4
) -> mx.array:
    """Group-relative advantages.

    Args:
        rewards: ``[B*G]`` float, finite, prompt-major (``G`` consecutive
            completions per prompt).
        group_size: ``G``, completions per prompt; must divide ``B*G``.
        scale: ``"group"`` divides by each group's std, ``"batch"`` by the std
            of all rewards in the batch, ``"none"`` does not divide.
        eps: added to the std, so a near-constant group (or batch) is not
            divided by ~0.

    Returns:
        ``[B*G]`` float32: ``(reward - group mean) / (std + eps)``.

    The std is the population std (divide by ``G``, not ``G - 1``). TRL uses
    the unbiased sample std; we do not, because with the population std a
    non-constant group's advantages always have unit variance whatever ``G``
    is, so changing num_generations does not silently rescale the update
    (the sample std shrinks advantages by sqrt((G-1)/G): 0.71 at G=2).
    """
    if scale not in SCALE_MODES:
        raise ValueError(f"scale must be one of {SCALE_MODES}, got {scale!r}")
    rewards = rewards.astype(mx.float32)
    n = rewards.size
    if rewards.ndim != 1 or group_size < 1 or n % group_size != 0:
        raise ValueError(
            f"rewards must be 1-D with a length divisible by group_size={group_size}, "
            f"got shape {tuple(rewards.shape)}"
        )
    groups = rewards.reshape(n // group_size, group_size)
    centred = groups - groups.mean(axis=1, keepdims=True)
    # A group whose rewards are all equal carries no signal: its advantages are
    # exactly 0. The float32 mean of equal values can miss them by an ulp, and
    # that ulp divided by eps alone would be a sizeable push (-0.005 for 2.3 x 8).
    constant = groups.max(axis=1, keepdims=True) == groups.min(axis=1, keepdims=True)
    centred = mx.where(constant, 0.0, centred)
    if scale == "group":
        centred = centred / (groups.std(axis=1, keepdims=True) + eps)
    elif scale == "batch":
        centred = centred / (rewards.std() + eps)
    return centred.reshape(n)


def token_logprobs(logits: mx.array, targets: mx.array) -> mx.array:
    """Log-probability of each target token under ``softmax(logits)``.

    Args:
        logits: ``[..., V]`` float (any float dtype; upcast to float32). If the
            rollout sampled at a temperature, divide the logits by it before
            calling, so these log-probs match the sampling distribution.
        targets: ``[...]`` integer token ids (same leading shape as logits).

    Returns:
        ``[...]`` float32, ``logits[target] - logsumexp(logits)``, computed
        on logits shifted by their row maximum: large logits neither
        overflow nor lose digits (at |logit| ~ 1000 float32 keeps only
        ~6e-5 absolute precision, which the shift avoids).
    """
    logits = logits.astype(mx.float32)
    # The shift cancels in the result, so it needs no gradient.
    shifted = logits - mx.stop_gradient(logits.max(axis=-1, keepdims=True))
    picked = mx.take_along_axis(shifted, targets[..., None].astype(mx.int32), axis=-1)
    return picked.squeeze(-1) - mx.logsumexp(shifted, axis=-1)


def token_entropy(logits: mx.array) -> mx.array:
    """Shannon entropy (nats) of ``softmax(logits)`` at every position.

    Args:
        logits: ``[..., V]`` float (upcast to float32); ``-inf`` entries
            (banned tokens) are allowed and contribute 0.

    Returns:
        ``[...]`` float32, ``-sum_v p_v log p_v``.
    """
    logits = logits.astype(mx.float32)
    logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    p = mx.exp(logp)
    # 0 * log 0 is 0 in the limit; select before multiplying so -inf never
    # meets a 0 (which would give NaN in the value or the gradient).
    safe_logp = mx.where(p > 0, logp, 0.0)
    return -(p * safe_logp).sum(axis=-1)


def kl_k3(logp_policy: mx.array, logp_ref: mx.array) -> mx.array:
    """Per-token k3 estimator of KL(policy || ref) for tokens sampled from the policy.

    Args:
        logp_policy: ``[...]`` float, log-probs of the sampled tokens under the policy.
        logp_ref: ``[...]`` float, log-probs of the same tokens under the reference.

    Returns:
        ``[...]`` float32, ``exp(d) - d - 1`` with ``d = logp_ref - logp_policy``.
        Always >= 0, exactly 0 with zero gradient where the two agree. No
        clamping: a huge value means the policy really left the reference.
    """
    d = logp_ref.astype(mx.float32) - logp_policy.astype(mx.float32)
    # expm1: exp(d) - 1 rounds below d for tiny d, which read as a negative KL at a learning rate near 0
    return mx.expm1(d) - d


def masked_mean(x: mx.array, mask: mx.array) -> mx.array:
    """Mean of ``x`` over positions where ``mask`` is set; 0 when none is.

    Args:
        x: any shape, float. Masked-out entries may be non-finite.
        mask: same shape as ``x`` (bool or 0/1).

    Returns:
        float32 scalar.
    """
    m = mask.astype(mx.bool_)
    total = mx.where(m, x.astype(mx.float32), 0.0).sum()
    return total / mx.maximum(m.sum(), 1).astype(mx.float32)


def _masked_quantile(x: mx.array, mask: mx.array, q: float) -> mx.array:
    """Quantile of the masked entries of ``x`` (numpy's linear interpolation); 0 when none."""
    m = mask.astype(mx.bool_).reshape(-1)
    # Masked-out entries sort to the end, so the first `count` entries are the data.
    ordered = mx.sort(mx.where(m, x.reshape(-1), mx.inf))
    count = m.sum()
    pos = q * (mx.maximum(count, 1) - 1).astype(mx.float32)
    lo = mx.floor(pos).astype(mx.int32)
    hi = mx.minimum(lo + 1, mx.maximum(count, 1) - 1)
    frac = pos - lo.astype(mx.float32)
    value = ordered[lo] * (1.0 - frac) + ordered[hi] * frac
    return mx.where(count > 0, value, 0.0)


@dataclass(frozen=True)
class LossTotals:
    """The size of everything one optimiser step's gradient covers: all micro-batches of the update
    and, under data parallelism, all ranks. The loss divides by these, so each part of the batch
    computes exactly its share of the whole batch's loss and the parts' gradients simply add up."""

    num_sequences: int
    num_tokens: int  # active completion tokens

    @classmethod
    def of(cls, mask: mx.array) -> "LossTotals":
        return cls(int(mask.shape[0]), int(mask.astype(mx.bool_).sum().item()))


@dataclass
class _TokenTerms:
    active: mx.array  # [N, T] bool
    seq_len: mx.array  # [N] active tokens per sequence
    advantages: mx.array  # [N, 1]
    pg: mx.array  # [N, T] clipped-surrogate loss per token, 0 where masked
    kl: mx.array  # [N, T] k3 per token, 0 where masked or without a reference
    ratio: mx.array  # [N, T] the importance ratio used (the sequence ratio in GSPO mode)
    log_ratio: mx.array  # [N, T] its log
    token_log_ratio: mx.array  # [N, T] logp - old_logp, token by token


def _check_variant(loss_type: str, importance_level: str, beta: float, ref_logp, max_completion_length) -> None:
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    if importance_level not in IMPORTANCE_LEVELS:
        raise ValueError(
            f"importance_level must be one of {IMPORTANCE_LEVELS}, got {importance_level!r}"
        )
    if beta > 0 and ref_logp is None:
        raise ValueError("beta > 0 needs ref_logp")
    if loss_type == "dr_grpo" and not max_completion_length:
        raise ValueError("loss_type 'dr_grpo' needs max_completion_length")


def _token_terms(logp, old_logp, ref_logp, advantages, mask, epsilon, epsilon_high, importance_level,
                 delta=None) -> _TokenTerms:
    active = mask.astype(mx.bool_)
    # Zero every masked input first: nothing downstream (exp, products,
    # their gradients) can then turn padding garbage into NaN.
    logp = mx.where(active, logp.astype(mx.float32), 0.0)
    if old_logp is None:
        old_logp = logp
    old_logp = mx.stop_gradient(mx.where(active, old_logp.astype(mx.float32), 0.0))
    adv = advantages.astype(mx.float32)[:, None]
    seq_len = active.astype(mx.float32).sum(axis=1)

    token_log_ratio = logp - old_logp
    if importance_level == "token":
        log_ratio = token_log_ratio
        ratio = mx.exp(log_ratio)
    else:
        seq_log_ratio = token_log_ratio.sum(axis=1) / mx.maximum(seq_len, 1.0)
        log_ratio = mx.broadcast_to(seq_log_ratio[:, None], logp.shape)
        ratio = mx.stop_gradient(mx.exp(log_ratio)) * mx.exp(logp - mx.stop_gradient(logp))

    low, high = 1.0 - epsilon, 1.0 + epsilon_high
    # two-sided clipping: a negative advantage cannot push a token whose ratio is above delta any harder
    capped = ratio if delta is None else mx.minimum(ratio, delta)
    surrogate = mx.minimum(capped * adv, mx.clip(ratio, low, high) * adv)
    pg = mx.where(active, -surrogate, 0.0)
    if ref_logp is not None:
        ref = mx.where(active, ref_logp.astype(mx.float32), 0.0)
        kl = mx.where(active, kl_k3(logp, ref), 0.0)
    else:
        kl = mx.zeros_like(logp)
    return _TokenTerms(active, seq_len, adv, pg, kl, ratio, log_ratio, token_log_ratio)


def _aggregate(per_token: mx.array, seq_len: mx.array, loss_type: str, totals: LossTotals,
               max_completion_length: int | None) -> mx.array:
    """This part of the batch's share of the whole batch's loss (see `grpo_loss`'s loss_type)."""
    if loss_type == "grpo":
        return (per_token.sum(axis=1) / mx.maximum(seq_len, 1.0)).sum() / max(totals.num_sequences, 1)
    if loss_type == "dr_grpo":
        return per_token.sum() / float(max(totals.num_sequences, 1) * max_completion_length)
    return per_token.sum() / float(max(totals.num_tokens, 1))  # bnpo, dapo


@dataclass(frozen=True)
class LossOptions:
    """How the loss is formed from the per-token terms (`grpo_loss`):

    beta: weight of the per-token k3 KL term.
    epsilon: lower clip, ratio is clipped below at ``1 - epsilon``.
    epsilon_high: upper clip, ratio is clipped above at
        ``1 + epsilon_high``; ``None`` means ``epsilon`` (symmetric).
    loss_type: how per-token losses ``l[i, t]`` become one scalar
        (``|y_i|`` = active tokens of sequence i; ``N`` and ``M`` = the
        sequences and active tokens of the whole update, ``totals``):

        * ``"grpo"``: ``sum_i( sum_t l[i,t] / |y_i| ) / N``, each sequence
          weighs the same regardless of length. An all-masked sequence
          adds 0 but still counts in ``N``.
        * ``"bnpo"`` and ``"dapo"``: ``sum l / M``, each token of the whole
          update weighs the same. (TRL's bnpo divides by the tokens of each
          accumulation micro-batch; here splitting a batch never changes
          its gradient, so the two names mean the same aggregation.)
        * ``"dr_grpo"``: ``sum l / (N * max_completion_length)``, a
          constant denominator, so no length bias at all.
    importance_level: ``"token"`` uses ``r[i,t] = exp(logp - old_logp)``.
        ``"sequence"`` (GSPO) uses the geometric-mean sequence ratio
        ``s_i = exp(mean over active t of (logp - old_logp))`` at every
        token, written as ``sg(s_i) * exp(logp - sg(logp))``: the value is
        ``s_i`` everywhere and each token's gradient is
        ``s_i * dlogp[i,t]``, the same gradient as differentiating
        ``s_i`` itself once per token (GSPO-token with a per-sequence
        advantage, equal to GSPO for every loss_type).
    max_completion_length: the configured generation budget; required
        for ``"dr_grpo"`` (the padded width ``T`` varies between
        batches, the budget does not).
    delta: two-sided clipping (TRL's ``delta``): the unclipped term uses
        ``min(r, delta)``, so where ``A < 0`` a ratio above ``delta`` gives
        a constant loss and no gradient (a large ratio times a negative
        advantage would otherwise give an unbounded loss). ``None``: off.
    """

    beta: float = 0.0
    epsilon: float = 0.2
    epsilon_high: float | None = None
    loss_type: str = "grpo"
    importance_level: str = "token"
    max_completion_length: int | None = None
    delta: float | None = None


def grpo_loss(logp: mx.array, old_logp: mx.array | None, ref_logp: mx.array | None, advantages: mx.array,
              mask: mx.array, options: LossOptions = LossOptions(), totals: LossTotals | None = None) -> mx.array:
    """Clipped GRPO surrogate (+ optional k3 KL penalty), aggregated by ``loss_type``.

    Args:
        logp: ``[N, T]`` float, log-probs of the sampled completion tokens under
            the policy being trained (the only input gradients flow into).
        old_logp: ``[N, T]`` float, log-probs under the policy that sampled the
            rollout (stop-gradient'ed here). ``None`` means "same as logp"
            (num_iterations == 1): the ratio is then exactly 1 and the
            gradient is the plain policy gradient.
        ref_logp: ``[N, T]`` float, log-probs under the reference policy, or
            ``None``. Required when ``beta > 0``.
        advantages: ``[N]`` float, one advantage per sequence.
        mask: ``[N, T]`` bool or 0/1, completion tokens that count.
        options: a `LossOptions`: beta, the clip bounds, loss_type, importance_level, delta (its fields).
        totals: the whole update's sizes when these arrays are only part of
            it (a micro-batch, one rank's share); ``None`` means these arrays
            are the whole update. Every aggregation is then a plain sum over
            sequences divided by a constant, so the gradients of the parts
            add up to the gradient of the whole, for every loss_type.

    Per-token loss:
        ``-min(min(r, delta) * A, clip(r, 1 - epsilon, 1 + epsilon_high) * A)
        + beta * k3(logp, ref_logp)``.

    Returns:
        ``loss``, a float32 scalar to differentiate: this part's share of
        the whole update's loss. `policy_stats` describes the same arrays.
    """
    o = options
    _check_variant(o.loss_type, o.importance_level, o.beta, ref_logp, o.max_completion_length)
    epsilon_high = o.epsilon if o.epsilon_high is None else o.epsilon_high
    terms = _token_terms(logp, old_logp, ref_logp, advantages, mask, o.epsilon, epsilon_high, o.importance_level,
                         o.delta)
    per_token = terms.pg + o.beta * terms.kl if o.beta > 0 else terms.pg
    return _aggregate(per_token, terms.seq_len, o.loss_type, totals or LossTotals.of(mask), o.max_completion_length)


def policy_stats(logp: mx.array, old_logp: mx.array | None, ref_logp: mx.array | None, advantages: mx.array,
                 mask: mx.array, options: LossOptions = LossOptions(),
                 totals: LossTotals | None = None) -> dict[str, mx.array]:
    """The update's statistics for the same arguments as `grpo_loss`, computed from log-probs alone
    (no gradient, no logits), so an update split into micro-batches reports them once for the whole
    batch. Names (``policy/<name>`` in the run directory) map to float32 scalars over active tokens
    only, 0 when there is none:

    * ``pg_loss``: the surrogate part alone, aggregated like the loss (this
      part's share when ``totals`` describes a larger update).
    * ``kl``: token mean of k3 (0 without ref_logp); ``kl_penalty``:
      ``beta * kl``. For bnpo/dapo over the whole update ``loss == pg_loss +
      kl_penalty``; grpo and dr_grpo weight the KL tokens like the loss.
    * ``clip_frac_low``: ratio < 1 - epsilon where A < 0;
      ``clip_frac_high``: ratio > 1 + epsilon_high where A > 0;
      ``clip_frac``: their sum, the tokens whose gradient clipping removed;
      ``clip_frac_low_min`` / ``clip_frac_high_max``: the lowest per-completion share of low-clipped tokens
      and the highest of high-clipped ones (TRL's ``clip_ratio/low_min`` / ``high_max`` across ranks).
    * ``outside_frac``: ratio outside [1 - epsilon, 1 + epsilon_high],
      whatever the sign of A.
    * ``ppo_kl``: token mean of ``old_logp - logp``.
    * ``ratio_mean``, ``ratio_std`` (population), ``ratio_p95``,
      ``log_ratio_mean``, ``log_ratio_std``: of the ratio actually used
      (the sequence ratio in GSPO mode).
    """
    o = options
    _check_variant(o.loss_type, o.importance_level, o.beta, ref_logp, o.max_completion_length)
    epsilon_high = o.epsilon if o.epsilon_high is None else o.epsilon_high
    sg = mx.stop_gradient
    terms = _token_terms(sg(logp), old_logp, ref_logp, advantages, mask, o.epsilon, epsilon_high, o.importance_level,
                         o.delta)
    active, adv, r, lr = terms.active, terms.advantages, terms.ratio, terms.log_ratio
    low, high = 1.0 - o.epsilon, 1.0 + epsilon_high
    low_clipped = (r < low) & (adv < 0)
    high_clipped = (r > high) & (adv > 0)
    kl = masked_mean(terms.kl, active)
    ratio_mean = masked_mean(r, active)
    clip_frac_low_min, clip_frac_high_max = _clip_extremes(low_clipped, high_clipped, active)
    log_ratio_mean = masked_mean(lr, active)
    return {
        "pg_loss": _aggregate(terms.pg, terms.seq_len, o.loss_type, totals or LossTotals.of(mask),
                              o.max_completion_length),
        "kl": kl,
        "kl_penalty": o.beta * kl,
        "clip_frac_low": masked_mean(low_clipped, active),
        "clip_frac_high": masked_mean(high_clipped, active),
        "clip_frac": masked_mean(low_clipped | high_clipped, active),
        "clip_frac_low_min": clip_frac_low_min,
        "clip_frac_high_max": clip_frac_high_max,
        "outside_frac": masked_mean((r < low) | (r > high), active),
        "ppo_kl": masked_mean(-terms.token_log_ratio, active),
        "ratio_mean": ratio_mean,
        "ratio_std": mx.sqrt(masked_mean(mx.square(r - ratio_mean), active)),
        "ratio_p95": _masked_quantile(r, active, 0.95),
        "log_ratio_mean": log_ratio_mean,
        "log_ratio_std": mx.sqrt(masked_mean(mx.square(lr - log_ratio_mean), active)),
    }


def _clip_extremes(low_clipped: mx.array, high_clipped: mx.array, active: mx.array) -> tuple[mx.array, mx.array]:
    """Each completion's clipped share, and the batch's extremes (as TRL logs them across ranks): the lowest share
    of low-clipped tokens and the highest of high-clipped ones, completions with no active token left out."""
    seq_tokens = active.sum(axis=-1)
    has_tokens = seq_tokens > 0
    seq_low = (low_clipped & active).sum(axis=-1) / mx.maximum(seq_tokens, 1)
    seq_high = (high_clipped & active).sum(axis=-1) / mx.maximum(seq_tokens, 1)
    any_tokens = has_tokens.any()
    return (mx.where(any_tokens, mx.where(has_tokens, seq_low, 1.0).min(), 0.0).astype(mx.float32),
            mx.where(has_tokens, seq_high, 0.0).max().astype(mx.float32))
