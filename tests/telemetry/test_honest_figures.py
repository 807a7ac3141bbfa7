"""The figures of a step and the verdicts of a run tell the truth (issue 26): a step's loss and gradient norm
cover all its update passes; accuracy that cannot be measured is not 0%."""

from __future__ import annotations

import pytest

from mlx_grpo.config.train_config import load_config
from mlx_grpo.telemetry.metrics.step_data import step_record
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


# ----------------------------------------------------------------------------- accuracy that cannot be measured

PLAIN_REWARD = '''
def says_yes(prompts, completions, answers, **columns):
    return [float("1" in c) for c in completions]
'''

YES_CHECK = '''
def has_a_one(prompts, completions, answers, **columns):
    return ["1" in c for c in completions]
'''


def custom_task(tmp_path, **overrides) -> dict:
    """A run on a dataset of its own with only a custom reward: nothing says which answers are right."""
    import json

    from mlx_grpo.run.loop import train

    (tmp_path / "plain.py").write_text(PLAIN_REWARD)
    (tmp_path / "check.py").write_text(YES_CHECK)
    rows = [{"prompt": f"{i} + {i} =", "answer": str(2 * i)} for i in range(40)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = load_config(None, {"dataset": str(tmp_path / "rows.jsonl"), "rewards": [f"{tmp_path}/plain.py:says_yes"],
                                "batch_size": 4, "num_generations": 4, "max_generation_steps": 8, "num_steps": 3,
                                "eval_every": 2, "checkpoint_every": 0, "tensorboard": False,
                                "monitoring_dir": str(tmp_path / "runs"), **overrides})
    return train(config, tmp_path)


def test_a_task_without_a_correctness_check_has_no_accuracy_rather_than_zero(tmp_path, capsys):
    from pathlib import Path

    from mlx_grpo.telemetry.analysis.report import load_run
    from mlx_grpo.telemetry.analysis.reward_report import analyze_run
    run_dir = Path(custom_task(tmp_path)["run_dir"])
    _, metrics, samples, alerts = load_run(run_dir)
    assert not any(key.startswith(("accuracy/", "eval/")) or "correct" in key for r in metrics for key in r)
    assert all(s["correct"] is None for s in samples)
    headline = analyze_run(metrics, samples, alerts).outcome.headline()
    assert "accuracy n/a" in headline and "0%" not in headline
    assert "accuracy n/a" in capsys.readouterr().out


def test_a_correctness_function_named_in_the_config_measures_accuracy(tmp_path):
    from pathlib import Path

    from mlx_grpo.telemetry.analysis.report import load_run

    run_dir = Path(custom_task(tmp_path, correctness=f"{tmp_path}/check.py:has_a_one")["run_dir"])
    _, metrics, samples, _ = load_run(run_dir)
    assert all("accuracy/train" in r for r in metrics if r["step"] >= 1)
    assert [r["step"] for r in metrics if "eval/accuracy" in r] == [0, 2, 3]  # before the first update, then due
    assert all(s["correct"] == ("1" in s["completion"]) for s in samples)


# ----------------------------------------------------------------------------- verdicts of whole runs

def test_a_run_whose_reward_fell_or_stayed_flat_is_not_said_to_have_gained(tmp_path):
    from synthetic_runs import Faults, simulate

    from mlx_grpo.telemetry.analysis.reward_report import analyze_run

    # seed 1: the stagnant run's reward and accuracy trends are flat (seed 0's drift up by 3%, read as rising)
    for faults in (Faults(collapse=True, fault_step=60), Faults(stagnant=True)):
        metrics, samples = simulate(steps=120, seed=1, faults=faults)
        verdict = analyze_run(metrics, samples).hacking.verdict
        assert "gains came with correctness gains" not in verdict
        assert verdict.startswith(("no reward gains to explain", "possible reward hacking")), verdict
    metrics, samples = simulate(steps=120)  # a healthy run: reward and accuracy both rise
    assert "reward gains came with correctness gains" in analyze_run(metrics, samples).hacking.verdict


def test_the_quality_headline_says_how_many_parts_it_rests_on():
    from synthetic_runs import simulate

    from mlx_grpo.telemetry.analysis.reward_report import analyze_run

    metrics, samples = simulate(steps=4)  # too short for three of the four parts
    quality = analyze_run(metrics, samples).quality
    assert [p.score is not None for p in quality.parts] == [False, True, False, False]
    # one part of four is no verdict: no score is printed until most parts can be scored
    assert quality.headline() == "quality not judged yet (1 of 4 parts have the 5 logged steps they need)"
    metrics, samples = simulate(steps=60)
    assert "parts" not in analyze_run(metrics, samples).quality.headline()


def test_a_policy_broken_by_its_first_updates_raises_the_collapse_error_at_once():
    # Learning rate 1e-3 on the default run: held-out 40% before the first update, sampled accuracy 27% at
    # step 1 and 0% from step 2 on. The collapse rule needed 10 earlier points, whose median was the collapse.
    from mlx_grpo.telemetry.alerts.config import default_rules
    from mlx_grpo.telemetry.alerts.engine import AlertEngine

    records = [{"step": 0, "eval/accuracy": 0.40, "eval/num_samples": 200.0}]
    records += [{"step": s, "accuracy/train": 0.27 if s == 1 else 0.0} for s in range(1, 30)]
    alerts = [a for a in AlertEngine(default_rules()).check_all(records) if a.rule == "accuracy_collapse"]
    assert [(a.step, a.level) for a in alerts] == [(3, "error")]
    assert "from its first value 0.27 (-100%, step 1)" in alerts[0].message
    healthy = [records[0], *({"step": s, "accuracy/train": 0.2 + 0.1 * (s % 3)} for s in range(1, 30))]
    assert not [a for a in AlertEngine(default_rules()).check_all(healthy) if a.rule == "accuracy_collapse"]
    # A chat model sampled at temperature 1 scores far below its greedy held-out accuracy: SmolLM2-135M on
    # configs/smollm2_sums.yaml, seed 1 (26% greedy; sampled 9, 0, 25, 3, 3%, then learning). Compared with the
    # greedy figure this start read as a collapse and the run was stopped at step 5.
    sampled = [0.094, 0.0, 0.25, 0.031, 0.031, 0.125, 0.28, 0.22, 0.5, 0.34, 0.81, 0.41, 0.66]
    chat = [{"step": 0, "eval/accuracy": 0.26}, *({"step": s, "accuracy/train": a} for s, a in enumerate(sampled, 1))]
    assert not [a for a in AlertEngine(default_rules()).check_all(chat) if a.rule == "accuracy_collapse"]


def test_a_mistyped_correctness_setting_names_the_key(tmp_path):
    from mlx_grpo.common.errors import UserError
    from mlx_grpo.rewards.correctness import load_correctness

    with pytest.raises(UserError, match="key 'correctness' is 'bogus'; expected auto, answer, last_number, none or file.py"):
        load_correctness("bogus", "arithmetic", [], tmp_path)
    with pytest.raises(UserError, match="key 'correctness': reward file not found"):
        load_correctness("missing.py:check", "arithmetic", [], tmp_path)
    assert load_correctness("auto", "data.jsonl", ["my.py:reward"], tmp_path) is None  # nothing to measure with
    assert load_correctness("auto", "data.jsonl", ["answer_check"], tmp_path) is not None


def test_a_run_stopped_after_its_first_evaluation_claims_no_held_out_change():
    # The learning-rate 1e-3 run stopped at step 3: one evaluation (before the first update) says where it
    # started, not how it moved; the sampled accuracy says what happened.
    from mlx_grpo.telemetry.analysis.reward_report import analyze_run

    records = [{"step": 0, "eval/accuracy": 0.32}]
    records += [{"step": s, "accuracy/train": a, "rewards/total/mean": r}
                for s, a, r in ((1, 0.27, 8.1), (2, 0.0, 2.7), (3, 0.0, -2.7))]
    headline = analyze_run(records).outcome.headline()
    assert "held-out accuracy 32.0% at step 0 (its only evaluation)" in headline
    assert "training accuracy 27% at step 1 -> 0% at step 3" in headline
    assert "points" not in headline
