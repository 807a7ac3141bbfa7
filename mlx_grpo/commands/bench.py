"""`mlx-grpo bench`: tokens/s of rollout, update and whole step, next to plain-MLX baselines."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..common.errors import UserError

USES_MLX = True

# bench flag -> run-config key it overrides
CONFIG_FLAGS = {
    "model": "model_id",
    "batch_size": "batch_size",
    "group_size": "num_generations",
    "completion_length": "max_generation_steps",
    "lora": "use_lora",
    "dtype": "dtype",
    "beta": "beta",
    "seed": "seed",
}

# --preset's defaults for the flags not given: LoRA on 2 prompts x 4 completions (issue 28's shape)
PRESET_DEFAULTS = {"use_lora": True, "batch_size": 2, "num_generations": 4}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE",
                        help="take model, shapes, LoRA, dtype, beta and loss settings from a run config")
    parser.add_argument("--model", "--model-id", metavar="MODEL", help="model directory (train's --model-id; default: "
                                                                 "the shipped model)")
    parser.add_argument("--preset", metavar="NAME",
                        help="a random-weight model of a published shape (mlx-grpo plan's presets: qwen2.5-0.5b, "
                             "qwen2.5-1.5b, llama-3.2-1b...), written once under ~/.cache/mlx-grpo/presets")
    parser.add_argument("--layers", type=int, metavar="N", help="with --preset: keep only the first N blocks")
    parser.add_argument("--batch-size", type=int, metavar="N", help="prompts per step (default: 16)")
    parser.add_argument("--group-size", "--num-generations", type=int, metavar="N",
                        help="completions per prompt (train's --num-generations; default: 8)")
    parser.add_argument("--prompt-length", type=int, default=9, metavar="N", help="tokens per prompt (default: 9)")
    parser.add_argument("--completion-length", "--max-generation-steps", type=int, metavar="N",
                        help="new tokens per completion (train's --max-generation-steps; default: 24)")
    parser.add_argument("--lora", action=argparse.BooleanOptionalAction, default=None,
                        help="train LoRA adapters instead of every weight (default: full)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                        help="default: the config's, auto (bfloat16 for LoRA on a Mac's GPU, float32 otherwise)")
    parser.add_argument("--beta", type=float, metavar="FLOAT",
                        help="KL weight; 0 skips the reference pass (default: 0.04)")
    parser.add_argument("--seed", type=int, metavar="N", help="seed for prompts and sampling (default: 0)")
    parser.add_argument("--repetitions", type=int, default=5, metavar="N", help="timed repetitions (default: 5)")
    parser.add_argument("--warmup", type=int, default=1, metavar="N",
                        help="unreported warm-up repetitions (default: 1)")
    parser.add_argument("--sequential-sample", type=int, default=8, metavar="N",
                        help="sequences the one-at-a-time baseline decodes (default: 8)")
    parser.add_argument("--only", metavar="PATH[,PATH]",
                        help="measure only these paths (rollout, rollout_ceiling, rollout_sequential, reward, "
                             "reference, update, update_ceiling, step)")
    parser.add_argument("--no-memory", dest="memory", action="store_false",
                        help="skip the LoRA peak-memory comparison (beta > 0 vs beta = 0)")
    parser.add_argument("--json", action="store_true", help="print the JSON report instead of the table")
    parser.add_argument("--output", metavar="FILE", help="also write the JSON report to FILE")


def preset_directory(args: argparse.Namespace) -> Path:
    """The model directory of --preset cut to --layers blocks, written on first use."""
    from ..planning.presets import cached_preset_model

    if args.model:
        raise UserError("bench: give --model or --preset, not both")
    return cached_preset_model(args.preset, args.layers)


def options_from_args(args: argparse.Namespace):
    from ..config.train_config import load_config
    from ..measuring.benchmark import PATHS, BenchOptions

    overrides = {key: getattr(args, flag) for flag, key in CONFIG_FLAGS.items() if getattr(args, flag) is not None}
    if args.preset:
        overrides["model_id"] = str(preset_directory(args))
        # a real model's shape: what its users train (LoRA, a few prompts per step), unless told otherwise
        for key, value in PRESET_DEFAULTS.items():
            overrides.setdefault(key, value)
    elif args.layers is not None:
        raise UserError("bench: --layers needs --preset")
    config = load_config(args.config, overrides)
    base_dir = Path(args.config).resolve().parent if args.config else Path.cwd()
    paths = tuple(p.strip() for p in args.only.split(",") if p.strip()) if args.only else PATHS
    return BenchOptions(config=config, base_dir=base_dir, prompt_length=args.prompt_length,
                        repetitions=args.repetitions, warmup=args.warmup,
                        sequential_sample=args.sequential_sample, paths=paths, memory=args.memory)


def run(args: argparse.Namespace) -> int:
    from ..measuring.benchmark import run_bench

    report = run_bench(options_from_args(args))
    text = json.dumps(report, indent=2)
    if args.output:
        Path(args.output).write_text(text + "\n")
    if args.json:
        print(text)
    else:
        print_report(report)
    return 0


# ----------------------------------------------------------------------------- the table

def matmul_line(machine: dict) -> str:
    """Where the fp32 matmul ran: on a Mac's GPU it is Metal's, not the BLAS (Accelerate serves MLX's CPU ops)."""
    speed = f"fp32 matmul {machine['matmul_fp32_gflops']:.0f} GFLOP/s"
    if machine["device"] == "gpu":
        return f"matmul on the Metal GPU ({speed}); BLAS {machine['blas']} for CPU operations"
    return f"matmul on the CPU, BLAS {machine['blas']} ({speed})"


def _gb(n: float) -> str:
    """Bytes in GB (1e9, mlx_grpo/common/units.py), as everywhere else."""
    return f"{n / 1e9:.2f} GB"


def roofline_table(report: dict, roof: dict):
    """Each path's FLOPs, achieved FLOP/s and share of what the machine allows."""
    from rich import box
    from rich.table import Table

    bandwidth = roof["bandwidth_bytes_per_s"]
    title = (f"roofline: fp32 matmul peak {roof['peak_flops_per_s'] / 1e9:,.0f} GFLOP/s, memory "
             f"{bandwidth / 1e9:,.1f} GB/s ({roof['bandwidth_source']})")
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    for header in ("path", "GFLOP", "GB read", "GFLOP/s", "of peak", "of roofline", "bound"):
        table.add_column(header, justify="left" if header == "path" else "right")
    for name, r in roof["paths"].items():
        table.add_row(report["paths"][name]["description"], f"{r['flops'] / 1e9:,.1f}",
                      f"{r['bytes'] / 1e9:,.2f}" if r["bytes"] else "", f"{r['achieved_flops_per_s'] / 1e9:,.1f}",
                      f"{r['share_of_peak']:.2f}", f"{r['share_of_attainable']:.2f}", r["bound"])
    return table


def floor_line(roof: dict) -> str:
    """The step-time floor on this machine: each phase's work at the roofline (the fp32 matmul peak measured
    here, the bandwidth as the roofline's title says), and the measured step against it."""
    floors = roof["floor_seconds"]
    phases = ", ".join(f"{name} {seconds:.3g} s" for name, seconds in floors.items() if name != "step")
    line = (f"step-time floor here: {floors['step']:.3g} s ({phases}; each phase's FLOPs at the measured fp32 "
            f"matmul peak, decode's reads at {roof['bandwidth_bytes_per_s'] / 1e9:,.0f} GB/s, "
            f"{roof['bandwidth_source']})")
    step = roof["paths"].get("step")
    if step:
        line += f"; the measured step took {step['seconds']:.3g} s, {step['seconds'] / floors['step']:.1f}x the floor"
    return line


def vocabulary_lines(vocabulary: dict | None) -> list[str]:
    """Which bound holds for the reference and update: the streamed head's sweeps over the vocabulary
    (exponentials and reductions, not FLOPs) against the matmuls around them."""
    if not vocabulary or not vocabulary["paths"]:
        return []
    per_logit, matmul = vocabulary["seconds_per_logit"], vocabulary["matmul_seconds_per_logit"]
    lines = [f"the head's sweep over the vocabulary (maximum, exponentials, sum; not FLOPs): "
             f"{per_logit * 1e9:.2f} ns per logit, {per_logit / matmul:.2f}x its matmul's time per logit "
             f"(one [{vocabulary['block'][0]}, {vocabulary['block'][1]}] block, best of 5); "
             f"{vocabulary['update_seconds_per_logit'] * 1e9:.2f} ns per logit as the update runs it (under mx.grad)"]
    for name, v in vocabulary["paths"].items():
        lines.append(f"  {name}: {v['seconds']:.2f} s of it for {v['logits'] / 1e6:,.0f}M logits; "
                     f"the rest of the {name} at {v['share_of_peak_without']:.2f} of the matmul peak")
    return lines


def print_report(report: dict, console=None) -> None:
    from ..telemetry.output import output_console

    console = console or output_console()
    s, m = report["settings"], report["machine"]
    mode = "LoRA" if s["use_lora"] else "full fine-tuning"
    console.print(f"[bold]mlx-grpo bench[/bold]  model {s['model']} ({s['parameters']:,} parameters, "
                  f"{s['trainable_parameters']:,} trainable, {mode}), {s['dtype']}, beta {s['beta']}")
    console.print(f"shapes: {s['batch_size']} prompts x {s['group_size']} completions, "
                  f"{s['prompt_length']} prompt + {s['completion_length']} new tokens; "
                  f"{s['repetitions']} repetitions after {s['warmup']} warm-up")
    load = f", load average {m['load_average']:.1f}" if m["load_average"] is not None else ""
    console.print(f"machine: {m['cpu']}, {m['physical_cores']} cores, {_gb(m['ram_bytes'])} RAM, {m['os']}{load}")
    console.print(f"MLX {m['mlx']}, mlx-lm {m['mlx_lm']}: {matmul_line(m)}")
    if s.get("wired_limit_bytes"):
        console.print(f"wired limit {_gb(s['wired_limit_bytes'])} (as `mlx-grpo train` sets it)")
    _print_tables(report, console)
    own = report["ratios"].get("step_vs_own_phases")
    if own:
        phases = report["paths"]["step"]["phases"]
        listed = ", ".join(f"{name} {seconds:.3f}" for name, seconds in phases.items())
        console.print(f"inside the trainer step (its own timers, s): {listed}; step time over their sum "
                      f"{own['median']:.3f} ({own['min']:.3f} - {own['max']:.3f})")

    peaks = report["paths"].get("step", {}).get("peak_memory_bytes")
    if peaks:
        listed = ", ".join(f"{name} {_gb(value)}" for name, value in peaks.items())
        console.print(f"peak memory per phase of the trainer step (weights included): {listed}")
    mem = report["memory"]
    if mem:
        console.print(f"peak memory, one LoRA step: beta {mem['beta']:g} {_gb(mem['lora_beta_peak_bytes'])}, "
                      f"beta 0 {_gb(mem['lora_beta0_peak_bytes'])} (ratio {mem['ratio']:.3f}); "
                      f"reference + update phase alone {_gb(mem['lora_beta_train_peak_bytes'])} vs "
                      f"{_gb(mem['lora_beta0_train_peak_bytes'])} (ratio {mem['train_ratio']:.3f})")
    bw = report["bandwidth"]
    if bw:
        console.print(f"{bw['chip']}: rollout at {bw['percent_of_ceiling']:.0f}% of the memory-bandwidth ceiling "
                      f"({bw['ceiling_tokens_per_s']:,.0f} tokens/s at {bw['bandwidth_gb_s']:g} GB/s)")
    else:
        console.print("memory-bandwidth ceiling: only computed on Apple Silicon (chip table in "
                      "mlx_grpo/planning/chips.py)")
    console.print(f"[dim]measured in {report['total_seconds']:.0f} s[/dim]")


def _print_tables(report: dict, console) -> None:
    """Throughput per path, the roofline, and the goals."""
    from rich import box
    from rich.table import Table

    table = Table(title="throughput, median of repetitions", title_justify="left", box=box.SIMPLE_HEAD)
    for header in ("path", "tokens", "seconds", "tokens/s", "min - max"):
        table.add_column(header, justify="left" if header == "path" else "right")
    for p in report["paths"].values():
        tps = p["tokens_per_s"]
        table.add_row(p["description"], f"{p['tokens']:,}", f"{p['seconds']['median']:.3f}",
                      f"{tps['median']:,.0f}", f"{tps['min']:,.0f} - {tps['max']:,.0f}")
    console.print(table)

    roof = report.get("roofline")
    if roof:
        console.print(roofline_table(report, roof))
        for line in vocabulary_lines(roof.get("vocabulary")):
            console.print(line)
        console.print(floor_line(roof))
    if report["goals"]:
        goals = Table(title="goals", title_justify="left", box=box.SIMPLE_HEAD)
        for header in ("ratio", "median", "min - max", "best", "target", ""):
            goals.add_column(header, justify="left" if header in ("ratio", "") else "right")
        for g in report["goals"]:
            r = report["ratios"].get(g["name"])
            spread = f"{r['min']:.2f} - {r['max']:.2f}" if r else ""
            best = f"{r['best']:.2f}" if r else ""
            goals.add_row(g["label"], f"{g['measured']:.2f}", spread, best, f"{g['comparison']} {g['target']:g}",
                          "[green]met[/green]" if g["met"] else "[red]not met[/red]")
        console.print(goals)
