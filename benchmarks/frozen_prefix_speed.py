"""Frozen-prefix reuse on and off in one process, interleaved: the rollout (which keeps the states when on),
the reference pass and the update, their
FLOPs (mlx_grpo/planning/roofline.py), achieved FLOP/s and share of the matmul peak, and each phase's peak memory.

`mlx-grpo bench` measures one setting per run; on a shared machine two runs minutes apart see different
loads. Here both trainers (the same random-weight model, the same rollout tokens) alternate repetition by
repetition, so a slow moment hits both alike. Run it through the `mlx-grpo` command's OpenBLAS preload on
Linux (LD_PRELOAD, see mlx_grpo/planning/blas.py), e.g.

    python benchmarks/frozen_prefix_speed.py --preset qwen2.5-0.5b --layers 6 --lora-layers 2 \\
        --prompt-length 32 --completion 256 --repetitions 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

import mlx.core as mx

from mlx_grpo.config.train_config import load_config
from mlx_grpo.measuring.benchmark import BenchOptions, phase_work
from mlx_grpo.measuring.workload import Workload
from mlx_grpo.planning.machine import matmul_peak_flops
from mlx_grpo.planning.presets import cached_preset_model
from mlx_grpo.trainer import step_key


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen2.5-0.5b")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--lora-layers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--prompt-length", type=int, default=32)
    parser.add_argument("--completion", type=int, default=256)
    parser.add_argument("--repetitions", type=int, default=3)
    args = parser.parse_args()

    model_dir = cached_preset_model(args.preset, args.layers)
    base = load_config(None, {"model_id": str(model_dir), "use_lora": True, "lora_layers": args.lora_layers,
                              "dtype": "float32", "batch_size": args.batch_size, "num_generations": args.group_size,
                              "max_generation_steps": args.completion, "beta": 0.04})
    settings = {"on": True, "off": False}
    works = {name: Workload(replace(base, frozen_prefix_reuse=on), Path.cwd(), args.prompt_length)
             for name, on in settings.items()}
    # the same rollout tokens for both: the "on" trainer's rollout, re-batched without its kept states for "off"
    batches = {"on": works["on"].batch, "off": replace(works["on"].batch, prefix=None)}
    assert batches["on"].prefix is not None
    for name in works:
        works[name].batch = batches[name]
    peak = matmul_peak_flops()
    seconds: dict[str, dict[str, list[float]]] = {n: {"rollout": [], "reference": [], "update": []} for n in works}
    peaks: dict[str, dict[str, float]] = {n: {} for n in works}
    for rep in range(args.repetitions + 1):  # the first is a warm-up
        for name, work in works.items():
            batch = batches[name]
            start = time.perf_counter()
            rollout = work.rollout(step_key(base.seed, 1 + rep))  # "on" keeps the frozen blocks' output
            if rep:
                seconds[name]["rollout"].append(time.perf_counter() - start)
            del rollout
            mx.reset_peak_memory()
            before = mx.get_active_memory()
            start = time.perf_counter()
            ref = work.trainer.reference_logprobs(batch)
            elapsed = time.perf_counter() - start
            ref_peak = mx.get_peak_memory() - before
            mx.reset_peak_memory()
            before = mx.get_active_memory()
            start = time.perf_counter()
            work.update(batch, work.advantages, ref)
            update_elapsed = time.perf_counter() - start
            update_peak = mx.get_peak_memory() - before
            if rep:
                seconds[name]["reference"].append(elapsed)
                seconds[name]["update"].append(update_elapsed)
                peaks[name] = {"reference": max(peaks[name].get("reference", 0), ref_peak),
                               "update": max(peaks[name].get("update", 0), update_peak)}
    # the rollout's own peak with and without keeping the states, one each
    for name, work in works.items():
        mx.reset_peak_memory()
        before = mx.get_active_memory()
        rollout = work.rollout(step_key(base.seed, 99))
        peaks[name]["rollout"] = mx.get_peak_memory() - before
        peaks[name]["kept_state_bytes"] = rollout.prefix.nbytes() if rollout.prefix is not None else 0
        del rollout
    report = {"shape": {**vars(args), "dtype": "float32", "matmul_peak_flops_per_s": peak}}
    for name, work in works.items():
        flops = phase_work(work, BenchOptions(config=work.config, prompt_length=args.prompt_length))
        report[name] = {}
        report[name]["rollout_seconds"] = statistics.median(seconds[name]["rollout"])
        for phase in ("reference", "update"):
            median = statistics.median(seconds[name][phase])
            report[name][phase] = {"seconds": median, "all": seconds[name][phase], "gflop": flops[phase].flops / 1e9,
                                   "gflop_per_s": flops[phase].flops / median / 1e9,
                                   "share_of_peak": flops[phase].flops / median / peak}
        # each phase's peak above what was allocated when it started (both models' weights, the batch)
        report[name]["peak_memory_above_start_gb"] = {k: v / 1e9 for k, v in peaks[name].items()}
    report["rollout_time_on_over_off"] = report["on"]["rollout_seconds"] / report["off"]["rollout_seconds"]
    for phase in ("reference", "update"):
        report[f"{phase}_time_on_over_off"] = report["on"][phase]["seconds"] / report["off"][phase]["seconds"]
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
