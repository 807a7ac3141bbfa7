"""The Mac's physical state from pmset's output (faked here), silent off a Mac."""

from __future__ import annotations

from mlx_grpo.telemetry.alerts.config import default_rules
from mlx_grpo.telemetry.alerts.engine import AlertEngine
from mlx_grpo.telemetry.metrics.mac_state import MacStateReader, parse_batt, parse_settings, parse_therm
from mlx_grpo.telemetry.metrics.system import SystemSampler

THROTTLED = ("Note: No performance warning level has been recorded\nThermal Warning Level set to 2\n"
             "CPU_Scheduler_Limit \t= 100\nCPU_Available_CPUs \t= 8\nCPU_Speed_Limit \t= 70\n")
COOL = ("Note: No thermal warning level has been recorded\nNote: No performance warning level has been recorded\n"
        "Note: No CPU power status has been recorded\n")
ON_BATTERY = "Now drawing from 'Battery Power'\n -InternalBattery-0 (id=123)\t81%; discharging; 4:10 remaining\n"
ON_AC = "Now drawing from 'AC Power'\n -InternalBattery-0 (id=123)\t100%; charged; 0:00 remaining\n"
SETTINGS = "System-wide power settings:\nCurrently in use:\n standby              1\n lowpowermode         1\n sleep 1\n"


def fake_pmset(answers):
    calls = []

    def run(*args):
        calls.append(args)
        return answers[args]
    return run, calls


def test_the_three_readings_are_parsed():
    assert parse_therm(THROTTLED) == {"system/thermal_warning_level": 2.0, "system/cpu_speed_limit_percent": 70.0}
    assert parse_therm(COOL) == {"system/thermal_warning_level": 0.0}
    assert parse_batt(ON_BATTERY) == {"system/on_battery": 1.0} and parse_batt(ON_AC) == {"system/on_battery": 0.0}
    assert parse_settings(SETTINGS) == {"system/low_power_mode": 1.0} and parse_settings("") == {}


def test_a_mac_is_read_at_most_every_30_s_and_another_system_never():
    run, calls = fake_pmset({("-g", "therm"): THROTTLED, ("-g", "batt"): ON_BATTERY, ("-g",): SETTINGS})
    clock = [0.0]
    mac = MacStateReader(run=run, clock=lambda: clock[0], platform="darwin", available=True)
    expected = {"system/thermal_warning_level": 2.0, "system/cpu_speed_limit_percent": 70.0,
                "system/on_battery": 1.0, "system/low_power_mode": 1.0}
    assert mac.read() == expected and len(calls) == 3
    clock[0] = 10.0
    assert mac.read() == expected and len(calls) == 3  # cached
    clock[0] = 31.0
    mac.read()
    assert len(calls) == 6
    linux = MacStateReader(run=run, platform="linux")
    assert linux.read() == {} and len(calls) == 6
    sample = SystemSampler(mac_state=MacStateReader(run=run, platform="darwin", available=True)).start()
    try:
        assert sample.snapshot()["system/on_battery"] == 1.0
    finally:
        sample.stop()
    off_a_mac = SystemSampler(mac_state=linux).start()
    try:
        assert "system/on_battery" not in off_a_mac.snapshot()
    finally:
        off_a_mac.stop()


def test_throttling_is_a_warning_and_battery_an_info():
    records = [{"step": s, "system/thermal_warning_level": 2.0 if s > 3 else 0.0, "system/on_battery": 1.0,
                "system/low_power_mode": 0.0} for s in range(1, 10)]
    fired = [(a.step, a.rule, a.level) for a in AlertEngine(default_rules()).check_all(records)]
    assert (6, "thermal_throttling", "warning") in fired and (2, "on_battery", "info") in fired
    assert not any(rule == "low_power_mode" for _, rule, _ in fired)
