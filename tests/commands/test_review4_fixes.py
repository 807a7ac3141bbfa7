"""Review 4's V1-V9, each as the reproduction the review gave (engine, verdict, report or a short real run)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from mlx_grpo.config.train_config import load_config
from mlx_grpo.run.loop import train
from mlx_grpo.telemetry.alerts.config import default_rules
from mlx_grpo.telemetry.alerts.engine import AlertEngine
from mlx_grpo.telemetry.analysis.reward_report import analyze_run, detect_reward_hacking, trend_of
from mlx_grpo.telemetry.metrics.charts import tensorboard_layout
from mlx_grpo.telemetry.metrics.robust import verdict
from mlx_grpo.update import pass_statistic

DATA = Path(__file__).parents[1] / "data"


def alerts_of(records):
    return [(a.step, a.rule, a.level) for a in AlertEngine(default_rules()).check_all(records)]


def test_v1_a_reward_that_broke_on_a_half_solved_task_is_a_warning_not_the_task_learnt():
    records = [{"step": s, "rewards/zero_std_group_frac": 0.55, "accuracy/solved_group_frac": 0.5,
                "policy/grad_norm": 0.4, "rewards/total/std": 1.0, "rewards/total/mean": 2.0} for s in range(1, 21)]
    records += [{"step": s, "rewards/zero_std_group_frac": 1.0, "accuracy/solved_group_frac": 0.5,
                 "policy/grad_norm": 0.0, "rewards/total/std": 0.0, "rewards/total/mean": 2.0} for s in range(21, 36)]
    fired = alerts_of(records)
    assert {(rule, level) for _, rule, level in fired if rule in ("zero_std_groups", "zero_gradient",
                                                                   "vanishing_gradient")} >= {
        ("zero_std_groups", "warning"), ("zero_gradient", "warning")}


def test_v1_the_solved_gemma_run_keeps_its_infos():
    records = [json.loads(line) for line in (DATA / "run_gemma_larger_solved.jsonl").read_text().splitlines()]
    assert all(level == "info" for _, rule, level in alerts_of(records) if rule != "heldout_accuracy_drop")


def test_v2_the_trend_verdict_calls_8_step_noise_rising_or_falling_under_5_percent():
    rng = np.random.default_rng(0)
    runs = 2000
    moved = sum(verdict(np.arange(1, 9), rng.binomial(128, 0.3, 8) / 128).direction in ("rising", "falling")
                for _ in range(runs))
    assert moved / runs < 0.05  # these 2,000: 4.2%; 3.6% over 20,000 other draws (f9cda40: 37%)


def test_v2_quiet_short_runs_rarely_end_with_possible_reward_hacking():
    rng = np.random.default_rng(2)
    runs, hacked = 200, 0
    for _ in range(runs):
        records = []
        for step in range(1, 9):
            accuracy = rng.binomial(128, 0.3) / 128
            answer, fmt = 3 * accuracy - (1 - accuracy), 1.5 + rng.normal(0, 0.15)
            records.append({"step": step, "accuracy/train": accuracy, "rewards/answer_check/mean": answer,
                            "rewards/format/mean": fmt, "rewards/total/mean": answer + fmt})
        hacked += detect_reward_hacking(records).suspected
    assert hacked / runs < 0.03  # these 200: 4 (2%); 7 of 1,000 other draws (0.7%); f9cda40: 27 of 300 (9%)


def test_v3_one_wild_step_is_not_a_length_trend():
    records = [{"step": s, "completions/length/mean": 19.0 if s == 10 else 11.0} for s in range(1, 41)]
    assert [r for _, r, _ in alerts_of(records) if r == "length_growth"] == []
    rising = [{"step": s, "completions/length/mean": 11.0 + (0.0 if s < 10 else 0.8 * (s - 9))} for s in range(1, 41)]
    assert [s for s, r, _ in alerts_of(rising) if r == "length_growth"][:1] == [15]  # a real rise: 6 steps in


def test_v4_the_report_of_a_solved_run_does_not_call_its_flat_groups_a_fault():
    records = [json.loads(line) for line in (DATA / "run_gemma_larger_solved.jsonl").read_text().splitlines()]
    report = analyze_run(records)
    assert not any("taught nothing" in issue for issue in report.quality.issues)
    assert report.quality.score >= 60  # f9cda40: 45


def test_v5_a_noisy_collapse_is_still_a_collapse():
    records = [{"step": 1, "rewards/total/mean": 7.8, "rewards/total/mean_stderr": 0.4}]
    records += [{"step": s, "rewards/total/mean": -3.0, "rewards/total/mean_stderr": 4.0} for s in range(2, 16)]
    assert (3, "reward_collapse", "error") in alerts_of(records)


def test_v6_no_percentage_from_a_start_near_zero():
    values = [0.05, 0.03, 0.04, 0.05, -0.1, -0.2, -0.25, -0.27]
    trend = trend_of([{"step": s, "rewards/answer_check/mean": v} for s, v in enumerate(values, 1)],
                     "rewards/answer_check/mean")
    assert trend.percent == "" and trend.relative_change is not None


def test_v7_the_clip_extremes_are_extremes_over_the_passes_not_their_mean():
    # pass 1 never clips; pass 2 clipped every token of one completion
    high = pass_statistic("clip_frac_high_max", pass_statistic("clip_frac_high_max", None, 0.0, 2, 0), 1.0, 2, 1)
    low = pass_statistic("clip_frac_low_min", pass_statistic("clip_frac_low_min", None, 0.0, 2, 0), 0.3, 2, 1)
    mean = pass_statistic("clip_frac", pass_statistic("clip_frac", None, 0.0, 2, 0), 0.5, 2, 1)
    assert (high, low, mean) == (1.0, 0.3, 0.25)


def test_v8_the_newer_metrics_are_in_tensorboards_layout():
    patterns = [p for section in tensorboard_layout().values() for chart in section.values() for p in chart[1]]
    for name in ("completions/terminated_length/mean", "policy/clip_frac_low_min", "policy/clip_frac_high_max",
                 "tokens/cumulative", "eval/mean@4", "eval/pass@4", "rewards/total/variance", "epoch/reward/mean"):
        assert any(re.match(p, name) for p in patterns), name


def test_v9_a_collapse_stop_says_how_to_start_again_and_a_resume_stops_again(tmp_path, capsys):
    # a rule with a remedy that holds from the first step: a stand-in for reward_collapse
    (tmp_path / "collapse.yaml").write_text(
        "rules:\n  - {name: broke, kind: threshold, metric: rewards/total/mean, op: '>', value: -1000,\n"
        "     for_steps: 2, action: stop, remedy: {learning_rate: 0.5}, hint: stand-in collapse}\n")
    overrides = {"num_steps": 6, "batch_size": 2, "num_generations": 4, "num_iterations": 1, "train_size": 8,
                 "eval_every": 0, "checkpoint_every": 0, "tensorboard": False, "learning_rate": 1e-4,
                 "monitoring_dir": str(tmp_path / "runs"), "run_name": "broke",
                 "alerts_file": str(tmp_path / "collapse.yaml")}
    result = train(load_config(None, overrides), tmp_path)
    run_dir = Path(result["run_dir"])
    assert result["status"] == "interrupted" and result["stopped_by_alert"] == "broke"
    line = [row for row in capsys.readouterr().err.splitlines() if "action: stop" in row][0]
    assert ("the policy broke, and its only checkpoint holds the broken policy (a resume would stop again); start "
            "the run again with a lower learning rate (--learning-rate 5e-05), or with --on-alert rollback") in line
    # f9cda40 restored the stop's latch from the checkpoint: the resumed broken policy trained on in silence
    again = train(load_config(None, overrides), tmp_path, resume_dir=run_dir)
    assert again["status"] == "interrupted" and again["stopped_by_alert"] == "broke"
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
