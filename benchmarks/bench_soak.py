"""Soak test: a long run on the default config, checking that memory stops growing after warm-up.

    python benchmarks/bench_soak.py                      # 1,000 steps of the default run
    python benchmarks/bench_soak.py --steps 2000 --json soak.json --keep runs/soak

Trains exactly as `mlx-grpo train` with no arguments would (the default config; only num_steps,
the run directory and W&B are set here), with evaluation every 25 steps and a checkpoint every 50
as usual, then reads the run's own metrics.jsonl: `system/process_rss_gb` (the process's resident
memory, sampled every second) and `system/accel_{active,cache}_gb` (MLX's memory in arrays and in
its buffer cache, read after each step). Growth is the median of the last `--window` steps minus
the median of the `--window` steps right after `--warmup`; the slope is a least-squares fit over
every step after warm-up. Exits 1 when RSS or MLX active memory grows by more than its margin.

On Linux it restarts itself once with the system OpenBLAS preloaded, as `mlx-grpo` does.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from mlx_grpo.planning import blas

MB = 1024 ** 2
GB = 1024 ** 3
SERIES = {"rss": "system/process_rss_gb", "mlx_active": "system/accel_active_gb", "mlx_cache": "system/accel_cache_gb"}


def preload_openblas() -> None:
    """Restart this script with OpenBLAS preloaded (it must be loaded before MLX to take effect)."""
    blas.reexec_with_openblas([str(Path(__file__).resolve()), *sys.argv[1:]])


def memory_growth(records: list[dict], warmup: int, window: int) -> dict[str, dict[str, float]]:
    """Per series: MB at the start (after warm-up) and at the end, growth, peak, slope in MB per 1,000 steps."""
    after = [r for r in records if r["step"] > warmup]
    if len(after) < 2 * window:
        raise SystemExit(f"bench_soak: need at least {2 * window} steps after a warm-up of {warmup}, "
                         f"have {len(after)}")
    out = {}
    for name, metric in SERIES.items():
        points = [(r["step"], r[metric] * GB / MB) for r in after if r.get(metric) is not None]
        if len(points) < 2 * window:
            continue  # not measured on this machine
        steps, mb = (np.array(v, dtype=float) for v in zip(*points))
        start, end = float(np.median(mb[:window])), float(np.median(mb[-window:]))
        slope = float(np.polyfit(steps, mb, 1)[0]) * 1000
        out[name] = {"start_mb": start, "end_mb": end, "growth_mb": end - start, "peak_mb": float(mb.max()),
                     "slope_mb_per_1000_steps": slope}
    return out


def run_soak(steps: int, run_root: Path) -> tuple[list[dict], float]:
    from mlx_grpo.config.train_config import load_config
    from mlx_grpo.run.loop import train

    config = load_config(None, {"num_steps": steps, "monitoring_dir": str(run_root), "run_name": "soak",
                                "wandb": False})
    t = time.perf_counter()
    result = train(config, Path.cwd())
    seconds = time.perf_counter() - t
    if result["status"] != "finished":
        raise SystemExit(f"bench_soak: the run ended {result['status']}")
    metrics = Path(result["run_dir"]) / "metrics.jsonl"
    return [json.loads(line) for line in metrics.read_text().splitlines()], seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=1000, help="training steps (default 1000)")
    parser.add_argument("--warmup", type=int, default=100, help="steps left out while caches fill (default 100)")
    parser.add_argument("--window", type=int, default=50, help="steps in each median (default 50)")
    parser.add_argument("--rss-margin-mb", type=float, default=64.0, help="allowed RSS growth (default 64)")
    parser.add_argument("--mlx-margin-mb", type=float, default=1.0, help="allowed MLX active growth (default 1)")
    parser.add_argument("--keep", type=Path, metavar="DIR", help="write the run here instead of a temporary folder")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the result as JSON")
    args = parser.parse_args(argv)

    if args.keep is not None:
        records, seconds = run_soak(args.steps, args.keep)
    else:
        with tempfile.TemporaryDirectory(prefix="mlx-grpo-soak-") as tmp:
            records, seconds = run_soak(args.steps, Path(tmp))
    growth = memory_growth(records, args.warmup, args.window)
    margins = {"rss": args.rss_margin_mb, "mlx_active": args.mlx_margin_mb}
    print(f"{args.steps} steps of the default run in {seconds / 60:.1f} min; warm-up {args.warmup} steps, "
          f"medians over {args.window} steps")
    print(f"{'memory':<12}{'start MB':>10}{'end MB':>10}{'growth MB':>11}{'peak MB':>10}{'MB/1k steps':>13}"
          f"{'margin MB':>11}")
    for name, g in growth.items():
        margin = f"{margins[name]:.0f}" if name in margins else "-"
        print(f"{name:<12}{g['start_mb']:>10.1f}{g['end_mb']:>10.1f}{g['growth_mb']:>+11.2f}{g['peak_mb']:>10.1f}"
              f"{g['slope_mb_per_1000_steps']:>+13.2f}{margin:>11}")
    failed = [name for name, margin in margins.items() if name in growth and growth[name]["growth_mb"] > margin]
    if args.json is not None:
        args.json.write_text(json.dumps({"steps": args.steps, "warmup": args.warmup, "window": args.window,
                                         "seconds": seconds, "margins_mb": margins, "growth": growth,
                                         "passed": not failed}, indent=2) + "\n")
    if failed:
        print(f"bench_soak: memory grew beyond its margin: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    preload_openblas()
    sys.exit(main())
