"""Does GRPO make the shipped model better? Held-out greedy accuracy before and after a run.

Runs the default config (or the one given), then evaluates the starting model and the
final checkpoint on the same large held-out set (default 1,000 prompts, so the
estimate's noise is about +-1.5 points), and prints a table plus JSON.

    python benchmarks/bench_learning.py                # the default 200-step run
    python benchmarks/bench_learning.py --steps 100 --seeds 0 1
    python benchmarks/bench_learning.py --seeds 0 1 2 --set beta=0   # any config key

Each run's own metrics.jsonl holds its held-out curve (eval/accuracy at step 1, every eval_every
steps and at the end); the command it prints at the end draws the runs' curves overlaid.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import yaml

if __name__ == "__main__":
    from mlx_grpo.planning.blas import reexec_with_openblas

    # OpenBLAS only helps when preloaded at process start: re-exec once, before MLX loads.
    reexec_with_openblas([str(Path(__file__).resolve()), *sys.argv[1:]])

from mlx_grpo.checkpoint import latest_checkpoint
from mlx_grpo.config.train_config import load_config
from mlx_grpo.evaluate import evaluate
from mlx_grpo.models.policy import load_policy_for_training
from mlx_grpo.run.loop import train
from mlx_grpo.tasks import arithmetic


def heldout_accuracy(config, base_dir: Path, rows: list[dict], checkpoint: Path | None) -> float:
    policy = load_policy_for_training(config, base_dir)
    if checkpoint is not None:
        import mlx.core as mx

        weights = checkpoint / ("adapters.safetensors" if config.use_lora else "model.safetensors")
        policy.model.load_weights(list(mx.load(str(weights)).items()), strict=False)
    return evaluate(policy.model, policy.tokenizer, rows, config, policy.eos_ids, policy.pad_id).accuracy


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", help="run config (default: the built-in default)")
    parser.add_argument("--steps", type=int, help="override num_steps")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--eval-prompts", type=int, default=1000)
    parser.add_argument("--out", default="runs/bench_learning", help="where the runs go")
    parser.add_argument("--json", action="store_true", help="print only JSON")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key (YAML value), e.g. --set beta=0 --set model_id=/path")
    args = parser.parse_args(argv)
    extra = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set expects KEY=VALUE, got {item!r}")
        extra[key.strip()] = yaml.safe_load(value)

    results = []
    for seed in args.seeds:
        overrides = {"seed": seed, "monitoring_dir": args.out, "tensorboard": False,
                     "run_name": f"learning-seed{seed}", **extra}
        if args.steps:
            overrides["num_steps"] = args.steps
        config = load_config(args.config, overrides)
        base_dir = Path.cwd()
        rows = arithmetic.make_split("heldout", args.eval_prompts, seed=12345)
        before = heldout_accuracy(config, base_dir, rows, None)
        start = time.perf_counter()
        result = train(config, base_dir)
        seconds = time.perf_counter() - start
        after = heldout_accuracy(config, base_dir, rows, latest_checkpoint(Path(result["run_dir"]) / "checkpoints"))
        results.append({"seed": seed, "steps": config.num_steps, "before": before, "after": after,
                        "gain_points": 100 * (after - before), "train_seconds": seconds,
                        "run_dir": result["run_dir"]})

    summary = {"eval_prompts": args.eval_prompts, "runs": results,
               "mean_gain_points": sum(r["gain_points"] for r in results) / len(results),
               "min_gain_points": min(r["gain_points"] for r in results)}
    if not args.json:
        print(f"{'seed':>4} {'steps':>5} {'before':>7} {'after':>7} {'gain':>7} {'time':>7}")
        for r in results:
            print(f"{r['seed']:>4} {r['steps']:>5} {r['before']:>7.1%} {r['after']:>7.1%} "
                  f"{r['gain_points']:>+6.1f}p {r['train_seconds']:>6.0f}s")
        if len(results) > 1:
            mean = {k: sum(r[k] for r in results) / len(results) for k in ("before", "after", "train_seconds")}
            print(f"{'mean':>4} {'':>5} {mean['before']:>7.1%} {mean['after']:>7.1%} "
                  f"{summary['mean_gain_points']:>+6.1f}p {mean['train_seconds']:>6.0f}s "
                  f"(lowest gain {summary['min_gain_points']:+.1f}p)")
        print(f"held-out curves: mlx-grpo report {' '.join(r['run_dir'] for r in results)} --no-write --svg DIR")
    print(json.dumps(summary, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
