"""`mlx-grpo replay` on a finished run: seconds to re-score every kept completion with one reward function
removed, against the goal of 10 s on a default run (200 steps x 16 x 8 completions), and what completions/
costs on disk.

    mlx-grpo train --run-name default                       # a default run keeps its completions
    python benchmarks/bench_replay.py runs/default [--without digit_match] [--json]

Wall time is the slow figure on a shared machine; CPU time is printed beside it, and `uptime`'s load.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

GOAL_S = 10.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--without", default="digit_match", help="the reward function removed (default digit_match)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    wall, cpu = time.perf_counter(), time.process_time()
    from mlx_grpo.rewards.loading import load_reward_functions
    from mlx_grpo.run.replay import render, replay, run_settings
    from mlx_grpo.telemetry.analysis.report import load_run
    from mlx_grpo.telemetry.rundir.completions import completion_steps
    from mlx_grpo.telemetry.rundir.layout import RunPaths

    _, metrics, _, _ = load_run(args.run_dir)
    rewards, _, _, group_size, scale, base_dir = run_settings(args.run_dir)
    functions = load_reward_functions([(n, w) for n, w in rewards if n != args.without], base_dir)
    result = replay(args.run_dir, functions, group_size, scale, metrics=metrics, weights_before=dict(rewards))
    render(result)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    sizes = [RunPaths(args.run_dir).completions_step(s).stat().st_size for s in completion_steps(args.run_dir)]
    out = {"completions": result.completions, "steps": result.steps, "replay_wall_s": round(wall, 2),
           "replay_cpu_s": round(cpu, 2), "goal_s": GOAL_S, "met": wall < GOAL_S,
           "groups_reranked": len(result.reranked), "sign_flips": len(result.flips),
           "completions_bytes_per_step": round(sum(sizes) / max(1, len(sizes))), "completions_bytes": sum(sizes),
           "load_average": os.getloadavg()[0]}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"replay of {out['completions']} completions over {out['steps']} steps without {args.without}: "
              f"{wall:.1f} s wall ({cpu:.1f} s CPU; goal {GOAL_S:.0f} s: {'met' if out['met'] else 'MISSED'}), "
              f"load {out['load_average']:.1f}")
        print(f"completions/: {out['completions_bytes'] / 1e3:.0f} KB, {out['completions_bytes_per_step']} bytes "
              f"per step")


if __name__ == "__main__":
    main()
