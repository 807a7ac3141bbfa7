"""Training-step speed with the system OpenBLAS preloaded against MLX's bundled reference BLAS.

    python benchmarks/bench_openblas.py                 # default config: shipped model, 16 x 8, full, beta 0.04
    python benchmarks/bench_openblas.py --model DIR --repetitions 5 --train-steps 0

Each measurement runs twice in fresh processes, once as the command normally runs (OpenBLAS
preloaded when installed) and once with MLX_GRPO_OPENBLAS=0:
  - `mlx-grpo bench --only rollout,update,step` (fixed shapes, every completion at full length);
  - `mlx-grpo train` on the default config for --train-steps steps (real prompts, EOS honoured),
    read back from its metrics.jsonl: the trainer's timing/step_s and the time between records
    (the whole loop: step, metric sinks, alerts), first step excluded as warm-up.
The goal is a training step at least 3x faster with OpenBLAS. Prints a table, then JSON.
Linux only: on macOS MLX uses Accelerate and there is nothing to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from mlx_grpo.planning import blas

GOAL = 3.0
PATHS = ("rollout", "update", "step")
PER_RUN = ("blas", "blas_library", "matmul_fp32_gflops", "load_average")  # machine fields that differ per child


def child_env(openblas: bool) -> dict[str, str]:
    env = {**os.environ, blas.SWITCH: "1" if openblas else "0"}
    if not openblas:
        # A preload inherited from our own caller would defeat the comparison.
        env["LD_PRELOAD"] = ":".join(p for p in env.get("LD_PRELOAD", "").split(":") if p and "openblas" not in p)
    return env


def run_mlx_grpo(args: list[str], openblas: bool) -> str:
    command = [sys.executable, "-m", "mlx_grpo.cli", *args]
    result = subprocess.run(command, capture_output=True, text=True, env=child_env(openblas))
    if result.returncode != 0:
        sys.exit(f"bench_openblas: `{' '.join(command)}` failed:\n{result.stderr}")
    return result.stdout


def run_bench(extra: list[str], openblas: bool) -> dict:
    return json.loads(run_mlx_grpo(["bench", "--only", ",".join(PATHS), "--no-memory", "--json", *extra], openblas))


def run_train(steps: int, extra: list[str], openblas: bool) -> dict:
    """Median seconds per step of a real `mlx-grpo train` run, warm-up step excluded."""
    with tempfile.TemporaryDirectory() as tmp:
        run_mlx_grpo(["train", *extra, "--num-steps", str(steps), "--eval-every", "0", "--checkpoint-every", "0",
                      "--no-wandb", "--monitoring-dir", tmp, "--run-name", "bench"], openblas)
        lines = (Path(tmp) / "bench" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    step_s = [r["timing/step_s"] for r in records[1:]]
    loop_s = [b["time"] - a["time"] for a, b in zip(records[1:], records[2:])]
    return {"steps": len(records), "step_s": statistics.median(step_s),
            "loop_s": statistics.median(loop_s) if loop_s else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="model directory (default: the shipped model)")
    parser.add_argument("--config", metavar="FILE", help="run config to take model and shapes from")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--train-steps", type=int, default=6,
                        help="steps of `mlx-grpo train` per BLAS (0 skips the training run; the first is warm-up)")
    args = parser.parse_args(argv)
    if not sys.platform.startswith("linux"):
        print("bench_openblas: Linux only (on macOS MLX uses Accelerate)", file=sys.stderr)
        return 2
    library = blas.find_openblas()
    if library is None:
        print(f"bench_openblas: no system OpenBLAS found; install it with {blas.INSTALL_HINT}", file=sys.stderr)
        return 2
    extra = ["--repetitions", str(args.repetitions), "--warmup", str(args.warmup)]
    extra += ["--model", args.model] if args.model else []
    extra += ["--config", args.config] if args.config else []

    fast = run_bench(extra, openblas=True)
    slow = run_bench(extra, openblas=False)
    if fast["machine"]["blas"] != "OpenBLAS" or slow["machine"]["blas"] != "reference BLAS":
        sys.exit(f"bench_openblas: expected OpenBLAS vs reference BLAS, got "
                 f"{fast['machine']['blas']} vs {slow['machine']['blas']}")

    speedup = {p: slow["paths"][p]["seconds"]["median"] / fast["paths"][p]["seconds"]["median"] for p in PATHS}
    result = {
        "settings": fast["settings"],
        "machine": {k: v for k, v in fast["machine"].items() if k not in PER_RUN},
        "openblas": {**{k: fast["machine"][k] for k in PER_RUN},
                     "seconds": {p: fast["paths"][p]["seconds"] for p in PATHS}},
        "reference_blas": {**{k: slow["machine"][k] for k in PER_RUN},
                           "seconds": {p: slow["paths"][p]["seconds"] for p in PATHS}},
        "speedup": speedup,
    }
    if args.train_steps > 1:
        train_extra = ["--config", args.config] if args.config else []
        train_extra += ["--model-id", args.model] if args.model else []
        result["train"] = {"openblas": run_train(args.train_steps, train_extra, openblas=True),
                           "reference_blas": run_train(args.train_steps, train_extra, openblas=False)}
        result["train"]["speedup"] = result["train"]["reference_blas"]["step_s"] / result["train"]["openblas"]["step_s"]
    goal_value = result["train"]["speedup"] if "train" in result else speedup["step"]
    result["goal"] = {"measure": "mlx-grpo train step" if "train" in result else "bench whole step",
                      "target": GOAL, "measured": goal_value, "met": goal_value >= GOAL}

    from rich.console import Console
    from rich.table import Table

    s = fast["settings"]
    console = Console()
    table = Table(title=f"OpenBLAS vs reference BLAS: model {s['model']}, {s['batch_size']} x {s['group_size']}, "
                        f"{s['completion_length']} new tokens, {'LoRA' if s['use_lora'] else 'full'}, "
                        f"beta {s['beta']}, {s['dtype']} (median seconds of {s['repetitions']})",
                  title_justify="left")
    for header in ("path", "reference BLAS", "OpenBLAS", "speedup"):
        table.add_column(header, justify="left" if header == "path" else "right")
    table.add_row("fp32 matmul GFLOP/s", f"{slow['machine']['matmul_fp32_gflops']:.0f}",
                  f"{fast['machine']['matmul_fp32_gflops']:.0f}",
                  f"{fast['machine']['matmul_fp32_gflops'] / slow['machine']['matmul_fp32_gflops']:.1f}x")
    for p in PATHS:
        table.add_row(fast["paths"][p]["description"], f"{slow['paths'][p]['seconds']['median']:.3f}",
                      f"{fast['paths'][p]['seconds']['median']:.3f}", f"{speedup[p]:.1f}x")
    if "train" in result:
        t = result["train"]
        table.add_row("mlx-grpo train: timing/step_s", f"{t['reference_blas']['step_s']:.3f}",
                      f"{t['openblas']['step_s']:.3f}", f"{t['speedup']:.1f}x")
        if t["openblas"]["loop_s"] and t["reference_blas"]["loop_s"]:
            table.add_row("mlx-grpo train: whole loop per step", f"{t['reference_blas']['loop_s']:.3f}",
                          f"{t['openblas']['loop_s']:.3f}",
                          f"{t['reference_blas']['loop_s'] / t['openblas']['loop_s']:.1f}x")
    console.print(table)
    goal = result["goal"]
    verdict = "[green]met[/green]" if goal["met"] else "[red]not met[/red]"
    console.print(f"{goal['measure']} speedup {goal['measured']:.1f}x (goal >= {GOAL:g}x): {verdict}")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
