"""Learning and speed: the default run's held-out gain, and bench's goals on this machine."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

from ...telemetry.metrics.names import EVAL_ACCURACY
from ...telemetry.rundir.layout import RunPaths
from .common import Check, device_name, perturbed, verdict

# Measured here (Linux x86_64, 2 cores, MLX CPU backend, fp32): the default model's held-out accuracy gain
# over `LEARNING_STEPS` steps of the default config (eval before the first update and at the end). A Mac computes other
# roundings and samples other completions, so the check asks for at least half of it.
LEARNING_STEPS = 60
REFERENCE_GAIN = 0.18  # 32% -> 50% (seed 0, 200 held-out rows; docs/PLATFORMS.md, "selftest")
LEARNING_SHARE = 0.5

def check_learning(base_dir: Path, work: Path) -> Check:
    from ...config.train_config import load_config
    from ...run.loop import train

    config = load_config(None, {"num_steps": LEARNING_STEPS, "eval_every": LEARNING_STEPS, "wandb": False,
                                "monitoring_dir": str(work / "runs"), "run_name": "learning"})
    start = time.perf_counter()
    run = Path(train(config, base_dir)["run_dir"])
    seconds = time.perf_counter() - start
    accuracy = [r[EVAL_ACCURACY] for r in map(json.loads, RunPaths(run).metrics.read_text().splitlines())
                if EVAL_ACCURACY in r]
    gain = float(perturbed("learning", np.array(accuracy[-1] - accuracy[0])))
    want = LEARNING_SHARE * REFERENCE_GAIN
    return Check("learning", verdict(gain >= want),
                 f"default config, {LEARNING_STEPS} steps: held-out {accuracy[0]:.0%} -> {accuracy[-1]:.0%} "
                 f"({gain * 100:+.0f} points; ours {REFERENCE_GAIN * 100:+.0f}, pass at >= {want * 100:+.0f}) in "
                 f"{seconds:.0f} s", {"first": accuracy[0], "last": accuracy[-1], "gain": gain,
                                      "reference_gain": REFERENCE_GAIN, "seconds": seconds},
                 dtype="float32", device=device_name())


def check_bench(base_dir: Path) -> Check:
    """bench's goals, its tokens/s and share of the chip's decode ceiling, and (Metal) the wired limit bench
    set, read back."""
    import mlx.core as mx

    from ...config.train_config import load_config
    from ...planning.machine import wired_limit, wired_limit_in_effect
    from ..benchmark import BenchOptions, run_bench

    if mx.metal.is_available():
        mx.set_wired_limit(0)  # read back bench's own wiring below
    report = run_bench(BenchOptions(load_config(), base_dir, repetitions=2, warmup=1, memory=False))
    wired, wanted_wired = wired_limit_in_effect(), wired_limit()
    goals = {g["name"]: {"measured": g["measured"], "target": g["target"], "met": g["met"]} for g in report["goals"]}
    ratios = {name: r.get("median") for name, r in report["ratios"].items() if isinstance(r, dict)}
    speeds = {name: p["tokens_per_s"]["median"] for name, p in report["paths"].items()}
    missed = [name for name, g in goals.items() if g["met"] is False]
    text = ", ".join(f"{n} {g['measured']:.2f}" for n, g in goals.items() if g["measured"] is not None)
    text += "; tokens/s " + ", ".join(f"{n} {v:.0f}" for n, v in speeds.items() if n in ("rollout", "update"))
    bandwidth = report.get("bandwidth")
    text += (f" ({bandwidth['percent_of_ceiling']:.0f}% of the {bandwidth['chip']}'s decode ceiling)" if bandwidth
             else " (no chip in the bandwidth table here)")
    load, cores = (os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0), os.cpu_count() or 1
    measured = {"goals": goals, "ratios": ratios, "tokens_per_s": speeds, "bandwidth": bandwidth,
                "wired_limit_read_back": wired, "wired_limit_wanted": wanted_wired, "load_average": load}
    extra = dict(dtype="float32", device=device_name())
    if wanted_wired is not None and wired != wanted_wired:
        return Check("bench", "fail", f"bench ran without wiring memory (read back {wired} B, train wires "
                     f"{wanted_wired} B): its figures are not the trained configuration's; {text}", measured, **extra)
    if missed and load > cores:
        return Check("bench", "skip", f"goals missed ({', '.join(missed)}) with the machine busy (load {load:.1f} "
                     f"on {cores} cores): ratios recorded, not judged; {text}", measured, **extra)
    return Check("bench", "fail" if missed else "pass",
                 f"bench goals {'missed: ' + ', '.join(missed) if missed else 'met'}; {text}", measured, **extra)


# ----------------------------------------------------------------------------- the whole test
