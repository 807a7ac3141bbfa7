"""Per-difficulty accuracy and counts, as each training step and each evaluation reports them."""

import pytest
from step_data_builder import make_step_data

from mlx_grpo.telemetry.metrics.step_data import difficulty_metrics, eval_record, step_record


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


def test_step_records_carry_levels_only_when_the_data_has_them():
    correct = [True, False, True, False]
    labelled = step_record(make_step_data(4, 2, correct=correct, levels=[1, 1, 3, 3]))
    assert labelled["difficulty/1/accuracy"] == 0.5 and labelled["difficulty/3/count"] == 2
    assert labelled["accuracy/train"] == 0.5
    unlabelled = step_record(make_step_data(4, 2, correct=correct))
    assert not any(name.startswith("difficulty/") for name in unlabelled)


def test_evaluation_reports_accuracy_per_level_and_no_accuracy_for_an_empty_held_out_set():
    record = eval_record([True, False, True], ["easy", "hard", "easy"], seconds=1.5)
    assert record == {"timing/eval_s": 1.5, "eval/num_samples": 3.0, "eval/accuracy": pytest.approx(2 / 3),
                      "eval/difficulty/easy/accuracy": 1.0, "eval/difficulty/easy/count": 2.0,
                      "eval/difficulty/hard/accuracy": 0.0, "eval/difficulty/hard/count": 1.0}
    assert "eval/accuracy" not in eval_record([], [], seconds=0.1)


def test_solved_groups_are_those_every_completion_of_which_is_right():
    import numpy as np
    correct = np.array([True, True, False, True, True, True, False, False])  # groups of 2: solved, mixed, solved, wrong
    record = step_record(make_step_data(8, 2, correct=correct))
    assert record["accuracy/solved_group_frac"] == 0.5
    assert step_record(make_step_data(8, 4, correct=correct))["accuracy/solved_group_frac"] == 0.0
    assert "accuracy/solved_group_frac" not in step_record(make_step_data(8, 2, correct=None))
