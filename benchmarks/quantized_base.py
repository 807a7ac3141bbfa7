"""A GRPO step on a quantized base as it is against the same base dequantized at load (`quantized_base`).

Both trainers are built in one process (the benchmark's fixed-shape workload: synthetic prompts, every
completion runs its whole budget) and their steps are interleaved, so a busy moment on a shared machine hits
both alike. Reports seconds per step and per phase, the weights' size, and the ratio within each repetition.
The default model is SmolLM2-135M-Instruct's Q4_1 GGUF (`smollm2`). Peak memory is not compared here: both
models live in this one process (benchmarks/plan_check.py measures a run's phases alone).

    python benchmarks/quantized_base.py --batch-size 2 --group-size 4 --completion-length 32 --prompt-length 40
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
from mlx_grpo.measuring.workload import Workload
from mlx_grpo.models.policy import count_parameters, parameter_bytes

SETTINGS = ("keep", "dequantize")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--prompt-length", type=int, default=40,
                        help="more than the chat template's own tokens (30 for SmolLM2)")
    parser.add_argument("--completion-length", type=int, default=32)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--output", help="also write the JSON report here")
    args = parser.parse_args()

    base = load_config(None, {"model_id": args.model, "use_lora": True, "batch_size": args.batch_size,
                              "num_generations": args.group_size, "max_generation_steps": args.completion_length,
                              "num_iterations": 1, "micro_batch_size": 0})
    workloads, facts = {}, {}
    for setting in SETTINGS:
        start = time.perf_counter()
        workload = Workload(replace(base, quantized_base=setting), Path.cwd(), args.prompt_length)
        workloads[setting] = workload
        facts[setting] = {"load_and_build_s": round(time.perf_counter() - start, 1),
                          "parameters": count_parameters(workload.model)[0],
                          "weight_gb": round(parameter_bytes(workload.model) / 1e9, 3)}
    steps: dict[str, list[float]] = {s: [] for s in SETTINGS}
    phases: dict[str, list[dict]] = {s: [] for s in SETTINGS}
    for rep in range(args.repetitions + 1):  # the first is a warm-up
        for setting, workload in workloads.items():
            mx.synchronize()
            start = time.perf_counter()
            seconds, _ = workload.step(rep + 1)
            elapsed = time.perf_counter() - start
            if rep > 0:
                steps[setting].append(elapsed)
                phases[setting].append(seconds)
            print(f"rep {rep} {setting}: {elapsed:.1f} s", flush=True)
    report = {
        "shape": {"prompts": args.batch_size, "group_size": args.group_size, "prompt_length": args.prompt_length,
                  "completion_length": args.completion_length, "lora": True, "dtype": "float32"},
        "settings": {s: {**facts[s], "step_s_median": round(statistics.median(steps[s]), 2),
                         "phase_s_median": {p: round(statistics.median(r[p] for r in phases[s]), 2)
                                            for p in phases[s][0]}} for s in SETTINGS},
        "keep_over_dequantize": [round(k / d, 2) for k, d in zip(steps["keep"], steps["dequantize"])],
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n")


if __name__ == "__main__":
    main()
