"""Verdicts from robust statistics (issue 34): Theil-Sen, Mann-Kendall, change points, and the words built on
them: trend labels that do not call a collapse "flat" (T5), alert percentages that are the change they name
(T10), an early collapse seen (T4), held-out accuracy watched (T15)."""

from __future__ import annotations

import numpy as np
import pytest

from mlx_grpo.telemetry.alerts.config import default_rules
from mlx_grpo.telemetry.alerts.engine import AlertEngine
from mlx_grpo.telemetry.analysis.reward_report import trend_of


def test_theil_sen_keeps_the_slope_through_wild_points():
    from mlx_grpo.telemetry.metrics.robust import theil_sen

    x = np.arange(50.0)
    y = 2.0 * x + 1.0
    y[::5] = -500.0  # a fifth of the points are garbage
    slope, intercept = theil_sen(x, y)
    assert slope == pytest.approx(2.0, abs=0.05)
    assert abs(np.polyfit(x, y, 1)[0] - 2.0) > 0.5  # least squares is dragged off


def test_mann_kendall_tells_a_trend_from_noise():
    from mlx_grpo.telemetry.metrics.robust import mann_kendall

    rng = np.random.default_rng(0)
    p_up, tau_up = mann_kendall(np.arange(30.0) + rng.normal(0, 3, 30))
    assert p_up < 1e-3 and tau_up > 0.5
    p_noise, _ = mann_kendall(rng.normal(0, 1, 30))
    assert p_noise > 0.05
    assert mann_kendall(np.ones(20)) == (1.0, 0.0)


def test_halves_shift_finds_a_rise_that_levelled_off_and_rarely_one_in_noise():
    from mlx_grpo.telemetry.metrics.robust import halves_shift, mann_kendall

    learnt = [0.31, 0.19, 0.5, 0.38, 0.19, 0.75, 0.75, 0.75, 0.69, 0.31]  # up at step 6, then one bad batch
    assert mann_kendall(learnt)[0] > 0.05  # no monotone trend left
    p, later_higher = halves_shift(learnt)
    assert p < 0.05 and later_higher == 0.9
    assert halves_shift(learnt[::-1])[1] == pytest.approx(0.1)  # the same fall reads as a fall
    assert halves_shift(np.ones(12)) == (1.0, 0.5) and halves_shift([0.1, 0.9, 0.1, 0.9, 0.1, 0.9])[0] == 1.0
    # accuracy of 16 samples a step with nothing learnt: a "shift" at p < 0.05 (either way) in under 5% of runs
    rng = np.random.default_rng(0)
    false = np.mean([halves_shift(rng.binomial(16, 0.4, 12) / 16)[0] < 0.05 for _ in range(2000)])
    assert false < 0.05


def test_change_point_finds_a_level_shift_and_not_one_in_noise():
    from mlx_grpo.telemetry.metrics.robust import change_point

    rng = np.random.default_rng(1)
    y = np.r_[rng.normal(8, 0.3, 10), rng.normal(-3, 0.3, 10)]
    cp = change_point(y)
    assert cp is not None and cp.index == 10 and cp.before > 7 and cp.after < -2
    assert change_point(rng.normal(0, 1, 200)) is None


# review 3's run F (lr 1e-2, on_alert: rollback): the mean total reward of its 12 steps
F_REWARD = [7.80, -3.09, -3.12, 8.88, -2.74, -2.99, -2.41, -3.08, -2.85, -2.60, -2.95, -2.70]


def test_a_fall_from_8_to_minus_3_is_falling_not_flat():
    # T5: the old first-vs-last-quarter noise test called this (and -100% falls) "flat"
    records = [{"step": i + 1, "rewards/total/mean": v} for i, v in enumerate(F_REWARD)]
    trend = trend_of(records, "rewards/total/mean")
    assert trend.direction == "falling"
    accuracy = [{"step": i + 1, "accuracy/train": v} for i, v in
                enumerate([0.23, 0.0, 0.0, 0.45, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])]
    # 12 points whose first quarter is 0.23, 0, 0: short quarters no longer decide a direction (review 4's V2:
    # by chance they did for 37% of 8-step noise); the fall is not called flat
    assert trend_of(accuracy, "accuracy/train").direction in ("falling", "unclear")


def test_flat_is_only_said_of_a_series_that_did_not_move():
    from mlx_grpo.telemetry.metrics.robust import verdict

    rng = np.random.default_rng(2)
    steps = np.arange(1, 201)
    assert verdict(steps, 8.5 + rng.normal(0, 0.25, 200)).direction == "flat"
    # moved a lot, but back and forth: not "flat", and not a trend either
    wild = np.r_[rng.normal(5, 3, 10), rng.normal(8, 3, 10)][rng.permutation(20)]
    wild[-5:] += 4
    v = verdict(np.arange(20), wild)
    assert v.direction in ("unclear", "rising")
    assert verdict(steps, 5 + 0.02 * steps + rng.normal(0, 0.3, 200)).direction == "rising"


def test_percent_change_is_the_change():
    from mlx_grpo.telemetry.metrics.robust import percent_change

    assert percent_change(0.0, 0.2344) == "-100%"
    assert percent_change(0.5, 0.25) == "+100%"
    assert percent_change(0.3, 0.0) == "+0.3"


def _fire(records, rules=None):
    return AlertEngine(rules or default_rules()).check_all(records)


def test_an_accuracy_collapse_says_minus_100_percent():
    # T10: it said "-94%" (the fall divided by min_scale 0.25) for a fall from 0.2344 to 0
    records = [{"step": 0, "eval/accuracy": 0.32},
               {"step": 1, "accuracy/train": 0.2344}, {"step": 2, "accuracy/train": 0.0},
               {"step": 3, "accuracy/train": 0.0}]
    [alert] = [a for a in _fire(records) if a.rule == "accuracy_collapse"]
    assert alert.step == 3 and "(-100%, step 1)" in alert.message


def test_a_reward_collapse_in_the_first_steps_is_seen():
    # T4: reward 7.8 then -3.0 for 14 steps raised nothing; a task with no correctness check was unprotected
    records = [{"step": 1, "rewards/total/mean": 7.8}] + [{"step": s, "rewards/total/mean": -3.0}
                                                          for s in range(2, 16)]
    fired = [a for a in _fire(records) if a.rule == "reward_collapse"]
    assert [a.step for a in fired] == [3] and fired[0].action == "stop"
    assert "-138%" in fired[0].message


def test_a_healthy_noisy_start_does_not_collapse():
    rng = np.random.default_rng(3)
    records = [{"step": s, "rewards/total/mean": 5.0 + 0.02 * s + rng.normal(0, 0.4)} for s in range(1, 60)]
    assert not [a for a in _fire(records) if a.rule == "reward_collapse"]


def test_held_out_accuracy_falling_is_named():
    # T15: review 3's D3, held-out 32% -> 12.5% at step 20, raised nothing
    records = [{"step": 0, "eval/accuracy": 0.32}, {"step": 10, "eval/accuracy": 0.28},
               {"step": 20, "eval/accuracy": 0.125}, {"step": 30, "eval/accuracy": 0.20}]
    fired = [a for a in _fire(records) if a.rule == "heldout_accuracy_drop"]
    assert [a.step for a in fired] == [20]
    assert "-61%" in fired[0].message
    rising = [{"step": s, "eval/accuracy": v} for s, v in zip(range(0, 201, 20),
                                                               [0.32, 0.4, 0.45, 0.5, 0.55, 0.5, 0.6, 0.65, 0.7,
                                                                0.72, 0.74])]
    assert not [a for a in _fire(rising) if a.rule == "heldout_accuracy_drop"]


def _entropy_rule():
    return [r for r in default_rules() if r.name == "entropy_collapse"]


def _entropy_run(reward):
    # the SmolLM2 recipe's shape: entropy 1.96 -> 0.19 nats in 14 steps
    entropy = np.linspace(1.96, 0.19, 15)
    return [{"step": s, "policy/entropy": float(e), "rewards/total/mean": float(r)}
            for s, (e, r) in enumerate(zip(entropy, reward), start=1)]


def test_entropy_falling_while_the_reward_is_flat_is_a_collapse_named_before_the_floor():
    rng = np.random.default_rng(4)
    alerts = _fire(_entropy_run(0.33 + rng.normal(0, 0.02, 15)), _entropy_rule())
    # named at step 11 of 15, at half its start (rldoctor's projection names it at step 9, at 63%, and names
    # the measured healthy default run too, at step 53, where this rule waits for entropy to halve)
    assert alerts and alerts[0].level == "warning" and alerts[0].step <= 11
    assert "reaches 10% of its start in about" in alerts[0].message and "not rising" in alerts[0].message


def test_entropy_falling_while_the_reward_climbs_is_convergence():
    # conditional firing: the same fall with the reward rising is the policy committing to what it learned
    alerts = _fire(_entropy_run(np.linspace(2.0, 6.0, 15)), _entropy_rule())
    assert alerts and all(a.level == "info" and a.action == "none" for a in alerts)
    assert "converging" in alerts[0].message


# Measured: the thinking recipe (configs/qwen_think.yaml, seed 0). Held-out accuracy on 32 sums went 38% ->
# 62% (step 6) -> 69% (step 12) while entropy fell to a tenth of its start as the model settled on working the
# sums out; sampled accuracy on 16 completions a step was too noisy to show a trend.
THINKING_RUN = {
    "policy/entropy": [0.267, 0.202, 0.122, 0.094, 0.127, 0.081, 0.058, 0.039, 0.023, 0.039, 0.032, 0.046],
    "accuracy/train": [0.06, 0.75, 0.31, 0.38, 0.56, 0.25, 0.62, 0.62, 0.38, 0.5, 0.62, 0.38],
    "rewards/total/mean": [0.12, 1.38, 0.62, 0.75, 1.12, 0.5, 1.2, 1.25, 0.75, 1.0, 1.25, 0.75],
}


def _thinking_records(heldout):
    records = [{"step": 0, "eval/accuracy": heldout[0], "eval/num_samples": 32.0}]
    for step in range(1, 13):
        record = {"step": step, **{name: values[step - 1] for name, values in THINKING_RUN.items()}}
        if step in (6, 12):
            record.update({"eval/accuracy": heldout[step // 6], "eval/num_samples": 32.0})
        records.append(record)
    return records


def test_entropy_falling_while_held_out_accuracy_rose_on_two_evaluations_is_convergence():
    # two evaluations are too few for a trend; 38% -> 62% of 32 rows is 2 standard errors
    alerts = _fire(_thinking_records([0.375, 0.625, 0.6875]), _entropy_rule())
    assert alerts and all(a.level == "info" for a in alerts)
    assert "; eval/accuracy still rising" in alerts[0].message and "converging" in alerts[0].message  # it alone
    # the same run with held-out accuracy flat is still a collapse worth a warning
    flat = _fire(_thinking_records([0.375, 0.40625, 0.375]), _entropy_rule())
    assert flat and flat[0].level == "warning" and "not rising" in flat[0].message


def test_a_recent_share_judges_the_median_of_the_last_values():
    from mlx_grpo.telemetry.alerts.rules import ThresholdRule

    rule = ThresholdRule(name="z", metric="m", op=">=", value=0.5, recent=5, share=0.6, cooldown=0)
    values = [0.9, 0.1, 0.1, 0.9, 0.1, 0.9, 0.9, 0.1, 0.1]
    records = [{"step": i + 1, "m": v} for i, v in enumerate(values)]
    # step 1: one of one; steps 2-6: never a majority; step 7: 3 of the last 5; an odd 0.1 at 8 keeps it; 9: 2 of 5
    assert [a.step for a in _fire(records, [rule])] == [1, 7]


def test_the_last_line_of_a_hacked_run_says_hacking():
    # T2: review 3's H-hack ended "...; reward functions' quality 95/100" and never said "hacking"
    from synthetic_runs import Faults, simulate

    from mlx_grpo.telemetry.analysis.reward_report import analyze_run

    metrics, samples = simulate(150, 1, Faults(fault_step=30, length_reward=True))
    report = analyze_run(metrics, samples)
    assert report.hacking.suspected
    line = report.last_line()
    assert "but possible reward hacking: " in line and line.startswith(report.outcome.headline())


def test_one_reward_up_while_the_total_is_flat_is_not_hacking():
    # T14: review 3's X: answer_check (the correctness reward's partial credit) rose -0.98 -> -0.83 while the
    # total was flat and exact accuracy 0: called "possible reward hacking"
    from mlx_grpo.telemetry.analysis.reward_report import analyze_run

    rng = np.random.default_rng(5)
    records = []
    for s in range(1, 15):
        answer = -0.98 + 0.15 * s / 14 + rng.normal(0, 0.01)
        judge = 3.6 - 0.15 * s / 14 + rng.normal(0, 0.01)
        records.append({"step": s, "rewards/answer_check/mean": answer, "rewards/judge/mean": judge,
                        "rewards/total/mean": answer + judge, "accuracy/train": 0.0})
    records += [{"step": 0, "eval/accuracy": 0.0}, {"step": 14, "eval/accuracy": 0.0}]
    report = analyze_run(records)
    assert not report.hacking.suspected, report.hacking.findings
    assert report.last_line().endswith("but the task did not improve")
    assert "held-out accuracy 0.0% -> 0.0% (+0.0 points)" in report.last_line()


def test_peer_metrics_terminated_lengths_and_running_token_count():
    # TRL's completions/*_terminated_length and num_tokens
    from step_data_builder import make_step_data

    from mlx_grpo.telemetry.metrics.step_data import step_record
    from mlx_grpo.telemetry.recorder import RunRecorder

    lengths = np.array([4.0, 9.0, 24.0, 24.0] * 4)
    truncated = np.array([False, False, True, True] * 4)
    record = step_record(make_step_data(lengths=lengths, truncated=truncated))
    assert (record["completions/terminated_length/mean"], record["completions/terminated_length/min"],
            record["completions/terminated_length/max"]) == (6.5, 4.0, 9.0)
    assert "completions/terminated_length/mean" not in step_record(make_step_data(truncated=np.ones(16, bool)))
    recorder = RunRecorder(["fmt", "ans"], [])
    first = recorder.record_step(make_step_data(step=1)).record
    second = recorder.record_step(make_step_data(step=2, seed=1)).record
    assert second["tokens/cumulative"] == first["tokens/total"] + second["tokens/total"]
    resumed = RunRecorder(["fmt", "ans"], [])
    resumed.load_state_dict(recorder.state_dict())
    assert resumed.record_step(make_step_data(step=3)).record["tokens/cumulative"] == \
        second["tokens/cumulative"] + first["tokens/total"]


def test_clip_extremes_over_completions_and_a_kl_that_is_never_negative():
    import mlx.core as mx

    from mlx_grpo import grpo

    logp = mx.log(mx.array([[0.5, 0.5], [0.5, 0.5]]))
    old = mx.log(mx.array([[0.5, 0.5], [0.2, 0.2]]))  # completion 2's ratio 2.5: past 1 + epsilon
    stats = grpo.policy_stats(logp, old, None, mx.array([1.0, 1.0]), mx.ones((2, 2)))
    assert float(stats["clip_frac_high_max"]) == 1.0 and float(stats["clip_frac_low_min"]) == 0.0
    assert float(stats["clip_frac_high"]) == 0.5
    # T11: at a learning rate near 0 the policy and reference differ by rounding; k3 read -1e-10, it is >= 0
    rng = np.random.default_rng(6)
    base = rng.uniform(-3, -0.1, 10000).astype(np.float32)
    nudged = base + rng.uniform(-1e-6, 1e-6, 10000).astype(np.float32)
    assert float(grpo.kl_k3(mx.array(base), mx.array(nudged)).min()) >= 0.0


def test_sampled_held_out_metrics_are_opt_in_and_count_what_they_name():
    # verl's mean@N / best@N: N completions per held-out prompt at the run's temperature
    from pathlib import Path

    from mlx_grpo.config.train_config import load_config
    from mlx_grpo.telemetry.metrics.step_data import eval_record
    from mlx_grpo.trainer import Trainer

    record = eval_record([True, False], [None, None], 1.0, [[True, False, False], [False, False, False]])
    assert record["eval/mean@3"] == pytest.approx(1 / 6) and record["eval/pass@3"] == 0.5
    assert "eval/mean@3" not in eval_record([True], [None], 1.0)
    config = load_config(None, {"batch_size": 2, "num_generations": 3, "max_generation_steps": 6, "eval_size": 5,
                                "eval_samples": 3})
    record = Trainer.build(config, Path.cwd()).evaluate()
    assert record["eval/num_samples"] == 5 and 0 <= record["eval/mean@3"] <= record["eval/pass@3"] <= 1


# think8-s0, the thinking recipe's seed 0 (12 steps of 16 completions): its total reward and train accuracy
THINK_REWARD = [0.275, 0.625, 0.712, 1.294, 1.269, 0.775, 1.325, 0.575, 0.8, 1.575, 1.506, 0.838]
THINK_TRAIN = [0.188, 0.438, 0.5, 0.875, 0.812, 0.5, 0.812, 0.375, 0.5, 1.0, 0.938, 0.5]


def _think_run(heldout_end: float) -> list[dict]:
    records = [{"step": s + 1, "rewards/total/mean": r, "rewards/answer_in_form/mean": r, "accuracy/train": a}
               for s, (r, a) in enumerate(zip(THINK_REWARD, THINK_TRAIN))]
    records[-1].update({"eval/accuracy": heldout_end, "eval/num_samples": 32.0})
    return [{"step": 0, "eval/accuracy": 0.34375, "eval/num_samples": 32.0}, *records]


def test_a_held_out_rise_clears_a_run_whose_train_accuracy_is_noise():
    # the run ended "held-out accuracy 34.4% -> 84.4% (+50.0 points) ... but possible reward hacking: rewards/total/mean
    # rose +143% while accuracy did not improve (accuracy/train unclear +0.438)"
    from mlx_grpo.telemetry.analysis.reward_report import analyze_run

    report = analyze_run(_think_run(0.84375))
    assert report.trends["rewards/total/mean"].direction == "rising"
    assert report.trends["accuracy/train"].direction == "unclear"
    assert not report.hacking.suspected, report.hacking.findings
    assert "eval/accuracy 0.344 -> 0.844" in report.hacking.verdict
    assert "hacking" not in report.last_line()


def test_a_held_out_move_within_noise_does_not_clear_a_rising_reward():
    # 11 -> 13 right of 32 is no evidence of correctness: the rising reward stays unexplained
    from mlx_grpo.telemetry.analysis.reward_report import analyze_run

    report = analyze_run(_think_run(0.40625))
    assert report.hacking.suspected
    assert report.hacking.accuracy["eval/accuracy"].direction == "flat"
