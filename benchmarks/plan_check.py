"""The memory plan's prediction for each phase of a run config, against the peak its step measures.

The plan takes prompts at the dataset's longest (tokenized at start) and completions at their budget; the
measured steps are the trainer's own (`Trainer.step` in the benchmark's fixed-shape workload: prompts of
exactly that longest length, every completion running its whole budget), so both sides are at the bound.
MLX's peak counter is exact on the CPU backend too.

    python benchmarks/plan_check.py configs/my_run.yaml --set batch_size=4 --steps 2
    python benchmarks/plan_check.py --preset qwen2.5-1.5b --layers 4 --set use_lora=true \\
        --set batch_size=2 --set num_generations=4 --set max_generation_steps=128 --steps 1
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mlx_grpo.config.train_config import load_config
from mlx_grpo.config.typed_yaml import parse_override
from mlx_grpo.measuring.workload import Workload
from mlx_grpo.planning.fitting import longest_prompt_tokens, make_plan
from mlx_grpo.planning.plan import GB
from mlx_grpo.planning.presets import cached_preset_model

PHASES = {"rollout": "rollout", "reference": "ref", "update": "update"}  # plan name -> trainer phase


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--preset", metavar="NAME", help="train a random-weight model of this published shape "
                        "(mlx_grpo/planning/presets.py), as `mlx-grpo bench --preset` does")
    parser.add_argument("--layers", type=int, help="with --preset: keep only the first LAYERS blocks")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--output", help="also write the JSON report here")
    args = parser.parse_args()

    overrides = dict(parse_override(text) for text in args.overrides)
    if args.preset:
        overrides["model_id"] = str(cached_preset_model(args.preset, args.layers))
    config = load_config(args.config, overrides)
    base_dir = Path(args.config).resolve().parent if args.config else Path.cwd()
    verdict, facts = make_plan(config, base_dir)
    predicted = verdict.configured
    prompt_length = longest_prompt_tokens(config, base_dir)[0] or config.max_prompt_length
    if config.micro_batch_size == "auto":
        config = load_config(args.config, {**overrides, "micro_batch_size": verdict.settings.micro_batch_size})
    workload = Workload(config, base_dir, prompt_length)
    measured: dict[str, float] = {}
    for step in range(1, args.steps + 1):
        seconds, peaks = workload.step(step)
        for phase, value in peaks.items():
            measured[phase] = max(measured.get(phase, 0.0), value)
        print(f"step {step}: " + ", ".join(f"{p} {s:.1f} s" for p, s in seconds.items()), flush=True)
    rows = {}
    for name, key in PHASES.items():
        plan_gb, got = getattr(predicted, name) / GB, measured.get(key) or None  # 0: not run (beta 0)
        rows[name] = {"predicted_gb": round(plan_gb, 3), "measured_gb": None if got is None else round(got / GB, 3),
                      "over_measured": None if not got else round(plan_gb / (got / GB) - 1, 3)}
    report = {"model": facts["model"], "prompts": facts["prompts"], "group_size": facts["group_size"],
              "prompt_length": prompt_length, "prompt_length_from": facts["prompt_length_from"],
              "completion_length": facts["completion_length"], "settings": verdict.settings.describe(),
              "dtype": facts["dtype"], "dequantized": facts["dequantized"], "phases": rows}
    text = json.dumps(report, indent=2)
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n")


if __name__ == "__main__":
    import sys

    from mlx_grpo.planning.blas import reexec_with_openblas

    reexec_with_openblas([str(Path(__file__).resolve()), *sys.argv[1:]])  # OpenBLAS on Linux: ~20x the matmuls
    main()
