"""What the adaptive generation window saves on the default task.

    python benchmarks/bench_adaptive_window.py rollout              # rollout time per budget
    python benchmarks/bench_adaptive_window.py runs RUN_DIR...      # compare finished runs

`rollout` times one default-sized rollout (16 prompts x 8 samples, temperature 1) of the shipped
model at several budgets, interleaving the budgets so a busy machine slows them all alike; it
reports wall and process CPU seconds (CPU time is steadier when other processes share the cores)
and the fraction of completions the budget cut off. `runs` prints, per run directory, the mean and
median `timing/rollout_s`, the mean window, truncation, train accuracy over the last 50 steps and
held-out accuracy at each evaluation. For speed on Linux preload OpenBLAS (see the README).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def bench_rollout(budgets: list[int], reps: int) -> None:
    import mlx.core as mx
    from mlx_lm import load

    from mlx_grpo.models.policy import DEFAULT_MODEL_DIR
    from mlx_grpo.rollout import generate
    from mlx_grpo.sampling import SamplingSettings
    from mlx_grpo.tasks import arithmetic

    model, tokenizer = load(str(DEFAULT_MODEL_DIR))
    rows = arithmetic.make_split("train", 16 * reps, 0)
    eos = {tokenizer.eos_token_id}
    wall = {b: [] for b in budgets}
    cpu = {b: [] for b in budgets}
    cut = {b: [] for b in budgets}
    for rep in range(reps):
        prompts = [tokenizer.encode(r["prompt"]) for r in rows[rep * 16:(rep + 1) * 16]]
        shift = rep % len(budgets)
        for budget in budgets[shift:] + budgets[:shift]:
            t, c = time.perf_counter(), time.process_time()
            rollout = generate(model, prompts, 8, budget, eos, tokenizer.pad_token_id or 0, SamplingSettings(1.0),
                               mx.random.key(rep))
            wall[budget].append(time.perf_counter() - t)
            cpu[budget].append(time.process_time() - c)
            cut[budget].append(float(np.mean(rollout.truncated)))
    print(f"{'budget':>6} {'wall median s':>14} {'cpu median s':>13} {'truncated':>10}")
    for b in budgets:
        print(f"{b:>6} {np.median(wall[b]):>14.3f} {np.median(cpu[b]):>13.3f} {np.mean(cut[b]):>10.4f}")


def compare_runs(run_dirs: list[Path]) -> None:
    for run_dir in run_dirs:
        recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]

        def values(name: str) -> np.ndarray:
            return np.array([r[name] for r in recs if r.get(name) is not None], dtype=float)

        rollout, window = values("timing/rollout_s"), values("adaptive_window/current_window")
        evals = [(r["step"], round(r["eval/accuracy"], 3)) for r in recs if "eval/accuracy" in r]
        print(f"{run_dir.name}: {len(recs)} steps, rollout_s mean {rollout.mean():.3f} median "
              f"{np.median(rollout):.3f}, step_s mean {values('timing/step_s').mean():.3f}, "
              + (f"window mean {window.mean():.2f}, " if window.size else "window off, ")
              + f"clip_ratio {values('completions/truncated_frac').mean():.4f}, "
              f"accuracy/train last 50 {values('accuracy/train')[-50:].mean():.3f}, eval {evals}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    roll = sub.add_parser("rollout")
    roll.add_argument("--budgets", type=int, nargs="+", default=[24, 13, 12, 10, 9])
    roll.add_argument("--reps", type=int, default=30)
    runs = sub.add_parser("runs")
    runs.add_argument("run_dirs", type=Path, nargs="+")
    args = parser.parse_args()
    if args.command == "rollout":
        bench_rollout(args.budgets, args.reps)
    else:
        compare_runs(args.run_dirs)


if __name__ == "__main__":
    main()
