"""The alert engine, the built-in GRPO rules and the YAML rule files."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
import time
from functools import lru_cache
from pathlib import Path

import pytest
from rich.console import Console
from synthetic_runs import Faults, simulate

from mlx_grpo.common.errors import UserError
from mlx_grpo.telemetry.alerts.alert import Alert
from mlx_grpo.telemetry.alerts.config import default_rules, load_alert_rules, rules_from_config
from mlx_grpo.telemetry.alerts.console import format_alert, print_alerts
from mlx_grpo.telemetry.alerts.engine import AlertEngine
from mlx_grpo.telemetry.alerts.nonfinite_rule import NonFiniteRule
from mlx_grpo.telemetry.alerts.rules import BaselineRule, DropRule, SpikeRule, ThresholdRule
from mlx_grpo.telemetry.alerts.trend_rules import HackingRule, TrendRule
from mlx_grpo.telemetry.metrics.other_names import canonical_record

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parents[1] / "data"


@lru_cache(maxsize=None)
def _run(steps: int, seed: int, fault: str | None = None, fault_step: int = 100, **shape):
    faults = Faults(fault_step=fault_step, **({fault: True} if fault else {}))
    return simulate(steps, seed, faults, **shape)[0]


def _replay(records, rules=None) -> list[Alert]:
    return AlertEngine(default_rules() if rules is None else rules).check_all(records)


def _records(values, name="m", start=1):
    return [{"step": start + i, "time": 1000.0 + i, name: v} for i, v in enumerate(values)]


# --------------------------------------------------------------------------- built-in rules

@pytest.mark.parametrize("seed", range(6))
def test_builtin_rules_raise_no_warning_on_a_healthy_run(seed):
    # Shaped like the measured default run: format rewards often constant for a step,
    # a rare 10x gradient spike, slow improvement. Those earn info alerts at most.
    alerts = _replay(_run(300, seed))
    assert [a for a in alerts if a.level != "info"] == [], [f"{a.step} {a.rule}: {a.message}" for a in alerts]
    assert {a.rule for a in alerts} <= {"constant_reward", "grad_norm_spike", "reward_stagnation", "entropy_collapse"}


@pytest.mark.parametrize("seed", range(4))
def test_builtin_rules_are_silent_on_a_run_that_learns_with_varied_rewards(seed):
    # No constant reward, no gradient spike, clear progress: not even an info alert.
    alerts = _replay(_run(300, seed, accuracy_gain=0.35, format_rate=0.9, grad_spike_rate=0.0))
    assert alerts == [], [f"{a.step} {a.rule}: {a.message}" for a in alerts]


# (fault, rule that must fire, earliest step, latest step); fault_step is 100.
FAULTS = [
    ("constant_reward", "zero_std_groups", 1, 10),
    ("constant_reward", "constant_reward", 1, 10),
    ("nan_loss", "non_finite", 100, 100),
    ("kl_blowup", "kl_drift", 100, 108),
    ("entropy_collapse", "entropy_collapse", 100, 102),
    ("length_reward", "length_growth", 100, 130),
    ("length_reward", "completions_truncated", 100, 150),
    ("length_reward", "reward_hacking", 100, 145),
    ("grad_spike", "grad_norm_spike", 100, 100),
    ("throughput_drop", "throughput_drop", 100, 110),
    ("memory_high", "accel_memory_high", 100, 102),
    ("system_memory_high", "system_memory_high", 100, 103),
    ("cache_held_high", "accel_held_high", 100, 103),
    ("memory_pressure", "memory_pressure_high", 100, 103),
    ("collapse", "reward_collapse", 100, 102),
    ("collapse", "accuracy_collapse", 100, 102),
    ("stagnant", "not_learning", 150, 180),
    ("stagnant", "reward_stagnation", 150, 175),
    ("rare_success", "low_signal_to_noise", 1, 60),
    ("takeover", "reward_takeover", 100, 175),
    ("clip_saturation", "clip_saturation", 100, 102),
    ("zero_gradient", "zero_gradient", 100, 105),
    ("zero_gradient", "vanishing_gradient", 100, 102),
    ("kl_blowup", "kl_high", 100, 106),
    ("length_reward", "heldout_accuracy_drop", 100, 250),
]


@pytest.mark.parametrize("fault,rule,earliest,latest", FAULTS)
def test_each_builtin_rule_fires_on_its_fault(fault, rule, earliest, latest):
    alerts = [a for a in _replay(_run(250, 1, fault)) if a.rule == rule]
    assert alerts, f"{rule} did not fire on {fault}"
    assert earliest <= alerts[0].step <= latest, alerts[0]
    assert alerts[0].message.startswith(alerts[0].metric.split("=")[0]) or rule == "non_finite"


def _measured(name: str) -> list[dict]:
    """Metric records of real runs of the shipped model (the metrics the rules watch), read as every reader
    reads a run directory: names of the version that wrote them become today's."""
    return [canonical_record(json.loads(line)) for line in (DATA / name).read_text().splitlines()]


def test_measured_default_run_raises_no_warning():
    alerts = _replay(_measured("run_default_healthy.jsonl"))
    assert [a for a in alerts if a.level != "info"] == []
    assert {(a.step, a.rule) for a in alerts} == {(85, "grad_norm_spike"), (134, "constant_reward")}


def test_measured_length_paying_reward_is_caught_within_a_few_steps():
    # A reward of 0.5 per character next to the built-in ones: lengths start to climb at
    # step 22 and hit the 24-token limit by step 28; accuracy falls to 0.
    first: dict[str, int] = {}
    for alert in _replay(_measured("run_length_reward.jsonl")):
        first.setdefault(alert.rule, alert.step)
    assert min(first.values()) >= 22
    assert first["reward_hacking"] <= 24 and first["length_growth"] <= 26
    assert first["completions_truncated"] <= 31 and first["kl_drift"] <= 35


def _growing_lengths(accuracy):
    lengths = [60, 61, 59, 62, 66, 70, 75, 79, 84, 88, 93, 97]  # +60% over 12 steps, the tool recipe's shape
    return [{"step": i, "completions/length/mean": n, "accuracy/train": a}
            for i, (n, a) in enumerate(zip(lengths, accuracy))]


def test_lengths_that_grow_while_accuracy_rises_are_learning_not_rambling():
    # The tool recipe: calling the calculator and restating its result makes trajectories longer as accuracy
    # climbs from 0.3 to 0.96. The same lengths with accuracy flat are the rambling the rule is for.
    rising = [0.3, 0.31, 0.35, 0.4, 0.45, 0.56, 0.6, 0.7, 0.8, 0.85, 0.9, 0.96]
    assert [a.rule for a in _replay(_growing_lengths(rising)) if a.rule == "length_growth"] == []
    flat = [0.4, 0.42, 0.39, 0.41, 0.4, 0.38, 0.41, 0.4, 0.42, 0.39, 0.4, 0.41]
    assert [a.rule for a in _replay(_growing_lengths(flat)) if a.rule == "length_growth"] == ["length_growth"]


def test_thinking_that_grows_after_accuracy_rose_is_not_rambling():
    # Measured: the thinking recipe on sums of three numbers (README attempt 11, seed 0), 16 completions a
    # step. The model learnt to work each sum pair by pair: sampled accuracy 19-50% over steps 1-5, 69-75%
    # over steps 6-9, then one bad batch; its completions grew from 52-78 to 94-96 tokens. The rise then the
    # bad batch leave no monotone accuracy trend, but the later steps are right far more often: learning, not
    # rambling.
    lengths = [52, 78, 77, 60, 54, 79, 94, 96, 94, 96]
    accuracy = [0.31, 0.19, 0.5, 0.38, 0.19, 0.75, 0.75, 0.75, 0.69, 0.31]
    records = [{"step": i + 1, "completions/length/mean": n, "accuracy/train": a}
               for i, (n, a) in enumerate(zip(lengths, accuracy))]
    assert [a.rule for a in _replay(records) if a.rule == "length_growth"] == []
    for record, a in zip(records, [0.31, 0.19, 0.5, 0.38, 0.19, 0.44, 0.25, 0.31, 0.38, 0.31]):
        record["accuracy/train"] = a  # the same lengths with accuracy that never moved
    assert [a.rule for a in _replay(records) if a.rule == "length_growth"] == ["length_growth"]


def test_measured_constant_reward_warns_from_step_2():
    # Every group on one score from the first step: no gradient (grad_norm exactly 0) and the policy never
    # leaves the reference (KL 0). Named at step 2 (was 5), the empty updates at 2, the frozen policy at 8.
    alerts = [a for a in _replay(_measured("run_constant_reward.jsonl")) if a.level != "info"]
    assert [(a.step, a.rule) for a in alerts] == [(2, "zero_std_groups"), (2, "zero_gradient"), (8, "kl_flat")]


def test_measured_collapse_after_a_learning_rate_raise_is_caught_in_two_steps():
    # The default run to step 200, resumed with learning rate 3e-3 (constant): reward 8.0 -> 4.9 -> 4.4 and
    # accuracy 0.55 -> 0.05 -> 0.00 at steps 202-203. Both collapse rules fire at the second collapsed step,
    # neither before.
    alerts = _replay(_measured("run_lr_raised_collapse.jsonl"))
    collapse = [(a.step, a.rule, a.level) for a in alerts if a.rule in ("reward_collapse", "accuracy_collapse")]
    assert collapse == [(203, "reward_collapse", "error"), (203, "accuracy_collapse", "error")]
    assert "fell to 4.422 from its recent median 8.018 (-45%" in next(a.message for a in alerts
                                                                      if a.rule == "reward_collapse")


def test_measured_frozen_run_is_reported_as_frozen_and_not_learning_and_nothing_else():
    # The default run at learning rate 1e-9: nothing moves. Sampled accuracy still swings 0.2-0.6 from batch
    # to batch, which is why the rule needs 150 steps to be sure.
    alerts = _replay(_measured("run_not_learning.jsonl"))
    warnings = [(a.step, a.rule) for a in alerts if a.level != "info"]
    # the frozen policy shows first in its KL to the reference: ~0 for 8 steps (the default run: 4e-4 at step 2)
    assert warnings == [(8, "kl_flat"), (150, "not_learning")]
    message = next(a.message for a in alerts if a.rule == "not_learning")
    assert message.startswith("rewards/total/mean, accuracy/train and rewards/zero_std_group_frac have not moved")


def test_a_run_that_learned_and_levelled_off_is_not_reported_as_not_learning():
    # The measured default run is nearly flat after step 100 (reward 7.8-8.0), but no longer where it began.
    rules = [r for r in default_rules() if r.name == "not_learning"]
    assert _replay(_measured("run_default_healthy.jsonl"), rules) == []
    flat_from_the_start = [{"step": s, "rewards/total/mean": 7.3, "accuracy/train": 0.38,
                            "rewards/zero_std_group_frac": 0.1} for s in range(1, 151)]
    assert [a.step for a in _replay(flat_from_the_start, rules)] == [150]
    learned = [{**r, "rewards/total/mean": 6.0 if r["step"] <= 20 else 7.3} for r in flat_from_the_start]
    assert _replay(learned, rules) == []


def test_action_stop_is_carried_by_the_alert_and_written_only_when_set():
    stop = ThresholdRule(name="s", metric="m", op=">", value=1, action="stop")
    quiet = ThresholdRule(name="q", metric="m", op=">", value=1)
    alerts = AlertEngine([stop, quiet]).check({"step": 1, "m": 2.0})
    assert [(a.rule, a.action) for a in alerts] == [("s", "stop"), ("q", "none")]
    assert alerts[0].to_dict()["action"] == "stop" and "action" not in alerts[1].to_dict()
    assert Alert.from_dict(alerts[0].to_dict()) == alerts[0]
    # Stopping does not change what a rule measures: its saved state still matches on resume.
    assert repr(stop).replace("'s'", "'q'") == repr(quiet)


def test_drop_rule_compares_with_the_median_so_a_lasting_collapse_fires_once():
    rule = DropRule(name="d", metric="m", window=5, fall=0.5, relative=True, min_scale=1, for_steps=2)
    values = [8.0, 8.2, 7.9, 8.1, 8.0, 3.0, 2.5, 2.0, 2.0, 2.0]
    alerts = _replay(_records(values), [rule])
    assert [a.step for a in alerts] == [7]  # two collapsed steps; the median still remembers the level
    jump = DropRule(name="u", metric="m", window=3, fall=1.0, direction="up")
    assert [(a.step, a.message.split(" (")[0]) for a in _replay(_records([1.0, 1.2, 0.9, 3.0]), [jump])] == [
        (4, "m jumped to 3 from its recent median 1")]


def test_every_builtin_rule_has_a_fault_that_fires_it():
    covered = {rule for _, rule, _, _ in FAULTS} | {"non_finite", "kl_flat"}
    covered |= {"tool_calls_dying", "tool_calls_failing"}  # tests/multiturn/test_multiturn.py fires each
    # their faults: tests/telemetry/test_detectors.py and tests/telemetry/test_mac_state.py
    covered |= {"format_gaming", "repetition", "bimodal_reward", "thermal_throttling", "on_battery", "low_power_mode"}
    assert {rule.name for rule in default_rules()} == covered


def test_nan_loss_is_one_error_alert_naming_the_metrics():
    alerts = [a for a in _replay(_run(250, 1, "nan_loss")) if a.level != "info"]
    assert [(a.rule, a.level, a.step) for a in alerts] == [("non_finite", "error", 100)]
    assert "policy/loss=NaN" in alerts[0].message and alerts[0].to_dict()["value"] is None


def test_kl_drift_needs_both_the_ratio_and_the_floor():
    rule = next(r for r in default_rules() if r.name == "kl_drift")
    ramp = [0.0, 0.0, 0.01, 0.04, 0.06, 0.12, 0.12, 0.46, 0.4, 0.37]  # the default run's first steps
    small = ramp + [0.01] * 20  # a baseline (steps 11-30) of 0.01
    # 40x the baseline but only 0.4 nats above it: quiet.
    assert _replay(_records(small + [0.4] * 20, "policy/kl"), [rule]) == []
    # More than 0.5 above a large baseline but only 3x it: quiet too.
    assert _replay(_records(ramp + [0.4] * 20 + [1.2] * 20, "policy/kl"), [rule]) == []
    # A single spike (the default run had one to 2.7) is not a drift.
    assert _replay(_records(ramp + [0.4] * 20 + [2.7, 0.4, 0.4], "policy/kl"), [rule]) == []
    fired = _replay(_records(ramp + [0.4] * 20 + [2.5] * 5, "policy/kl"), [rule])
    assert [a.step for a in fired] == [33]  # third step in a row above


def test_throughput_drop_ignores_warm_up_steps():
    rule = next(r for r in default_rules() if r.name == "throughput_drop")
    slow_start = [500.0, 900.0] + [3000.0] * 40
    assert _replay(_records(slow_start, "throughput/gen_tokens_per_s"), [rule]) == []


# --------------------------------------------------------------------------- engine mechanics

def test_threshold_needs_consecutive_steps():
    rule = ThresholdRule(name="hot", metric="m", op=">", value=1.0, for_steps=3)
    values = [2, 2, 0, 2, 2, 0, 2, 2, 2, 2]
    assert [a.step for a in _replay(_records(values), [rule])] == [9]


def test_one_condition_gives_one_alert_and_rearms_after_clearing():
    rule = ThresholdRule(name="hot", metric="m", op=">", value=1.0, cooldown=10)
    # Held for 30 steps: one alert; cleared at 31; back at 32, past the cooldown: fires again.
    assert [a.step for a in _replay(_records([2] * 30 + [0] + [2] * 3), [rule])] == [1, 32]
    # Back at 5, inside the cooldown of the alert at 1: silent; back at 28: fires.
    values = [2] * 3 + [0] + [2] * 3 + [0] * 20 + [2] * 3
    assert [a.step for a in _replay(_records(values), [rule])] == [1, 28]


def test_cooldown_lets_a_standing_condition_fire_once_it_passes():
    rule = ThresholdRule(name="hot", metric="m", op=">", value=1.0, cooldown=10)
    values = [2, 0] + [2] * 20
    assert [a.step for a in _replay(_records(values), [rule])] == [1, 11]


def test_patterns_match_within_or_across_segments():
    record = {"step": 1, "rewards/a/mean": 5.0, "rewards/total/mean": 5.0, "rewards/total/recent_mean": 5.0,
              "rewards/a/b/mean": 5.0}
    one = ThresholdRule(name="one", metric="rewards/*/mean", op=">", value=1)
    deep = ThresholdRule(name="deep", metric="rewards/**/mean", op=">", value=1)
    alerts = AlertEngine([one, deep]).check(record)
    assert {a.metric for a in alerts if a.rule == "one"} == {"rewards/a/mean", "rewards/total/mean"}
    assert {a.metric for a in alerts if a.rule == "deep"} == {"rewards/a/mean", "rewards/total/mean",
                                                               "rewards/a/b/mean"}


def test_each_matched_metric_has_its_own_state():
    rule = ThresholdRule(name="low", metric="rewards/*/std", op="<=", value=0, for_steps=2)
    records = [{"step": s, "rewards/a/std": 0.0, "rewards/b/std": 0.0 if s > 1 else 1.0} for s in range(1, 5)]
    assert [(a.step, a.metric) for a in _replay(records, [rule])] == [(2, "rewards/a/std"), (3, "rewards/b/std")]


def test_nonfinite_rearms_and_ignores_nulls_and_text():
    rule = NonFiniteRule(name="nan", cooldown=0)
    records = [{"step": 1, "a": 1.0, "b": None, "note": "text"}, {"step": 2, "a": math.inf, "b": math.nan},
               {"step": 3, "a": math.nan}, {"step": 4, "a": 0.0}, {"step": 5, "a": -math.inf, "note": "x"}]
    alerts = _replay(records, [rule])
    assert [(a.step, a.metric) for a in alerts] == [(2, "a"), (5, "a")]
    assert "a=Inf, b=NaN" in alerts[0].message and "a=-Inf" in alerts[1].message


def test_trend_rules_rising_falling_flat():
    up = TrendRule(name="up", metric="m", window=10, direction="rising", change=0.5, relative=True)
    down = TrendRule(name="down", metric="m", window=10, direction="falling", change=2.0)
    flat = TrendRule(name="flat", metric="m", window=10, direction="flat", change=0.1)
    growing = [10 + 2 * i for i in range(20)]  # medians of a window's halves ~70% apart at first
    alerts = _replay(_records(growing), [up, down, flat])
    assert [(a.rule, a.step) for a in alerts] == [("up", 10)]
    shrinking = [30 - i for i in range(20)]
    assert [(a.rule, a.step) for a in _replay(_records(shrinking), [up, down, flat])] == [("down", 10)]
    assert [(a.rule, a.step) for a in _replay(_records([5.0] * 20), [up, down, flat])] == [("flat", 10)]


def test_trend_min_points_evaluates_before_the_window_is_full():
    early = TrendRule(name="early", metric="m", window=30, min_points=5, direction="rising", change=0.5,
                      relative=True)
    full = TrendRule(name="full", metric="m", window=30, direction="rising", change=0.5, relative=True)
    values = [10, 10, 10, 20, 30, 40] + [40] * 30
    fired = {a.rule: a.step for a in _replay(_records(values), [early, full])}
    # median-based: the early rule needs the rise in the later half's median; the full-window rule cannot
    # judge before 30 records (and by then its window is mostly flat)
    assert fired.get("early") in (5, 6) and fired.get("full", 30) >= 30


def test_trend_skips_missing_and_nonfinite_values():
    rule = TrendRule(name="up", metric="m", window=6, direction="rising", change=1.0)
    values = [1.0, None, 2.0, math.nan, 3.0, 4.0, 5.0, 6.0]
    alerts = _replay(_records(values), [rule])
    assert [a.step for a in alerts] == [8]  # the sixth finite value


def test_spike_rule_in_log_space_and_both_directions():
    up = SpikeRule(name="up", metric="g", window=20, z=6, log=True, min_std=0.1)
    both = SpikeRule(name="both", metric="g", window=20, z=6, direction="both", min_std=0.05)
    steady = [1.0, 1.1, 0.9, 1.05, 0.95] * 4
    assert _replay(_records(steady + [1.5], "g"), [up]) == []  # 1.5x is within the floor
    assert [a.step for a in _replay(_records(steady + [5.0], "g"), [up])] == [21]
    assert [a.step for a in _replay(_records(steady + [0.2], "g"), [both])] == [21]
    assert _replay(_records(steady + [0.2], "g"), [up]) == []


def test_baseline_below_uses_early_median_after_skip():
    rule = BaselineRule(name="slow", metric="t", direction="below", factor=0.5, baseline_steps=5, skip=2)
    values = [1.0, 1.0, 100.0, 100.0, 100.0, 100.0, 100.0, 60.0, 40.0]
    alerts = _replay(_records(values, "t"), [rule])
    assert [a.step for a in alerts] == [9]
    assert "0.4x its early median 100" in alerts[0].message


def test_hacking_rule_needs_accuracy_that_does_not_improve():
    rule = HackingRule(name="hack", metric="r", window=10, rise=0.2, relative=True, accuracy=("acc",))
    rising_reward = [1.0 + 0.1 * i for i in range(30)]
    no_accuracy = [{"step": i + 1, "r": r} for i, r in enumerate(rising_reward)]
    assert _replay(no_accuracy, [rule]) == []
    improving = [{"step": i + 1, "r": r, "acc": 0.3 + 0.01 * i} for i, r in enumerate(rising_reward)]
    assert _replay(improving, [rule]) == []
    stalled = [{"step": i + 1, "r": r, "acc": 0.3} for i, r in enumerate(rising_reward)]
    alerts = _replay(stalled, [rule])
    assert [a.step for a in alerts] == [10] and "acc changed +0.000" in alerts[0].message


def test_hacking_rule_uses_accuracy_logged_in_separate_records():
    rule = HackingRule(name="hack", metric="r", window=10, rise=0.2, relative=True, accuracy=("eval/accuracy",))
    records = []
    for i in range(30):
        records.append({"step": i + 1, "r": 1.0 + 0.1 * i})
        if (i + 1) % 3 == 0:
            records.append({"step": i + 1, "eval/accuracy": 0.5 - 0.01 * i})
    assert [a.step for a in _replay(records, [rule])] == [10]


def test_alert_dict_round_trip_is_json():
    alert = Alert(step=3, time=1.5, level="error", rule="nan", metric="policy/loss", value=math.nan, message="m")
    data = json.loads(json.dumps(alert.to_dict()))
    assert data == {"step": 3, "time": 1.5, "level": "error", "rule": "nan", "metric": "policy/loss",
                    "value": None, "message": "m"}
    assert Alert.from_dict(data) == Alert(3, 1.5, "error", "nan", "policy/loss", None, "m")


def test_engine_cost_per_record_stays_flat():
    records = _run(300, 0) * 20  # 6,000 records of ~70 metrics (steps repeat: only cost matters here)
    records = [dict(r, step=i + 1) for i, r in enumerate(records)]

    def per_record(count: int) -> float:
        engine = AlertEngine(default_rules())
        start = time.process_time()  # CPU time: other processes on the machine do not count
        engine.check_all(records[:count])
        return (time.process_time() - start) / count

    # a long run's record costs what a short run's does (windows, not whole histories), and stays cheap
    short, long = per_record(1_000), per_record(6_000)
    assert long < 2 * short and long < 1e-3, f"{short * 1e6:.0f} -> {long * 1e6:.0f} us per record"


def test_telemetry_modules_import_no_mlx():
    code = ("import sys\n"
            "import mlx_grpo.telemetry.alerts.rules, mlx_grpo.telemetry.alerts.config\n"
            "import mlx_grpo.telemetry.alerts.console, mlx_grpo.telemetry.alerts.remedy\n"
            "import mlx_grpo.telemetry.analysis.reward_report, mlx_grpo.telemetry.analysis.report\n"
            "import mlx_grpo.telemetry.monitor\n"
            "import mlx_grpo.commands.report\n"
            "bad = [m for m in sys.modules if m == 'mlx' or m.startswith('mlx.')]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------- console

def test_console_prints_one_coloured_line_per_alert():
    alerts = [Alert(1, None, "info", "a", "m", 1.0, "first " * 30),
              Alert(2, None, "error", "b", "m", None, "second")]
    out = io.StringIO()
    print_alerts(alerts, Console(file=out, force_terminal=True, width=60, color_system="standard"))
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert "INFO" in lines[0] and "ERROR" in lines[1] and "\x1b[" in lines[1]
    assert format_alert(alerts[1]).plain == "ERROR   step 2 b: second"


# --------------------------------------------------------------------------- YAML

def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "alerts.yaml"
    path.write_text(text)
    return path


def test_rules_file_adds_overrides_and_disables(tmp_path):
    path = _write(tmp_path, """
disable: [reward_stagnation]
rules:
  - name: low_eval
    kind: threshold
    metric: eval/accuracy
    op: "<"
    value: 0.2
    level: info
  - name: kl_drift
    kind: baseline
    metric: policy/kl
    direction: above
    factor: 5
""")
    rules = load_alert_rules(path)
    names = [r.name for r in rules]
    assert "reward_stagnation" not in names and names[-1] == "low_eval"
    assert len(rules) == len(default_rules())
    kl = next(r for r in rules if r.name == "kl_drift")
    assert kl.factor == 5 and kl.min_change == 0
    assert [r.name for r in load_alert_rules(path, defaults=False)] == ["low_eval", "kl_drift"]
    assert [r.name for r in rules_from_config({"defaults": False, "rules": []})] == []


@pytest.mark.parametrize("text,expected", [
    ("rules:\n  - {name: a, kind: threshold, metric: m, op: '>', value: 1, colour: red}\n",
     "rules[0] (a): unknown key 'colour'"),
    ("rules:\n  - {name: a, kind: threshold, metric: m, op: '>'}\n", "rules[0] (a): missing key 'value'"),
    ("rules:\n  - {name: a, kind: threshold, metric: m, op: '=<', value: 1}\n", "rules[0] (a): key 'op'"),
    ("rules:\n  - {name: a, kind: threshold, metric: m, op: '>', value: high}\n",
     "rules[0] (a): key 'value' must be a finite number"),
    ("rules:\n  - {name: a, kind: threshold, metric: m, op: '>', value: 1, level: fatal}\n",
     "rules[0] (a): key 'level' must be one of info, warning, error"),
    ("rules:\n  - {name: a, kind: wobble, metric: m}\n", "rules[0] (a): key 'kind' must be one of"),
    ("rules:\n  - {name: a, kind: [threshold], metric: m}\n", "rules[0] (a): key 'kind' must be one of"),
    ("rules:\n  - {name: a, kind: trend, metric: m, window: 2, direction: rising, change: 1}\n",
     "rules[0] (a): key 'window' must be at least 3"),
    ("rules:\n  - {name: a, kind: trend, metric: m, window: 5, direction: up, change: 1, relative: yes please}\n",
     "rules[0] (a): key 'relative' must be true or false"),
    ("rules:\n  - {name: a, kind: trend, metric: m, window: 5, min_points: 9, direction: rising, change: 1}\n",
     "rules[0] (a): key 'min_points' must be between 3 and 'window'"),
    ("rules:\n  - {name: a, kind: nonfinite}\n  - {name: a, kind: nonfinite}\n",
     "rules[1] (a): rule name 'a' is used twice"),
    ("rules:\n  - {name: a, kind: nonfinite, action: halt}\n", "rules[0] (a): key 'action' must be one of none, stop"),
    ("rules:\n  - {name: a, kind: drop, metric: m, window: 5, fall: -1}\n",
     "rules[0] (a): key 'fall' must be positive"),
    ("rules:\n  - {name: a, kind: plateau, metric: 'rewards/*/mean', window: 5, change: 1, baseline_steps: 5}\n",
     "rules[0] (a): a plateau rule takes plain metric names"),
    ("rules:\n  - {name: a, kind: plateau, metric: m, window: 5, change: 1, baseline_steps: 9}\n",
     "rules[0] (a): key 'baseline_steps' must be between 1 and 'window'"),
    ("rules:\n  - just a string\n", "rules[0]: a rule must be a mapping"),
    ("rules: {name: a}\n", "key 'rules' must be a list"),
    ("- {name: a, kind: nonfinite}\n", "alert rules must be a mapping"),
    ("disable: [no_such_rule]\n", "disable[0]: no built-in rule named 'no_such_rule'"),
    ("defaults: maybe\n", "key 'defaults' must be true or false"),
    ("rule: []\n", "unknown key 'rule'"),
    ("rules:\n  - {name: a, kind: nonfinite\n", "alerts.yaml:3: not valid YAML"),
])
def test_rule_file_mistakes_name_file_rule_and_key(tmp_path, text, expected):
    path = _write(tmp_path, text)
    with pytest.raises(UserError) as err:
        load_alert_rules(path)
    message = str(err.value)
    assert str(path) in message and expected in message, message
    assert "\n" not in message


def test_missing_rules_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="alert rules file not found"):
        load_alert_rules(tmp_path / "nope.yaml")


def test_yaml_is_loaded_safely(tmp_path):
    path = _write(tmp_path, "rules: !!python/object/apply:os.system ['echo hacked']\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_alert_rules(path)


def test_builtin_rules_are_packaged_and_documented():
    assert "telemetry/alerts/*.yaml" in (ROOT / "pyproject.toml").read_text()
    docs = (ROOT / "docs" / "ALERTS.md").read_text()
    yaml_text = (ROOT / "mlx_grpo" / "telemetry" / "alerts" / "default_alerts.yaml").read_text()
    for rule in default_rules():
        assert f"`{rule.name}`" in docs, rule.name
        # Each built-in rule carries a comment with its reason just above it.
        before = yaml_text.split(f"- name: {rule.name}\n")[0].rstrip().splitlines()[-1]
        assert before.strip().startswith("#"), rule.name
        assert rule.hint, rule.name


def test_alert_messages_are_scrubbed_wherever_they_come_from(monkeypatch):
    from mlx_grpo.common.secrets import register_secret
    from mlx_grpo.telemetry.alerts.alert import Alert

    # a judge echoing its Authorization header, with a key whose variable name says nothing
    monkeypatch.setenv("JUDGE_AUTH", "judgecred_QWERTY123456789")
    register_secret("judgecred_QWERTY123456789")
    alert = Alert(step=1, time=None, level="warning", rule="judge_failed", metric="judge/errors", value=1.0,
                  message="judge answered 401: "
                          "{'auth': 'Bearer judgecred_QWERTY123456789', 'x': 'sk-abcdefghijklmnopqrstuv'}")
    assert "judgecred" not in alert.message and "sk-abcdefghijklmnopqrstuv" not in alert.message
    assert "judge answered 401" in alert.message and "[secret]" in alert.to_dict()["message"]


def test_measured_gemma_run_that_learned_is_reported_as_learned_not_as_faults():
    # configs/gemma3_larger.yaml, seed 0: held-out 46% -> 87% (step 15) -> 97% (step 30). From step 10 most of
    # its groups are answered right by every completion: flat groups, a zero gradient and near-greedy sampling
    # are then the task learnt, and it fired four warnings with remedies ("raise num_generations") for them.
    records = _measured("run_gemma_larger_solved.jsonl")
    alerts = _replay(records)
    assert [(a.step, a.rule) for a in alerts if a.level != "info"] == []
    solved = [a for a in alerts if "the task learnt" in a.message]
    assert {a.rule for a in solved} == {"zero_std_groups", "vanishing_gradient", "zero_gradient", "entropy_collapse"}
    assert all(a.action == "none" and "num_generations" not in a.message for a in solved)
    # The same metrics with every flat group a wrong one: the faults these rules are for, as before.
    unsolved = [{**r, "accuracy/solved_group_frac": 0.0} if "accuracy/solved_group_frac" in r else r
                for r in records]
    assert [(a.step, a.rule) for a in _replay(unsolved) if a.level == "warning"] == [
        (10, "zero_std_groups"), (13, "vanishing_gradient"), (18, "zero_gradient"), (29, "entropy_collapse")]


def test_measured_tool_run_whose_entropy_fell_while_it_learned_raises_no_warning():
    # configs/qwen_calculator.yaml, seed 0 (measured, 12 steps): held-out 62.5% -> 100%, train accuracy 31, 25,
    # 31, 38, 69, 56% over steps 1-6 while the policy's entropy fell to 45% of its start. Asked whether accuracy
    # rose with a two-sided trend test (p = 0.09), the run ended with an entropy_collapse warning at step 6.
    records = _measured("run_qwen_calculator_learned.jsonl")
    alerts = _replay(records)
    assert [(a.step, a.rule) for a in alerts if a.level != "info"] == []
    assert any(a.rule == "entropy_collapse" and "still rising" in a.message for a in alerts)


def test_a_small_batch_drawing_prompts_it_gets_wrong_is_not_a_collapse():
    # configs/gemma3_larger.yaml, seed 1: 4 prompts a step, each answered the same way by all 8 completions by
    # step 15 (held-out 91%). Steps 16 and 17 drew 2 of 4 prompts it got wrong (reward 1.8 -> 1.3 -> 1.0, 1.25 and
    # 1.4 standard errors of the step's mean over its prompts); reward_collapse stopped the run there, and the
    # stopped checkpoint scored 94% held-out. A fall must now also span 3 standard errors.
    records = _measured("run_gemma_larger_seed1_small_batch.jsonl")
    assert [(a.step, a.rule) for a in _replay(records) if a.level != "info"] == []
    without_noise = [{k: v for k, v in r.items() if not k.endswith("_stderr")} for r in records]
    assert [(a.step, a.rule) for a in _replay(without_noise) if a.level == "error"] == [(17, "reward_collapse")]


def test_a_held_out_fall_from_the_runs_best_evaluation_is_named_and_the_last_line_says_the_best():
    # configs/gemma3_larger.yaml with max_grad_norm: 0, seed 0 (measured): held-out 46% -> 88% (step 15) -> 48%
    # (step 30), the policy settled on answering the first number. Against the median of its evaluations (the
    # untrained 46% while there are 3) nothing fired and the run ended "46.0% -> 48.0% (+2.0 points), no
    # warnings or errors", its 88% unmentioned.
    from dataclasses import replace

    from mlx_grpo.telemetry.analysis.reward_report import analyze_run

    records = _measured("run_gemma_larger_late_fall.jsonl")
    warnings = [a for a in _replay(records) if a.level != "info"]
    assert [(a.step, a.rule) for a in warnings] == [(30, "heldout_accuracy_drop")]
    assert "fell to 0.48 from its best 0.88" in warnings[0].message
    old = [replace(r, reference="median", min_points=3) if r.name == "heldout_accuracy_drop" else r
           for r in default_rules()]
    assert [a for a in _replay(records, old) if a.level != "info"] == []
    line = analyze_run(records).outcome.headline()
    assert line.startswith("held-out accuracy 46.0% -> 48.0% (+2.0 points; best 88.0% at step 15)")
    # a last evaluation within a few questions of the best is not a fall worth a mention
    near = [{**r, "eval/accuracy": 0.85} if r["step"] == 30 and "eval/accuracy" in r else r for r in records]
    assert "best" not in analyze_run(near).outcome.headline()


def test_drop_rule_reference_best_falls_from_the_highest_previous_value():
    rule = DropRule(name="d", metric="m", window=5, min_points=1, reference="best", fall=0.4, relative=True)
    rises = [{"step": s, "m": v} for s, v in enumerate([0.3, 0.9, 0.6], start=1)]
    assert _replay(rises, [rule]) == []  # 0.6 is 33% below the best: under the fall
    fired = _replay(rises + [{"step": 4, "m": 0.5}], [rule])
    assert [a.step for a in fired] == [4] and "from its best 0.9" in fired[0].message
    with pytest.raises(ValueError, match="reference"):
        DropRule(name="d", metric="m", window=5, fall=0.4, reference="mean")
    with pytest.raises(ValueError, match="between 3"):
        DropRule(name="d", metric="m", window=5, min_points=1, fall=0.4)


def test_a_real_collapse_spans_hundreds_of_standard_errors_and_still_stops_at_once():
    # The default run at learning rate 1e-2: reward 7.8 -> -3.1 at step 2, 275 standard errors.
    alerts = [a for a in _replay(_measured("run_lr_1e-2_collapse.jsonl")) if a.level == "error"]
    assert [(a.step, a.rule, a.action) for a in alerts] == [(3, "reward_collapse", "stop"),
                                                            (3, "accuracy_collapse", "stop")]
    assert "275 standard errors of the step's rewards/total/mean" in alerts[0].message


def test_drop_rule_needs_the_fall_to_span_noise_z_standard_errors():
    rule = DropRule(name="d", metric="m", window=5, fall=0.3, relative=True, noise="m_se", noise_z=3)
    steady = [{"step": s, "m": 2.0, "m_se": 0.1} for s in range(1, 6)]
    assert _replay(steady + [{"step": 6, "m": 1.0, "m_se": 0.4}], [rule]) == []  # 2.5 standard errors
    fired = _replay(steady + [{"step": 6, "m": 1.0, "m_se": 0.3}], [rule])  # 3.3
    assert [a.step for a in fired] == [6] and "3 standard errors" in fired[0].message
    assert [a.step for a in _replay(steady + [{"step": 6, "m": 1.0}], [rule])] == [6]  # no error known: as before
