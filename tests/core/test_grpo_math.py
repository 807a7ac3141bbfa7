"""GRPO math checked against numbers worked out by hand or with plain Python.

The fixture batch is 2 prompts x 2 completions x 3 tokens with a ragged mask
(lengths 3, 2, 1, 0) so every aggregation and the all-masked case show up.
"""

import math

import mlx.core as mx
import numpy as np
import pytest

from mlx_grpo.grpo import (
    LossOptions,
    LossTotals,
    group_advantages,
    grpo_loss,
    kl_k3,
    masked_mean,
    policy_stats,
    token_entropy,
    token_logprobs,
)

MASK = [[1, 1, 1], [1, 1, 0], [1, 0, 0], [0, 0, 0]]
ADV = [1.0, -1.0, 0.5, -2.0]
LENGTHS = [3, 2, 1, 0]
# Log-probs of the current policy; any value works, the ratio depends on the
# difference to OLD below. Masked positions hold garbage on purpose.
LOGP = [[-0.5, -1.0, -2.0], [-0.3, -0.7, 1e4], [-1.5, float("nan"), -9.0], [float("inf"), 0.0, 3.0]]
# Ratios per active token: seq0 (A>0): 1.5 (clipped high), 1.1 (inside),
# 0.5 (below 1-eps but A>0, so not clipped); seq1 (A<0): 0.5 (clipped low),
# 1.5 (above 1+eps_high but A<0, so not clipped); seq2: 1.0.
RATIOS = [[1.5, 1.1, 0.5], [0.5, 1.5, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
OLD = [[LOGP[i][t] - math.log(RATIOS[i][t]) if MASK[i][t] else 0.0 for t in range(3)] for i in range(4)]
EPS, EPS_HIGH = 0.2, 0.28


def arr(x):
    return mx.array(x, dtype=mx.float32)


def loss_of(logp, old=OLD, ref=None, **kw):
    """(loss, stats) of the fixture batch."""
    kw.setdefault("epsilon", EPS)
    kw.setdefault("epsilon_high", EPS_HIGH)
    args = (logp if isinstance(logp, mx.array) else arr(logp), None if old is None else arr(old),
            None if ref is None else arr(ref), arr(ADV), mx.array(MASK))
    totals = kw.pop("totals", None)
    options = LossOptions(**kw)
    return grpo_loss(*args, options, totals), policy_stats(*args, options, totals)


def value(x):
    return float(x.item())


# ---------------------------------------------------------------- advantages

def test_group_scale_uses_population_std_and_zero_std_group_gives_zeros():
    adv = group_advantages(arr([1.0, 0.0, 2.0, 2.0]), group_size=2, scale="group").tolist()
    # group 0: mean 0.5, population std 0.5; group 1: std 0 -> 0/(0+eps) = 0
    assert adv == pytest.approx([0.5 / 0.5001, -0.5 / 0.5001, 0.0, 0.0], abs=1e-6)
    assert not any(math.isnan(a) for a in adv)


def test_batch_scale_divides_group_centred_rewards_by_batch_std():
    rewards = [1.0, 0.0, 2.0, 2.0]
    mean = sum(rewards) / 4
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / 4)  # 0.8292
    adv = group_advantages(arr(rewards), group_size=2, scale="batch").tolist()
    assert adv == pytest.approx([0.5 / (std + 1e-4), -0.5 / (std + 1e-4), 0.0, 0.0], abs=1e-6)


def test_no_scale_only_subtracts_group_mean():
    adv = group_advantages(arr([3.0, 1.0, 2.0, 0.0, 5.0, 5.0]), group_size=3, scale="none").tolist()
    assert adv == pytest.approx([1.0, -1.0, 0.0, -10 / 3, 5 / 3, 5 / 3], abs=1e-6)


def test_constant_batch_gives_zero_advantages_in_every_mode():
    for scale in ("group", "batch", "none"):
        assert group_advantages(arr([2.0] * 4), 2, scale=scale).tolist() == [0.0] * 4


def test_equal_rewards_that_float32_cannot_average_exactly_give_zero_advantages():
    # 0.1 and 1/3 are not exact in float32: their group mean misses them by an ulp,
    # which divided by eps alone pushed the whole group by ~1e-4..5e-3.
    for value in (0.1, 1 / 3, 0.7):
        adv = group_advantages(arr([value] * 8 + [0.0, 1.0] * 4), 8).tolist()
        assert adv[:8] == [0.0] * 8
        assert adv[8:] == pytest.approx([-1.0, 1.0] * 4, abs=1e-3)


def test_advantages_refuse_ragged_groups_and_unknown_scale():
    with pytest.raises(ValueError):
        group_advantages(arr([1.0, 2.0, 3.0]), group_size=2)
    with pytest.raises(ValueError):
        group_advantages(arr([1.0, 2.0]), group_size=2, scale="global")


# ---------------------------------------------------------- log-probs, entropy

def test_token_logprobs_match_log_softmax_and_survive_huge_logits():
    lp = token_logprobs(arr([[1.0, 2.0, 3.0], [1000.0, 1001.0, -1000.0]]), mx.array([2, 1]))
    expected0 = 3.0 - math.log(math.exp(1) + math.exp(2) + math.exp(3))
    expected1 = -math.log(1.0 + math.exp(-1.0))
    assert lp.dtype == mx.float32
    assert lp.tolist() == pytest.approx([expected0, expected1], abs=1e-5)


def test_token_logprobs_upcast_half_precision_logits():
    lp = token_logprobs(mx.array([[[0.0, 0.0, 0.0, 0.0]]], dtype=mx.bfloat16), mx.array([[3]]))
    assert lp.dtype == mx.float32 and lp.shape == (1, 1)
    assert value(lp[0, 0]) == pytest.approx(-math.log(4), abs=1e-6)


def test_token_logprobs_gradient_is_onehot_minus_softmax():
    logits = arr([[0.5, -1.0, 2.0], [3.0, 0.0, 0.0]])
    grad = mx.grad(lambda x: token_logprobs(x, mx.array([0, 2])).sum())(logits).tolist()
    for row, target, g in zip(logits.tolist(), [0, 2], grad):
        z = sum(math.exp(v) for v in row)
        assert g == pytest.approx([(k == target) - math.exp(v) / z for k, v in enumerate(row)], abs=1e-6)


def test_token_entropy_values_and_banned_tokens():
    logits = arr([[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, -math.inf, -math.inf], [math.log(3), 0.0, -math.inf, -math.inf]])
    h = token_entropy(logits).tolist()
    p = [0.75, 0.25]
    assert h == pytest.approx([math.log(4), math.log(2), -sum(q * math.log(q) for q in p)], abs=1e-6)
    g = mx.grad(lambda x: token_entropy(x).sum())(logits)
    assert np.isfinite(np.array(g)).all()


# ----------------------------------------------------------------------- KL

def test_k3_values_and_zero_gradient_at_equality():
    vals = kl_k3(arr([0.0, 0.0, -1.0]), arr([0.5, -0.5, -1.0])).tolist()
    assert vals == pytest.approx([math.exp(0.5) - 1.5, math.exp(-0.5) - 0.5, 0.0], abs=1e-6)
    ref = arr([-0.2, -3.0, -1.0])
    grad = mx.grad(lambda pol: kl_k3(pol, ref).sum())(ref)
    assert grad.tolist() == [0.0, 0.0, 0.0]
    # away from equality d/dpol = 1 - exp(ref - pol)
    grad = mx.grad(lambda pol: kl_k3(pol, ref).sum())(arr([0.0, 0.0, 0.0]))
    assert grad.tolist() == pytest.approx([1 - math.exp(-0.2), 1 - math.exp(-3.0), 1 - math.exp(-1.0)], abs=1e-6)


def test_kl_penalty_adds_beta_times_k3_per_token():
    ref = [[LOGP[i][t] + 0.5 if MASK[i][t] else 0.0 for t in range(3)] for i in range(4)]
    k3 = math.exp(0.5) - 1.5  # the same at every active token
    loss0, _ = loss_of(LOGP, old=None, loss_type="bnpo")
    loss, stats = loss_of(LOGP, old=None, ref=ref, beta=0.1, loss_type="bnpo")
    assert value(stats["kl"]) == pytest.approx(k3, abs=1e-6)
    assert value(stats["kl_penalty"]) == pytest.approx(0.1 * k3, abs=1e-6)
    assert value(loss) == pytest.approx(value(loss0) + 0.1 * k3, abs=1e-6)
    # beta = 0 with a reference reports KL but does not add it
    loss_b0, stats_b0 = loss_of(LOGP, old=None, ref=ref, beta=0.0, loss_type="bnpo")
    assert value(loss_b0) == pytest.approx(value(loss0), abs=1e-7)
    assert value(stats_b0["kl"]) == pytest.approx(k3, abs=1e-6)


# ------------------------------------------------------ ratio 1 (on-policy)

ON_POLICY = {  # loss with ratio 1 is -A per token; worked by hand
    "grpo": (-1 + 1 - 0.5 + 0) / 4,  # mean of per-sequence means, empty seq counts as 0
    "bnpo": -(3 * 1 - 2 * 1 + 1 * 0.5) / 6,
    "dr_grpo": -(3 * 1 - 2 * 1 + 1 * 0.5) / (4 * 4),
    "dapo": -(3 * 1 - 2 * 1 + 1 * 0.5) / 6,
}


@pytest.mark.parametrize("loss_type", sorted(ON_POLICY))
def test_on_policy_loss_per_variant(loss_type):
    loss, stats = loss_of(LOGP, old=None, loss_type=loss_type, max_completion_length=4)
    assert value(loss) == pytest.approx(ON_POLICY[loss_type], abs=1e-6)
    assert value(stats["pg_loss"]) == pytest.approx(ON_POLICY[loss_type], abs=1e-6)
    assert value(stats["ratio_mean"]) == 1.0 and value(stats["clip_frac"]) == 0.0


@pytest.mark.parametrize("as_constant", [False, True])
def test_on_policy_gradient_is_minus_advantage_over_length(as_constant):
    # old_logp given as None, or as a constant copy of logp (num_iterations == 1):
    # the ratio is exactly 1 and still carries the policy gradient.
    def f(lp):
        return loss_of(lp, old=LOGP if as_constant else None, loss_type="grpo")[0]

    grad = np.array(mx.grad(f)(arr(LOGP)))
    expected = [[-ADV[i] / LENGTHS[i] / 4 if MASK[i][t] else 0.0 for t in range(3)] for i in range(4)]
    np.testing.assert_allclose(grad, expected, atol=1e-6)


def test_dr_grpo_needs_budget_and_part_of_an_update_divides_by_the_whole_updates_sizes():
    with pytest.raises(ValueError):
        loss_of(LOGP, old=None, loss_type="dr_grpo")
    whole = LossTotals(num_sequences=8, num_tokens=24)  # these 4 sequences are half of the update
    for loss_type in ("bnpo", "dapo"):
        loss = value(loss_of(LOGP, old=None, loss_type=loss_type, totals=whole)[0])
        assert loss == pytest.approx(-1.5 / 24, abs=1e-7)
    assert value(loss_of(LOGP, old=None, loss_type="grpo", totals=whole)[0]) == \
        pytest.approx(-(1 - 1 + 0.5) / 8, abs=1e-7)
    assert value(loss_of(LOGP, old=None, loss_type="dr_grpo", max_completion_length=4, totals=whole)[0]) == \
        pytest.approx(-1.5 / 32, abs=1e-7)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_the_parts_gradients_add_up_to_the_whole_batchs(loss_type, level):
    """Any split of the batch into parts, each divided by the whole's sizes, sums to the whole gradient."""
    old, ref = arr(GSPO_OLD), arr(OLD)
    kw = dict(beta=0.1, epsilon=EPS, epsilon_high=EPS_HIGH, loss_type=loss_type, importance_level=level,
              max_completion_length=4)
    mask, adv = mx.array(MASK), arr(ADV)

    def whole(lp):
        return grpo_loss(lp, old, ref, adv, mask, LossOptions(**kw))

    totals = LossTotals.of(mask)

    def in_parts(lp):
        return sum(grpo_loss(lp[rows], old[rows], ref[rows], adv[rows], mask[rows], LossOptions(**kw), totals)
                   for rows in (slice(0, 1), slice(1, 3), slice(3, 4)))

    assert value(in_parts(arr(LOGP))) == pytest.approx(value(whole(arr(LOGP))), abs=1e-7)
    np.testing.assert_allclose(np.array(mx.grad(in_parts)(arr(LOGP))), np.array(mx.grad(whole)(arr(LOGP))),
                               rtol=1e-6, atol=1e-8)


def test_beta_without_reference_is_refused():
    with pytest.raises(ValueError):
        loss_of(LOGP, old=None, beta=0.04)


# ------------------------------------------------------- off-policy clipping

def reference_token_losses():
    """Per-token clipped surrogate in plain Python (0 where masked)."""
    out = []
    for i in range(4):
        row = []
        for t in range(3):
            if not MASK[i][t]:
                row.append(0.0)
                continue
            r = math.exp(LOGP[i][t] - OLD[i][t])
            clipped = min(max(r, 1 - EPS), 1 + EPS_HIGH)
            row.append(-min(r * ADV[i], clipped * ADV[i]))
        out.append(row)
    return out


def test_clipped_losses_by_hand_and_against_plain_python():
    per = reference_token_losses()
    # by hand: seq0 -1.28, -1.1, -0.5; seq1 0.8, 1.5; seq2 -0.5
    hand = [[-1.28, -1.1, -0.5], [0.8, 1.5, 0.0], [-0.5, 0.0, 0.0], [0.0, 0.0, 0.0]]
    np.testing.assert_allclose(per, hand, atol=1e-6)
    total = sum(map(sum, per))
    expected = {
        "grpo": sum(sum(per[i]) / LENGTHS[i] for i in range(3)) / 4,  # -0.0775
        "bnpo": total / 6,  # -0.18
        "dr_grpo": total / (4 * 5),
        "dapo": total / 6,
    }
    assert expected["grpo"] == pytest.approx(-0.0775) and expected["bnpo"] == pytest.approx(-0.18)
    for loss_type, want in expected.items():
        loss, _ = loss_of(LOGP, loss_type=loss_type, max_completion_length=5)
        assert value(loss) == pytest.approx(want, abs=1e-5), loss_type


def test_clip_fractions_and_ratio_stats_on_known_tokens():
    _, s = loss_of(LOGP, loss_type="grpo")
    assert value(s["clip_frac_high"]) == pytest.approx(1 / 6)  # seq0 t0
    assert value(s["clip_frac_low"]) == pytest.approx(1 / 6)  # seq1 t0
    assert value(s["clip_frac"]) == pytest.approx(2 / 6)
    assert value(s["outside_frac"]) == pytest.approx(4 / 6)  # 1.5, 0.5, 0.5, 1.5
    active = [1.5, 1.1, 0.5, 0.5, 1.5, 1.0]
    logs = [math.log(r) for r in active]
    assert value(s["ratio_mean"]) == pytest.approx(np.mean(active), abs=1e-6)
    assert value(s["ratio_std"]) == pytest.approx(np.std(active), abs=1e-6)
    assert value(s["ratio_p95"]) == pytest.approx(np.percentile(active, 95), abs=1e-6)
    assert value(s["log_ratio_mean"]) == pytest.approx(np.mean(logs), abs=1e-6)
    assert value(s["log_ratio_std"]) == pytest.approx(np.std(logs), abs=1e-6)
    assert value(s["ppo_kl"]) == pytest.approx(-np.mean(logs), abs=1e-6)
    assert all(v.dtype == mx.float32 and v.ndim == 0 for v in s.values())


def test_clipped_tokens_get_no_gradient():
    grad = np.array(mx.grad(lambda lp: loss_of(lp, loss_type="grpo")[0])(arr(LOGP)))
    # d/dlogp of -r*A is -A*r; grpo weighs a token by 1/(len * N)
    expected = [
        [0.0, -1 * 1.1 / 3 / 4, -1 * 0.5 / 3 / 4],  # t0 clipped high
        [0.0, 1 * 1.5 / 2 / 4, 0.0],  # t0 clipped low
        [-0.5 / 1 / 4, 0.0, 0.0],
        [0.0, 0.0, 0.0],
    ]
    np.testing.assert_allclose(grad, expected, atol=1e-6)


# ------------------------------------------------------------------ masking

def test_masked_tokens_change_nothing():
    base_loss, base_stats = loss_of(LOGP, loss_type="bnpo", ref=LOGP, beta=0.1)
    other = [row[:] for row in LOGP]
    other[1][2], other[2][1], other[3][0] = -123.0, 5.0, -float("inf")
    old = [row[:] for row in OLD]
    old[2][2] = float("nan")
    loss, stats = loss_of(other, old=old, loss_type="bnpo", ref=other, beta=0.1)
    assert value(loss) == value(base_loss)
    assert {k: value(v) for k, v in stats.items()} == {k: value(v) for k, v in base_stats.items()}
    grad = np.array(mx.grad(lambda lp: loss_of(lp, old=old, loss_type="bnpo", ref=other, beta=0.1)[0])(arr(other)))
    assert np.isfinite(grad).all()
    assert (grad[np.array(MASK) == 0] == 0).all()


def test_all_masked_batch_gives_zero_not_nan():
    zeros = mx.zeros((2, 3))
    for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo"):
        for level in ("token", "sequence"):
            args = (zeros, zeros, zeros, arr([1.0, -1.0]), mx.zeros((2, 3), dtype=mx.bool_))
            kw = dict(beta=0.1, loss_type=loss_type, importance_level=level, max_completion_length=3)
            options = LossOptions(**kw)
            loss, stats = grpo_loss(*args, options), policy_stats(*args, options)
            assert value(loss) == 0.0
            assert all(value(v) == 0.0 for v in stats.values())


def test_masked_mean_helper():
    assert value(masked_mean(arr([1.0, 2.0, float("nan")]), mx.array([1, 1, 0]))) == 1.5
    assert value(masked_mean(arr([1.0]), mx.array([0]))) == 0.0


# --------------------------------------------------------------------- GSPO

GSPO_LR = [[0.2, -0.1, 0.5], [0.1, -0.5, 0.0], [0.6, 0.0, 0.0], [0.0, 0.0, 0.0]]
GSPO_OLD = [[LOGP[i][t] - GSPO_LR[i][t] if MASK[i][t] else 0.0 for t in range(3)] for i in range(4)]


def gspo_seq_ratios():
    return [math.exp(sum(GSPO_LR[i][:n]) / n) if n else 1.0 for i, n in enumerate(LENGTHS)]


def test_gspo_uses_geometric_mean_sequence_ratio():
    s = gspo_seq_ratios()  # exp(0.2)=1.2214 inside; exp(-0.2)=0.8187 inside; exp(0.6)=1.822 clipped
    loss, stats = loss_of(LOGP, old=GSPO_OLD, loss_type="grpo", importance_level="sequence")
    per_seq = [-min(s[i] * ADV[i], min(max(s[i], 1 - EPS), 1 + EPS_HIGH) * ADV[i]) for i in range(3)]
    assert value(loss) == pytest.approx(sum(per_seq) / 4, abs=1e-6)
    token_ratios = [s[0]] * 3 + [s[1]] * 2 + [s[2]]
    assert value(stats["ratio_mean"]) == pytest.approx(np.mean(token_ratios), abs=1e-6)
    assert value(stats["clip_frac_high"]) == pytest.approx(1 / 6)  # seq2's only token
    # log ratio of a sequence is the mean of its tokens' log ratios, so the
    # token-weighted mean equals the plain token mean
    assert value(stats["log_ratio_mean"]) == pytest.approx(-value(stats["ppo_kl"]), abs=1e-6)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo"])
def test_gspo_gradient_equals_differentiating_the_sequence_ratio(loss_type):
    s = gspo_seq_ratios()
    grad = np.array(mx.grad(lambda lp: loss_of(lp, old=GSPO_OLD, loss_type=loss_type,
                                               importance_level="sequence", max_completion_length=3)[0])(arr(LOGP)))
    # Each token of an unclipped sequence i gets -A_i * s_i times its aggregation weight.
    weight = {"grpo": lambda i: 1 / (LENGTHS[i] * 4), "bnpo": lambda i: 1 / 6, "dr_grpo": lambda i: 1 / 12}[loss_type]
    expected = [[-ADV[i] * s[i] * weight(i) if MASK[i][t] and i < 2 else 0.0 for t in range(3)] for i in range(4)]
    np.testing.assert_allclose(grad, expected, atol=1e-6)

    # Same gradient as the direct form: s_i = exp(masked mean log ratio), one
    # value per sequence, broadcast over its tokens, differentiated through the mean.
    m, a, old = arr(MASK), arr(ADV)[:, None], arr(GSPO_OLD)

    def direct(lp):
        lp = mx.where(m > 0, lp, 0.0)
        seq = mx.exp(((lp - old) * m).sum(1) / mx.maximum(m.sum(1), 1))[:, None]
        per = -mx.minimum(seq * a, mx.clip(seq, 1 - EPS, 1 + EPS_HIGH) * a) * m
        if loss_type == "grpo":
            return (per.sum(1) / mx.maximum(m.sum(1), 1)).mean()
        return per.sum() / (6 if loss_type == "bnpo" else 12)

    np.testing.assert_allclose(grad, np.array(mx.grad(direct)(arr(LOGP))), atol=1e-6)


def test_gspo_on_policy_matches_token_level():
    for loss_type in ("grpo", "bnpo"):
        tok = loss_of(LOGP, old=None, loss_type=loss_type)[0]
        seq = loss_of(LOGP, old=None, loss_type=loss_type, importance_level="sequence")[0]
        assert value(tok) == pytest.approx(value(seq), abs=1e-7)


def test_unknown_variants_are_refused():
    with pytest.raises(ValueError):
        loss_of(LOGP, loss_type="ppo")
    with pytest.raises(ValueError):
        loss_of(LOGP, importance_level="token_and_sequence")
