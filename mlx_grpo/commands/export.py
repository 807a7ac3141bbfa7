"""`mlx-grpo export RUN_DIR [--step N] --out DIR [--fuse]`: a run's checkpoint as a Hugging Face model
directory that `mlx_lm.generate` and `mlx_lm.server` load as it is."""

from __future__ import annotations

import argparse
import shlex

USES_MLX = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="run directory (holds checkpoints/step_<N>)")
    parser.add_argument("--out", required=True, metavar="DIR", help="new (or empty) directory to write the model to")
    parser.add_argument("--step", type=int, default=None, metavar="N",
                        help="export the checkpoint of step N (default: the latest)")
    parser.add_argument("--fuse", action="store_true",
                        help="LoRA runs: fold the adapters into the weights (default: base weights plus "
                             "adapters.safetensors, loaded with --adapter-path DIR)")
    parser.add_argument("--float32", action="store_true",
                        help="write float32 weights (default: the base model's own dtype, e.g. bfloat16, so the "
                             "export is the size of its source)")


def example_prompt(run_dir) -> str | None:
    """A prompt in the form the run trained on, for the `try:` line: the built-in task's own format (its
    operands are zero-padded: '012+007=', which the model answers, where '12+7=' gets nonsense), else the
    prompt of the run's first logged sample when it is one line."""
    import json

    from ..tasks.arithmetic import make_row
    from ..telemetry.rundir.layout import RunPaths
    from ..telemetry.rundir.writer import read_run_info

    info = read_run_info(run_dir)
    if info is not None and (info.config or {}).get("dataset", "arithmetic") == "arithmetic":
        return make_row(12, 7)["prompt"]
    try:
        with open(RunPaths(run_dir).samples, encoding="utf-8") as f:
            prompt = json.loads(f.readline()).get("prompt")
    except (OSError, ValueError, AttributeError):
        return None
    return prompt if isinstance(prompt, str) and "\n" not in prompt and len(prompt) <= 200 else None


def has_chat_template(model_dir) -> bool:
    import json

    if (model_dir / "chat_template.jinja").is_file():
        return True
    try:
        return bool(json.loads((model_dir / "tokenizer_config.json").read_text()).get("chat_template"))
    except (OSError, ValueError):
        return False


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..common.errors import UserError
    from ..run.export import export_model
    from ..telemetry.rundir.layout import RunPaths

    run_dir = Path(args.run_dir)
    if not RunPaths(run_dir).run_json.is_file():
        raise UserError(f"{run_dir}: not a run directory (no run.json)")
    summary = export_model(run_dir, Path(args.out), args.step, args.fuse, args.float32)
    what = ("adapters fused into the weights" if summary["fused"] else
            "base weights plus adapters (mlx_lm: --adapter-path " + summary["out"] + ")" if summary["use_lora"] else
            "fully fine-tuned weights")
    print(f"exported step {summary['step']} of {run_dir} to {summary['out']}: {what}, {summary['dtype']}")
    prompt, system = example_prompt(run_dir), summary.get("system_prompt")
    if system and not (summary["use_chat_template"] and has_chat_template(Path(summary["out"]))):
        # the run put the system prompt before the prompt as plain text (data.render_prompt): so does the try line
        prompt, system = (f"{system}\n{prompt}" if prompt else None), None
    print(f"try: mlx_lm.generate --model {summary['out']}"
          + (f" --adapter-path {summary['out']}" if summary["use_lora"] and not summary["fused"] else "")
          + (f" --system-prompt {shlex.quote(system)}" if system else "")
          + (f" --prompt {shlex.quote(prompt)}" if prompt else ""))
    return 0
