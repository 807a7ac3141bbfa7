"""The background system sampler and the macOS GPU-utilisation parser."""

from __future__ import annotations

import sys
import time

import psutil
import pytest

from mlx_grpo.telemetry.metrics.system import GB, SystemSampler, accel_metrics, parse_ioreg_utilization

# Shape of `ioreg -r -d 1 -w 0 -c IOAccelerator` on Apple silicon (one line per accelerator, shortened).
IOREG_SAMPLE = '''+-o AGXAcceleratorG13X  <class AGXAcceleratorG13X, id 0x1000005c1, registered, matched, active>
    {
      "PerformanceStatistics" = {"In use system memory"=1234567,"Device Utilization %"=37,"Tiler Utilization %"=12,"Renderer Utilization %"=35}
      "IOClass" = "AGXAcceleratorG13X"
    }
'''


def test_ioreg_parser_reads_device_utilization():
    assert parse_ioreg_utilization(IOREG_SAMPLE) == 37.0
    assert parse_ioreg_utilization('"Renderer Utilization %"=35') is None
    assert parse_ioreg_utilization("") is None


def test_sampler_reports_machine_and_process_metrics_after_one_interval():
    with SystemSampler(interval=0.05, gpu_utilization=lambda: None) as sampler:
        first = sampler.snapshot()
        time.sleep(0.3)
        later = sampler.snapshot()
    # CPU % needs an interval to measure over, so it is absent at first rather than a made-up 0.
    assert "system/cpu_percent" not in first
    assert 0.0 <= later["system/cpu_percent"] <= 100.0
    assert 0.0 < later["system/memory_percent"] < 100.0
    assert later["system/memory_used_gb"] > 0 and later["system/memory_available_gb"] > 0
    assert 0.0 < later["system/process_rss_gb"] < later["system/memory_used_gb"] + later["system/memory_available_gb"]
    assert "system/gpu_utilization_percent" not in later


def test_accelerator_memory_comes_from_the_callable_and_unknown_values_are_left_out():
    reading = {"active": 2 * GB, "peak": 3 * GB, "cache": GB // 2, "limit": 8 * GB}
    sampler = SystemSampler(accel_memory=lambda: reading, gpu_utilization=lambda: None).start()
    snap = sampler.snapshot()
    sampler.stop()
    assert snap["system/accel_active_gb"] == 2.0 and snap["system/accel_peak_gb"] == 3.0
    assert snap["system/accel_cache_gb"] == 0.5 and snap["system/accel_limit_gb"] == 8.0
    assert snap["system/accel_memory_percent"] == 25.0
    # CPU backend: no recommended working set, so no limit and no percentage.
    assert accel_metrics({"active": GB, "peak": GB, "cache": 0, "limit": None}) == {
        "system/accel_active_gb": 1.0, "system/accel_peak_gb": 1.0, "system/accel_cache_gb": 0.0}


def test_gpu_reader_values_appear_and_a_failing_reader_is_dropped_without_stopping_the_thread():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("ioreg went away")
        return 42.0

    sampler = SystemSampler(interval=0.02, gpu_utilization=flaky).start()
    assert sampler.snapshot()["system/gpu_utilization_percent"] == 42.0
    time.sleep(0.2)
    snap = sampler.snapshot()
    sampler.stop()
    assert "system/gpu_utilization_percent" not in snap
    assert "system/cpu_percent" in snap  # the thread kept sampling
    assert len(calls) == 2


@pytest.mark.skipif(sys.platform == "darwin", reason="macOS reads GPU utilisation through ioreg")
def test_no_gpu_utilization_off_macos():
    with SystemSampler(interval=0.02) as sampler:
        time.sleep(0.1)
        assert "system/gpu_utilization_percent" not in sampler.snapshot()


def test_snapshot_is_cheap():
    with SystemSampler(interval=0.5, accel_memory=lambda: {"active": 1, "peak": 1, "cache": 1, "limit": 2}) as s:
        start = time.perf_counter()
        for _ in range(1000):
            s.snapshot()
        per_call = (time.perf_counter() - start) / 1000
    assert per_call < 1e-3  # measured ~10 us; the budget for all logging is ~5 ms per step


def test_first_cpu_sample_measures_the_interval_instead_of_reading_zero(monkeypatch):
    """psutil keeps cpu_percent's baseline per thread, so a thread's first call compares two readings taken
    microseconds apart: 0.0 (or noise). The sampler's first value must cover a whole interval. The kernel's
    CPU times move in ticks; here a tick is 50 ms and the machine is 75% busy."""
    zero = psutil.cpu_times()._make([0.0] * len(psutil.cpu_times()))

    def ticking_cpu_times(percpu=False):
        ticks = int(time.monotonic() * 20)
        return zero._replace(user=0.75 * ticks, idle=0.25 * ticks)

    monkeypatch.setattr(psutil, "cpu_times", ticking_cpu_times)
    sampler = SystemSampler(interval=0.3, gpu_utilization=lambda: None).start()
    deadline = time.monotonic() + 5
    while "system/cpu_percent" not in sampler.snapshot() and time.monotonic() < deadline:
        time.sleep(0.02)
    first = sampler.snapshot()["system/cpu_percent"]
    sampler.stop()
    assert first == 75.0


def test_device_facts_work_on_mlx_versions_without_mx_device_info(monkeypatch):
    """mx.device_info() exists from MLX 0.30.4; earlier versions have only mx.metal.device_info."""
    import mlx.core as mx

    from mlx_grpo.planning import machine

    monkeypatch.delattr(mx, "device_info", raising=False)
    monkeypatch.setattr(mx.metal, "is_available", lambda: True)
    monkeypatch.setattr(mx.metal, "device_info", lambda: {"device_name": "Apple M2", "memory_size": 16 * 2**30,
                                                          "max_recommended_working_set_size": 11453251584})
    assert machine.accel_memory()["limit"] == 11453251584
    assert machine.describe_device("bfloat16")["device_name"] == "Apple M2"
    monkeypatch.setattr(mx.metal, "is_available", lambda: False)
    assert machine.accel_memory()["limit"] is None  # the CPU backend: no working set


def test_on_metal_the_working_set_is_wired_and_a_model_that_fills_it_is_warned_about(monkeypatch):
    import mlx.core as mx

    from mlx_grpo.planning import machine

    wired = []
    monkeypatch.setattr(mx.metal, "is_available", lambda: True)
    monkeypatch.setattr(machine, "device_info", lambda: {"max_recommended_working_set_size": 10 * 2**30})
    monkeypatch.setattr(mx, "set_wired_limit", lambda n: wired.append(n))
    assert machine.wire_memory(4 * 2**30) is None and wired == [10 * 2**30]
    warning = machine.wire_memory(9.5 * 2**30)
    assert "9.5 GiB, over 90% of this Mac's 10.0 GiB working set" in warning and "mlx-grpo plan" in warning
    monkeypatch.setattr(mx.metal, "is_available", lambda: False)
    assert machine.wire_memory(100 * 2**30) is None  # the CPU backend wires nothing
