"""What monitoring costs a training step: every sink and the system sampler on, against the step itself.

Runs the default config (shortened) in-process with all telemetry on: run directory, TensorBoard,
system sampler, reward trackers, alert engine, samples, and W&B in offline mode when it is
installed. Each telemetry call of the training loop is timed where it happens, so the figure
is the share of the loop's wall time spent on monitoring, measured within one run and
therefore immune to load that changes between separate runs (this machine is often shared).

    python benchmarks/bench_telemetry.py --steps 60
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

if __name__ == "__main__":
    from mlx_grpo.planning.blas import reexec_with_openblas

    # OpenBLAS only helps when preloaded at process start: re-exec once, before MLX loads.
    reexec_with_openblas([str(Path(__file__).resolve()), *sys.argv[1:]])

from mlx_grpo import trainer as trainer_module
from mlx_grpo.config.train_config import load_config
from mlx_grpo.run import loop as run_module
from mlx_grpo.telemetry import recorder, sinks
from mlx_grpo.telemetry.alerts import engine as alerts
from mlx_grpo.telemetry.metrics import reward_stats, system

SPENT: dict[str, float] = defaultdict(float)


def timed(owner, name: str, label: str) -> None:
    """Wrap owner.name so its wall time adds to SPENT[label]."""
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            SPENT[label] += time.perf_counter() - start

    setattr(owner, name, wrapper)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--json", action="store_true", help="print only JSON")
    args = parser.parse_args(argv)

    for owner, name, label in [
        (sinks.SinkSet, "handle", "sinks.handle (JSONL + TensorBoard + W&B queue, every event)"),
        # the step's metric record: rewards, lengths, repetition rate, bimodality, ... from the batch's arrays
        (recorder, "step_record", "step record (metrics from the batch)"),
        (reward_stats.RewardTracker, "update", "reward tracker"),
        (reward_stats.RewardTracker, "histograms", "histograms"),
        (reward_stats.ThroughputTracker, "update", "throughput trackers"),
        (alerts.AlertEngine, "check", "alert engine"),
        (system.SystemSampler, "snapshot", "system sampler snapshot"),
    ]:
        timed(owner, name, label)
    timed(trainer_module.Trainer, "step", "training step (rollout, rewards, update)")

    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("WANDB_MODE", "offline")
        os.environ.setdefault("WANDB_DIR", tmp)
        try:
            import wandb  # noqa: F401

            use_wandb = True
        except ImportError:
            use_wandb = False
        config = load_config(None, {"num_steps": args.steps, "monitoring_dir": tmp, "eval_every": 0,
                                    "checkpoint_every": 0, "tensorboard": True, "wandb": use_wandb,
                                    "histogram_every": 10})
        start = time.perf_counter()
        run_module.train(config, Path(tmp))
        loop_s = time.perf_counter() - start

    step_s = SPENT.pop("training step (rollout, rewards, update)")
    telemetry_s = sum(SPENT.values())
    result = {
        "steps": args.steps,
        "wandb_offline": use_wandb,
        "step_seconds_total": step_s,
        "telemetry_seconds_total": telemetry_s,
        "overhead_pct_of_step": 100 * telemetry_s / step_s,
        "per_call_ms_per_step": {k: 1000 * v / args.steps for k, v in sorted(SPENT.items())},
        "loop_seconds_total": loop_s,
        "load_average": os.getloadavg()[0],
    }
    if not args.json:
        print(f"{'telemetry call':<50} {'ms/step':>8}")
        for label, ms in result["per_call_ms_per_step"].items():
            print(f"{label:<50} {ms:>8.2f}")
        print(f"{'all telemetry':<50} {1000 * telemetry_s / args.steps:>8.2f}")
        print(f"{'training step':<50} {1000 * step_s / args.steps:>8.1f}")
        print(f"overhead: {result['overhead_pct_of_step']:.2f}% of step time (goal <= 1%)")
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
