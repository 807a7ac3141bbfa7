"""The whole selftest: every check in order, a report rewritten before and after each, and its summary."""

from __future__ import annotations

import os
import tempfile
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from .common import ABORT_ENV, METAL_ABORT_LINE, Check, device_name, sample_batch, small_config
from .devices import check_devices
from .environment import environment
from .memory import check_memory, check_plan, check_plan_counts, check_rollout_flat, preset_model_dir
from .numerics import check_chunked_head, check_micro_batches, check_precision, check_resume, check_shared_prompts
from .real_model import check_real_model
from .speed import check_bench, check_learning

LOG_TAIL_LINES = 50

CHECKS = ("precision", "shared_prompts", "chunked_head", "micro_batches", "resume", "devices", "plan_counts",
          "memory_plan", "rollout_flat", "memory", "real_model", "learning", "bench")
# `--quick`: the two checks that train (the real model, a download on first use, and the default run learning)
# take three quarters of the full selftest's time; what is left checks the kernels, the memory plan and speed
QUICK_SKIP = ("real_model", "learning")
SEND_BACK = ("send back: {out} (and {log} if a check failed or the run stopped early): attach both to an issue "
             "of the mlx-grpo repository, or to whoever asked you to run this. They hold no paths to your data "
             "and no model weights.")


def log_tail(path: Path | None) -> list[str]:
    if path is None or not path.exists():
        return []
    with open(path, "rb") as log:
        log.seek(0, os.SEEK_END)
        log.seek(max(0, log.tell() - 64_000))
        return log.read().decode("utf-8", "replace").splitlines()[-LOG_TAIL_LINES:]


def run_selftest(base_dir: Path, skip: set[str] = frozenset(), say: Callable[[str], None] = print,
                 write: Callable[[dict], None] = lambda report: None, log: Path | None = None,
                 out_name: str = "mlx-grpo-selftest.json", tf32_at_start: str | None = None) -> dict:
    """Every check in order; a check that raises fails with its whole traceback (the others still run).
    `write` gets the report before each check (naming it as running) and after it: a process that dies
    mid-check leaves the checks so far. The caller has set MLX_ENABLE_TF32=0 (tf32.full_float32) before MLX's
    first matmul; `tf32_at_start` is what it was."""
    import mlx.core as mx

    started = time.perf_counter()
    env = environment(tf32_at_start)
    results: list[Check] = []

    def report(running: str | None) -> dict:
        return selftest_report(env, results, running, time.perf_counter() - started, log, out_name)

    with tempfile.TemporaryDirectory(prefix="mlx-grpo-selftest-") as tmp:
        runners = check_runners(base_dir, Path(tmp), skip, env["cache_limit_bytes"])
        for name in CHECKS:
            write(report(name))
            start = time.perf_counter()
            check = run_check(name, runners[name], skip)
            check.device = check.device or device_name()
            check.seconds = round(time.perf_counter() - start, 1)
            results.append(check)
            say(summary_line(check))
            mx.clear_cache()
            mx.set_cache_limit(env["cache_limit_bytes"])  # a `train` inside the check set its own plan's
    final = report(None)
    write(final)
    return final


def selftest_report(env: dict, results: list[Check], running: str | None, seconds: float, log: Path | None,
                    out_name: str) -> dict:
    doc = {"schema": "mlx-grpo-selftest/2", "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "environment": env, "checks": [asdict(c) for c in results], "running": running,
           "finished": running is None and len(results) == len(CHECKS),
           "passed": all(c.status != "fail" for c in results) and running is None,
           "seconds": round(seconds, 1), "log_tail": log_tail(log)}
    doc["summary"] = summary(doc) + [SEND_BACK.format(out=out_name, log=log.name if log else "the log")]
    return doc


def check_runners(base_dir: Path, work: Path, skip: set[str], cache_limit: int) -> dict[str, Callable[[], Check]]:
    """Each check by name, ready to run; checks that share a trainer's batch or the preset's plan build it once."""
    from ...trainer import Trainer

    state: dict[str, Any] = {}

    def prepare_batch() -> tuple:
        if "batch" not in state:
            trainer = Trainer.build(small_config(), base_dir)
            state["trainer"], (state["batch"], state["advantages"]) = trainer, sample_batch(trainer)
        return state["trainer"], state["batch"], state["advantages"]

    def plan_and_flat(name: str) -> Check:
        if "plan" not in state:
            state["plan"], state["work"] = check_plan(base_dir, preset_model_dir(work / "preset"))
        return state["plan"] if name == "memory_plan" else check_rollout_flat(state["work"])

    return {
        "precision": check_precision,
        "shared_prompts": lambda: check_shared_prompts(*prepare_batch()[:2]),
        "chunked_head": lambda: check_chunked_head(*prepare_batch()[:2]),
        "micro_batches": lambda: check_micro_batches(base_dir, *prepare_batch()[1:]),
        "resume": lambda: check_resume(base_dir, work),
        "devices": lambda: check_devices(base_dir, real="real_model" not in skip),
        "plan_counts": check_plan_counts,
        "memory_plan": lambda: plan_and_flat("memory_plan"),
        "rollout_flat": lambda: plan_and_flat("rollout_flat"),
        "memory": lambda: check_memory(base_dir, work, cache_limit),
        "real_model": lambda: check_real_model(base_dir),
        "learning": lambda: check_learning(base_dir, work),
        "bench": lambda: check_bench(base_dir),
    }


def run_check(name: str, runner: Callable[[], Check], skip: set[str]) -> Check:
    """One check's row: skipped, passed or failed; a check that raises is a failed check with its traceback."""
    if name in skip:
        return Check(name, "skip", "skipped by --skip" + (" or --quick" if name in QUICK_SKIP else ""))
    if os.environ.get(ABORT_ENV) == name:  # test-only: what a Metal abort does to the process
        os.write(2, f"{METAL_ABORT_LINE}\n".encode())
        os.abort()
    try:
        return runner()
    except Exception as err:  # noqa: BLE001 - a check that crashes is a failed check, reported
        from ...run.loop import metal_failure

        text = str(err).strip().replace("\n", " ")
        failure = metal_failure(err)
        return Check(name, "fail", f"{failure}; run the selftest again in a new process" if failure
                     else f"raised {type(err).__name__}: {text[:300]}", error=traceback.format_exc())


def summary_line(check: Check) -> str:
    where = f" ({check.dtype}, {check.device})" if check.dtype else f" ({check.device})" if check.device else ""
    return f"{check.status.upper():<5} {check.name:<15} {check.detail}{where}  [{check.seconds:.0f} s]"


def summary(report: dict) -> list[str]:
    env = report["environment"]
    gib = lambda n: f"{n / 2**30:.1f} GiB" if n is not None else "n/a"  # noqa: E731
    state = ("PASSED" if report["passed"] else "FAILED") if report["running"] is None else \
        f"STOPPED during '{report['running']}'"
    wiring = {True: "", False: " (no effect before macOS 15)", None: ""}[env["wiring_takes_effect"]]
    lines = [
        f"mlx-grpo selftest {report['created']}: {state} after {report['seconds']:.0f} s",
        f"machine  {env['chip']}, GPU {env['gpu_architecture'] or 'n/a'} with {env['gpu_cores'] or 'n/a'} cores, "
        f"memory {gib(env['memory_bytes'])}, working set {gib(env['working_set_bytes'])}, wired limit "
        f"{gib(env['wired_limit_bytes'])}{wiring}, {'macOS ' + env['macos'] if env['macos'] else env['os']}, "
        f"load {env['load_average']} on {env['cores']} cores",
        f"power    {env['power_source']}, Low Power Mode {env['low_power_mode']}, thermal {env['thermal_state']}, "
        f"swap {gib(env['swap_used_bytes'])}, memory pressure "
        f"{env['memory_pressure'] or 'not available on this OS'}",
        f"float32  {env['float32']}; MLX_ENABLE_TF32 was {env['tf32_setting_at_start'] or 'unset'} at start, the "
        f"selftest runs with {env['tf32_setting'] or 'it unset'} so its float32 rows compare full float32",
        f"versions mlx {env['mlx']}, mlx-lm {env['mlx_lm']}, mlx-grpo {env['mlx_grpo']}, python {env['python']}; "
        f"backend {env['backend']}",
    ]
    lines += [summary_line(Check(**c)) for c in report["checks"]]
    return lines
