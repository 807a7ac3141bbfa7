"""S-GRPO: where exits fall, what is forced, how exits are rewarded and grouped, the metrics."""

import mlx.core as mx
import numpy as np
import pytest

from mlx_grpo import grpo
from mlx_grpo.common.errors import UserError
from mlx_grpo.config.train_config import load_config
from mlx_grpo.extras.sgrpo import (
    TagTokens,
    cut_answer,
    exit_prefix_lengths,
    exit_rewards,
    forced_tokens,
    reasoning_span,
    sgrpo_metrics,
)
from mlx_grpo.telemetry.metrics.catalogue import find_entry

# token ids of a toy vocabulary: 10 <reasoning>, 11 </reasoning>, 12 <answer>, 13 </answer>, 2 EOS, 3-9 text
TAGS = TagTokens(close_reasoning=[11], open_answer=[12], close_answer=[13])
EOS = {2}


def test_exits_are_evenly_spaced_and_the_last_keeps_the_whole_span():
    assert exit_prefix_lengths(8, 4) == [2, 4, 6, 8]
    assert exit_prefix_lengths(7, 4) == [2, 4, 6, 7]
    assert exit_prefix_lengths(2, 4) == [1, 1, 2, 2]
    assert exit_prefix_lengths(0, 3) == [0, 0, 0]


def test_exits_follow_the_reasoning_when_it_is_long_enough():
    path = [10, 5, 5, 5, 5, 5, 5, 11, 12, 7, 13, 2]
    span = reasoning_span(path, TAGS, EOS, num_exits=4)
    assert span == 7  # everything before </reasoning>
    prefixes = [path[:k] for k in exit_prefix_lengths(span, 4)]
    assert prefixes[-1] == [10, 5, 5, 5, 5, 5, 5]
    assert all(forced_tokens(p, TAGS) == [11, 12] for p in prefixes)  # close the reasoning, open the answer


def test_an_empty_reasoning_block_exits_on_the_tags():
    path = [10, 11, 12, 5, 6, 13, 2]  # <reasoning></reasoning><answer>56</answer>
    span = reasoning_span(path, TAGS, EOS, num_exits=4)
    assert span == 2  # too little reasoning: the whole completion before <answer>
    contexts = [path[:k] + forced_tokens(path[:k], TAGS) for k in exit_prefix_lengths(span, 4)]
    # every exit ends up asking for the answer right after the (empty) reasoning
    assert contexts == [[10, 11, 12]] * 4


def test_a_completion_without_tags_spreads_exits_over_all_of_it():
    assert reasoning_span([5, 6, 7, 8, 9, 2], TAGS, EOS, num_exits=2) == 5
    assert reasoning_span([5, 6, 7], TAGS, EOS, num_exits=2) == 3  # truncated: no EOS to drop


def test_answer_is_cut_after_a_multi_token_closing_tag():
    tags = TagTokens([11], [12], close_answer=[13, 14])
    assert cut_answer([7, 13, 14, 9, 9], tags) == [7, 13, 14]
    assert cut_answer([7, 13, 9], tags) == [7, 13, 9]


def test_correct_exits_earn_a_reward_that_decays_with_the_exit_position():
    correct = np.array([[True, True, False, True], [False, False, False, False], [False, False, False, True]])
    rewards = exit_rewards(correct, decay=0.5)
    np.testing.assert_allclose(rewards, [[1, 0.5, 0, 0.125], [0, 0, 0, 0], [0, 0, 0, 0.125]])
    adv = np.array(grpo.group_advantages(mx.array(rewards.reshape(-1), dtype=mx.float32), 4)).reshape(3, 4)
    assert adv[0, 0] > adv[0, 1] > adv[0, 3] > adv[0, 2]  # earliest correct exit is pushed up most
    np.testing.assert_allclose(adv[1], 0, atol=1e-6)  # nothing right: nothing to learn from this path
    assert adv[2, 3] > 0 > adv[2, 0]  # only the full reasoning was right: it still beats the wrong exits


def test_no_decay_rewards_every_correct_exit_the_same():
    np.testing.assert_allclose(exit_rewards(np.array([[True, False, True]]), decay=1.0), [[1, 0, 1]])


def test_metrics_accuracy_per_exit_mean_correct_position_overall():
    correct = np.array([[True, False, True, False], [False, False, True, False]])
    metrics = sgrpo_metrics(correct, exit_rewards(correct, 0.9))
    assert metrics == pytest.approx({
        "sgrpo/exit_1/accuracy": 0.5, "sgrpo/exit_2/accuracy": 0.0, "sgrpo/exit_3/accuracy": 1.0,
        "sgrpo/exit_4/accuracy": 0.0, "sgrpo/overall_accuracy": 3 / 8,
        "sgrpo/avg_correct_exit_position": (1 + 3 + 3) / 3, "sgrpo/zero_std_group_frac": 0.0,
    })
    assert all(find_entry(name) is not None for name in metrics)
    none_right = np.zeros((2, 3), dtype=bool)
    assert "sgrpo/avg_correct_exit_position" not in sgrpo_metrics(none_right, exit_rewards(none_right, 0.9))
    # T3: every exit wrong, so every serial group scored the same and the update learned nothing
    assert sgrpo_metrics(none_right, exit_rewards(none_right, 0.9))["sgrpo/zero_std_group_frac"] == 1.0


def test_the_logged_advantages_are_the_ones_the_update_used():
    # T3: under S-GRPO advantages/* described the sampled completions (std 1.0) while the update's serial
    # advantages were all zero and the gradient was exactly 0
    from step_data_builder import make_step_data

    from mlx_grpo.telemetry.metrics.step_data import step_record

    sampled = np.array([1.0, -1.0] * 8)  # the parallel groups' advantages: healthy-looking
    data = make_step_data(advantages=sampled, update_advantages=np.zeros(64))
    record = step_record(data)
    assert record["advantages/std"] == 0.0 and record["advantages/max"] == 0.0
    assert step_record(make_step_data(advantages=sampled))["advantages/std"] == 1.0  # plain GRPO: unchanged


def test_config_needs_at_least_two_exits():
    with pytest.raises(UserError, match="sgrpo.num_exits"):
        load_config(None, {"sgrpo.num_exits": 1})
    with pytest.raises(UserError, match="sgrpo.max_answer_tokens"):
        load_config(None, {"sgrpo.max_answer_tokens": 0})
