"""`mlx-grpo plan [CONFIG] [--memory 16GB]`: will this run fit in memory, and what would make it fit."""

from __future__ import annotations

import argparse
import json
import sys

USES_MLX = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", help="YAML run config (default: the built-in default run)")
    parser.add_argument("--memory", metavar="SIZE",
                        help="plan for an Apple-silicon Mac with this much unified memory (e.g. 16GB), against "
                             "its recommended working set; default: this machine")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key (e.g. --set max_generation_steps=1024)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..config.train_config import load_config
    from ..config.typed_yaml import parse_override
    from ..planning.fitting import make_plan
    from ..planning.plan import GB

    overrides = dict(parse_override(text) for text in args.overrides)
    config = load_config(args.config, overrides)
    base_dir = Path(args.config).resolve().parent if args.config else Path.cwd()
    verdict, facts = make_plan(config, base_dir, args.memory)
    if facts.get("dataset_unread"):  # planned at max_prompt_length; the run would stop at this
        print(f"note: the dataset could not be read ({facts['dataset_unread']}); prompts planned at max_prompt_length, "
              "and train will refuse it", file=sys.stderr)
    if args.json:
        print(json.dumps({**facts, "budget_gb": round(verdict.budget / GB, 2), "fits": verdict.fits,
                          "configured": verdict.configured.as_gb(),
                          "fitting_settings": None if verdict.fitting is None else vars(verdict.fitting),
                          "fitting": None if verdict.fitting_peaks is None else verdict.fitting_peaks.as_gb(),
                          "other_changes": verdict.other_changes}, indent=2))
    else:
        print(format_plan(verdict, facts))
    return 0 if verdict.fits else 1


def base_precision(facts: dict) -> str:
    if facts.get("dequantized"):
        return " (quantized base dequantized at load)"
    return f", {facts['bits']}-bit" if facts.get("bits") else ""


def format_plan(verdict, facts: dict) -> str:
    from ..common.units import count_text
    from ..common.units import gb_text as gb
    from ..planning.fitting import reference_text

    peaks = verdict.configured
    lines = [
        f"model     {facts['model']}: {count_text(facts['parameters'])} parameters, {facts['layers']} layers, "
        f"vocabulary {facts['vocab']:,}, {facts['dtype']}{base_precision(facts)} on {facts['machine']}",
        f"batch     {facts['prompts']} prompts x {facts['group_size']} completions, prompts <= "
        f"{facts['prompt_length']} tokens ({facts['prompt_length_from']}), completions <= "
        f"{facts['completion_length']} tokens",
        f"memory    {gb(verdict.budget)} ({verdict.budget_source})",
        "",
        f"{'phase':<11}{'peak':>10}",
        f"{'weights':<11}{gb(peaks.weights):>10}",
        f"{'load':<11}{gb(peaks.load):>10}   while loading: the weights + the largest tensor",
        f"{'resident':<11}{gb(peaks.resident):>10}   weights + trainable state kept all run",
        f"{'rollout':<11}{gb(peaks.rollout):>10}   KV cache of every completion + sampling",
        f"{'reference':<11}{reference_text(peaks.reference, facts):>10}",
        f"{'update':<11}{gb(peaks.update):>10}",
        *([f"{'eval':<11}{gb(peaks.evaluation):>10}   held-out rows, {facts['eval_rows']} decoded at a time"]
          if peaks.evaluation else []),
        "",
    ]
    settings = verdict.describe(verdict.settings)
    if verdict.fits:
        lines.append(f"fits: peak {gb(peaks.peak)} of {gb(verdict.budget)} with {settings}")
    elif verdict.fitting is not None:
        lines.append(f"does not fit: peak {gb(peaks.peak)} of {gb(verdict.budget)} with {settings}")
        lines.append(f"fits with {verdict.describe(verdict.fitting)}: peak {gb(verdict.fitting_peaks.peak)}")
    else:
        lines.append(f"does not fit: peak {gb(peaks.peak)} of {gb(verdict.budget)}, even one completion at a time "
                     f"with 32-position head chunks and grad_checkpoint")
        if verdict.other_changes:
            lines.append("it would fit with: " + "; or ".join(verdict.other_changes))
    return "\n".join(lines)
