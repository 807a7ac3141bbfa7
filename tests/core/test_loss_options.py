"""The GRPO options peers have: two-sided clipping (delta), masking truncated completions out of the loss,
and dynamic sampling (DAPO), each checked by hand and in a real step."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlx_grpo.common.errors import UserError
from mlx_grpo.config.train_config import load_config
from mlx_grpo.grpo import LossOptions, grpo_loss
from mlx_grpo.rollout import Rollout
from mlx_grpo.trainer import Trainer
from mlx_grpo.update import build_train_batch

# ----------------------------------------------------------------------------- delta

def one_token_loss(ratio: float, advantage: float, delta=None) -> tuple[float, float]:
    """(loss, d loss / d logp) of one token with the given ratio to the old policy."""
    old = mx.array([[0.0]])

    def f(logp):
        return grpo_loss(logp, old, None, mx.array([advantage]), mx.array([[1]]), LossOptions(epsilon=0.2, delta=delta))

    logp = mx.array([[float(np.log(ratio))]])
    loss, grad = mx.value_and_grad(f)(logp)
    return loss.item(), grad.item()


def test_delta_caps_the_ratio_of_a_token_with_a_negative_advantage():
    # ratio 3, A = -1: min(3 * -1, clip(3) * -1) = -3, loss 3 and gradient 3 (dL/dlogp = -A * r)
    assert one_token_loss(3.0, -1.0) == pytest.approx((3.0, 3.0))
    # delta 2: min(min(3, 2) * -1, 1.2 * -1) = -2, loss 2, and the capped ratio passes no gradient
    assert one_token_loss(3.0, -1.0, delta=2.0) == pytest.approx((2.0, 0.0))
    # below delta nothing changes: ratio 1.5 -> loss 1.5, gradient 1.5
    assert one_token_loss(1.5, -1.0, delta=2.0) == pytest.approx((1.5, 1.5))
    # a positive advantage is already clipped at 1 + epsilon: delta changes nothing
    assert one_token_loss(3.0, 1.0, delta=2.0) == pytest.approx(one_token_loss(3.0, 1.0))


def test_delta_must_lie_above_the_upper_clip():
    with pytest.raises(UserError, match="delta"):
        load_config(None, {"delta": 1.1, "epsilon": 0.2})
    assert load_config(None, {"delta": 1.5}).delta == 1.5


# ----------------------------------------------------------------------------- mask_truncated_completions

def test_truncated_completions_get_no_loss_tokens_when_masked():
    rollout = Rollout([[1, 2], [1, 2], [3]], [[4, 5, 6], [7], [8, 9]], [[0.0] * 3, [0.0], [0.0] * 2],
                      [True, False, True], 0.0)
    assert np.array(build_train_batch(rollout, 0).mask).sum(axis=1).tolist() == [3, 1, 2]
    masked = build_train_batch(rollout, 0, mask_truncated=True)
    assert np.array(masked.mask).sum(axis=1).tolist() == [0, 1, 0] and masked.num_tokens == 1
    # grpo: the masked sequences add 0 but still count in N = 3, so the loss is -A_1 / 3
    loss = grpo_loss(mx.zeros((3, 3)), None, None, mx.array([5.0, 2.0, -7.0]), masked.mask)
    assert loss.item() == pytest.approx(-2.0 / 3)


# ----------------------------------------------------------------------------- dynamic sampling

PARITY_REWARD = '''
def odd_prompts_only(prompts, completions, answers, **columns):
    """Reward spread only on prompts whose first operand is odd: even ones' groups all score 0."""
    out = []
    for i, (p, c) in enumerate(zip(prompts, completions)):
        digits = "".join(ch for ch in p.split("+")[0] if ch.isdigit())
        out.append(float(sum(map(ord, c)) % 7) if digits and int(digits) % 2 else 0.0)
    return out
'''


def trainer_with(tmp_path, **overrides) -> Trainer:
    (tmp_path / "parity.py").write_text(PARITY_REWARD)
    reward = f"{tmp_path / 'parity.py'}:odd_prompts_only"  # overrides are the command line's: relative to the cwd
    config = load_config(None, {"batch_size": 6, "num_generations": 4, "max_generation_steps": 8, "train_size": 200,
                                "eval_every": 0, "rewards": [reward], **overrides})
    return Trainer.build(config, tmp_path)


def test_dynamic_sampling_replaces_groups_that_teach_nothing(tmp_path):
    plain = trainer_with(tmp_path).step(1)
    groups = plain.total.reshape(6, 4)
    assert (groups.max(axis=1) == groups.min(axis=1)).any()  # without it, some groups have no spread

    data = trainer_with(tmp_path, dynamic_sampling=True, dynamic_sampling_max_rounds=10).step(1)
    groups = data.total.reshape(-1, 4)
    assert groups.shape == (6, 4)  # the batch is full
    assert (groups.max(axis=1) > groups.min(axis=1)).all()  # and every group has a spread
    assert data.component_metrics["sampling/redrawn_prompts"] >= 1
    assert data.trained_tokens == int(data.lengths.sum())


def test_a_batch_that_stays_uninformative_is_filled_after_the_last_round(tmp_path):
    data = trainer_with(tmp_path, rewards=["format_exact"], max_generation_steps=1, dynamic_sampling=True,
                        dynamic_sampling_max_rounds=2).step(1)
    # one-token completions never satisfy the format: every group scores 0, every round redraws all 6
    assert data.total.shape == (24,) and not data.total.any()
    assert data.component_metrics["sampling/redrawn_prompts"] == 12


FLAKY_REWARD = '''
calls = []


def flaky(prompts, completions, answers, **columns):
    """Raises on its first batch only, then scores every completion 0."""
    calls.append(len(completions))
    if len(calls) == 1:
        raise RuntimeError("first batch")
    return [0.0] * len(completions)
'''


def test_a_reward_error_is_reported_once_when_dynamic_sampling_fills_from_spare_groups(tmp_path):
    (tmp_path / "flaky.py").write_text(FLAKY_REWARD)
    data = trainer_with(tmp_path, rewards=["format_exact", f"{tmp_path / 'flaky.py'}:flaky"], max_generation_steps=1,
                        dynamic_sampling=True, dynamic_sampling_max_rounds=1).step(1)
    # every group scores 0 in both rounds, so the batch is the first round's groups, taken back from the spares
    assert data.total.shape == (24,) and data.component_metrics["sampling/redrawn_prompts"] == 6
    assert len(data.new_errors) == 1 and "flaky" in data.new_errors[0]


def test_rollouts_and_scores_slice_and_join_themselves():
    from mlx_grpo.rewards.scoring import RewardScores

    rollout = Rollout([[1], [1], [2], [2]], [[5], [6, 7], [8], []], [[-0.1], [-0.2, -0.3], [-0.4], []],
                      [False, True, False, True], 2.0)
    part = rollout.take([3, 0])
    assert (part.prompts, part.completions, part.logprobs, part.truncated) == ([[2], [1]], [[], [5]], [[], [-0.1]],
                                                                                [True, False])
    joined = Rollout.concat([rollout.take([0, 1]), rollout.take([2, 3])])
    assert joined.completions == rollout.completions and joined.truncated == rollout.truncated
    assert joined.seconds == 4.0  # each part keeps its rollout's time; joined, the times add up
    scores = RewardScores(["a", "b"], np.array([[1.0, 2.0, np.nan], [0.0, 1.0, 1.0]]), np.array([1.0, 3.0, 1.0]),
                          ["a raised"])
    taken = scores.take([2, 0])
    assert np.array_equal(taken.per_function, [[np.nan, 1.0], [1.0, 0.0]], equal_nan=True)
    assert taken.total.tolist() == [1.0, 1.0] and taken.names == ["a", "b"]
    back = RewardScores.concat([scores.take([0]), scores.take([1, 2])])
    assert np.array_equal(back.per_function, scores.per_function, equal_nan=True)
    assert back.new_errors == ["a raised"]


@pytest.mark.parametrize("iterations", [1, 2, 3])
def test_the_learning_rate_schedule_spans_every_update_of_the_run(iterations):
    """num_iterations updates per step: warm-up and cosine are measured in updates, so the last update
    still learns and the schedule ends with the run (it used to reach 0 after num_steps updates)."""
    import mlx.nn as nn

    from mlx_grpo.trainer import make_optimizer

    config = load_config(None, {"num_steps": 20, "num_iterations": iterations, "learning_rate": 1e-3,
                                "warmup_fraction": 0.1, "lr_schedule": "cosine"})
    model = nn.Linear(2, 2)
    optimizer = make_optimizer(config)
    grads = {k: mx.ones_like(v) for k, v in model.parameters().items()}
    rates = []
    for _ in range(config.num_steps * iterations):
        rates.append(optimizer.learning_rate.item())
        optimizer.update(model, grads)
    peak = rates.index(max(rates))
    assert abs(peak - round(0.1 * len(rates))) <= 1  # warm-up over 10% of the updates
    assert max(rates) == pytest.approx(1e-3)
    assert rates[-1] > 0 and rates[-1] < 0.05 * max(rates)  # still learning at the end, and near the end of cosine
    assert all(a >= b for a, b in zip(rates[peak:], rates[peak + 1:]))
