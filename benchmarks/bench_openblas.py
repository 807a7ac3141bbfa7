"""Training-step speed with the system OpenBLAS preloaded against MLX's bundled reference BLAS.

    python benchmarks/bench_openblas.py                 # default config: shipped model, 16 x 8, full, beta 0.04
    python benchmarks/bench_openblas.py --model DIR --repetitions 5

Runs `mlx-grpo bench --only rollout,update,step` twice in fresh processes, once as the command
normally runs (OpenBLAS preloaded when installed) and once with MLX_GRPO_OPENBLAS=0, and reports
the speedup of each path; the goal for the whole training step is at least 3x. Prints a table and
then JSON. Linux only: on macOS MLX uses Accelerate and there is nothing to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from mlx_grpo import blas

GOAL = 3.0
PATHS = ("rollout", "update", "step")
PER_RUN = ("blas", "blas_library", "matmul_fp32_gflops", "load_average")  # machine fields that differ per child


def run_child(extra: list[str], openblas: bool) -> dict:
    env = {**os.environ, blas.SWITCH: "1" if openblas else "0"}
    if not openblas:
        # A preload inherited from our own caller would defeat the comparison.
        env["LD_PRELOAD"] = ":".join(p for p in env.get("LD_PRELOAD", "").split(":") if p and "openblas" not in p)
    command = [sys.executable, "-m", "mlx_grpo.cli", "bench", "--only", ",".join(PATHS), "--no-memory", "--json",
               *extra]
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit(f"bench_openblas: `{' '.join(command)}` failed:\n{result.stderr}")
    return json.loads(result.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="model directory (default: the shipped model)")
    parser.add_argument("--config", metavar="FILE", help="run config to take model and shapes from")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
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

    fast = run_child(extra, openblas=True)
    slow = run_child(extra, openblas=False)
    if fast["machine"]["blas"] != "OpenBLAS" or slow["machine"]["blas"] != "reference BLAS":
        sys.exit(f"bench_openblas: expected OpenBLAS vs reference BLAS, got "
                 f"{fast['machine']['blas']} vs {slow['machine']['blas']}")

    speedup = {p: slow["paths"][p]["seconds"]["median"] / fast["paths"][p]["seconds"]["median"] for p in PATHS}
    result = {
        "settings": fast["settings"],
        "machine": {k: v for k, v in fast["machine"].items() if k not in PER_RUN},
        "openblas": {**{k: fast["machine"][k] for k in PER_RUN}, "seconds": {p: fast["paths"][p]["seconds"] for p in PATHS}},
        "reference_blas": {**{k: slow["machine"][k] for k in PER_RUN},
                           "seconds": {p: slow["paths"][p]["seconds"] for p in PATHS}},
        "speedup": speedup,
        "goal": {"path": "step", "target": GOAL, "met": speedup["step"] >= GOAL},
    }

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
    console.print(table)
    verdict = "[green]met[/green]" if result["goal"]["met"] else "[red]not met[/red]"
    console.print(f"training step speedup {speedup['step']:.1f}x (goal >= {GOAL:g}x): {verdict}")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
