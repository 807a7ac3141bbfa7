"""format_gaming, repetition and bimodal_reward: each fires on its pathology and stays silent on healthy runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from synthetic_runs import Faults, simulate

from mlx_grpo.telemetry.alerts.config import default_rules
from mlx_grpo.telemetry.alerts.engine import AlertEngine
from mlx_grpo.telemetry.metrics.step_data import bimodality, repetition_rate, text_metrics

DATA = Path(__file__).parents[1] / "data"
DETECTORS = ("format_gaming", "repetition", "bimodal_reward")


def fired(records) -> list[tuple[int, str]]:
    return [(a.step, a.rule) for a in AlertEngine(default_rules()).check_all(records) if a.rule in DETECTORS]


@pytest.mark.parametrize("faults, rule, by", [
    (Faults(fault_step=40, format_gaming=True), "format_gaming", 75),  # the formats reach their ceiling at 50
    (Faults(fault_step=40, repetition=True), "repetition", 60),  # 0.3 is passed at step ~54
    (Faults(fault_step=40, graded=True, bimodal=True), "bimodal_reward", 50),
])
def test_each_detector_fires_on_its_pathology_and_nothing_else_of_the_three(faults, rule, by):
    for seed in range(5):
        alerts = fired(simulate(100, seed, faults, shape_metrics=True)[0])
        assert alerts and alerts[0][1] == rule and 40 <= alerts[0][0] <= by, (seed, alerts)
        assert {r for _, r in alerts} == {rule}


@pytest.mark.parametrize("shape", [{}, {"graded": True}])
def test_healthy_synthetic_runs_raise_none_of_them(shape):
    for seed in range(10):
        assert fired(simulate(150, seed, Faults(**shape), shape_metrics=True)[0]) == []


@pytest.mark.parametrize("name", sorted(p.stem for p in DATA.glob("run_*.jsonl") if p.stem != "run_length_reward"))
def test_the_stored_runs_raise_none_of_them(name):
    records = [json.loads(line) for line in (DATA / f"{name}.jsonl").read_text().splitlines()]
    assert fired(records) == []


def test_the_stored_length_reward_run_is_named_format_gaming_on_its_length_reward():
    # a reward paying 0.1 per character: length_pay climbed to its ceiling while accuracy fell (review 3's D3)
    records = [json.loads(line) for line in (DATA / "run_length_reward.jsonl").read_text().splitlines()]
    alerts = [a for a in AlertEngine(default_rules()).check_all(records) if a.rule == "format_gaming"]
    assert [(a.step, a.metric) for a in alerts] == [(38, "rewards/length_pay/mean")]
    assert "remedy: lower its weight" in alerts[0].message


def test_repetition_rate_counts_repeated_word_trigrams():
    # 18 trigrams, one twice ("5 < /" closes both tags)
    assert repetition_rate("<reasoning>2 + 3 = 5</reasoning><answer>5</answer>") == pytest.approx(1 / 18)
    assert repetition_rate("the cat the cat the cat the cat") == pytest.approx(1 - 2 / 6)
    assert repetition_rate("too short") is None
    assert text_metrics(["a b c d e f", "x y"]) == {"completions/repetition_rate": 0.0}
    assert text_metrics(["hi"]) == {}


def test_bimodality_coefficient_tells_one_cluster_from_two():
    rng = np.random.default_rng(0)
    one = np.mean([bimodality(rng.normal(0, 1, 128)) for _ in range(50)])
    two = np.mean([bimodality(np.r_[rng.normal(3, 0.5, 64), rng.normal(9, 0.3, 64)]) for _ in range(50)])
    assert one == pytest.approx(1 / 3, abs=0.03) and two > 0.85
    assert bimodality(np.ones(8)) is None and bimodality(np.arange(3.0)) is None


def test_a_real_run_logs_the_repetition_rate_and_the_bimodality(default_run):
    records = [r for r in default_run[1] if "rewards/total/mean" in r]  # not the evaluation before step 1
    rates = [r["completions/repetition_rate"] for r in records]
    assert len(rates) == len(records) and all(0 <= r < 0.15 for r in rates)  # far below the rule's start_below
    assert all(0 < r["rewards/total/bimodality"] <= 1.5 for r in records if r["rewards/total/std"] > 0)
