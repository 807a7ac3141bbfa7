"""The figures of a step and the verdicts of a run tell the truth (issue 26): a step's loss and gradient norm
cover all its update passes; accuracy that cannot be measured is not 0%."""

from __future__ import annotations

import pytest

from mlx_grpo.config import load_config
from mlx_grpo.telemetry.step_data import step_record
from mlx_grpo.trainer import Trainer


def test_the_loss_of_a_two_pass_step_is_the_sum_of_its_parts(tmp_path):
    # The loss came from the last pass while pg_loss and the KL penalty averaged both: they disagreed.
    config = load_config(None, {"batch_size": 4, "num_generations": 4, "max_generation_steps": 12, "train_size": 64,
                                "eval_every": 0, "num_iterations": 2, "learning_rate": 1e-3, "beta": 0.04,
                                "loss_type": "bnpo"})  # token means throughout: the parts add up exactly
    trainer = Trainer.build(config, tmp_path)
    for step in (1, 2):
        record = step_record(trainer.step(step))
        assert record["policy/loss"] == pytest.approx(record["policy/pg_loss"] + record["policy/kl_penalty"],
                                                      rel=1e-4, abs=1e-6)
