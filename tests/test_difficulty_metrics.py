"""Per-difficulty accuracy and counts, as each training step and each evaluation reports them."""

import pytest

from mlx_grpo.step_metrics import difficulty_metrics, rollout_metrics


def test_accuracy_and_count_per_level_skip_unlabelled_rows():
    levels = [1, 1, 2, None, 3, 3, 3]
    correct = [True, False, True, True, False, False, True]
    assert difficulty_metrics(levels, correct) == pytest.approx({
        "difficulty/1/accuracy": 0.5, "difficulty/1/count": 2,
        "difficulty/2/accuracy": 1.0, "difficulty/2/count": 1,
        "difficulty/3/accuracy": 1 / 3, "difficulty/3/count": 3,
    })


def test_text_labels_are_levels_too():
    metrics = difficulty_metrics(["easy", "hard", "easy"], [True, False, False])
    assert metrics == {"difficulty/easy/accuracy": 0.5, "difficulty/easy/count": 2.0,
                       "difficulty/hard/accuracy": 0.0, "difficulty/hard/count": 1.0}


def test_step_metrics_carry_levels_only_when_the_data_has_them():
    common = dict(prompt_lengths=[8, 8, 8, 8], prompt_truncated=[False] * 4, completion_lengths=[8, 9, 8, 24],
                  completion_truncated=[False, False, False, True], correct=[True, False, True, False])
    labelled = rollout_metrics(**common, difficulty=[1, 1, 3, 3])
    assert labelled["difficulty/1/accuracy"] == 0.5 and labelled["difficulty/3/count"] == 2
    assert labelled["accuracy/train"] == 0.5
    unlabelled = rollout_metrics(**common, difficulty=[None] * 4)
    assert not any(name.startswith("difficulty/") for name in unlabelled)
