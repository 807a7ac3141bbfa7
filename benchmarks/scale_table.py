"""docs/SCALE.md's table: each preset's peak memory per phase, measured on 1- and 2-block cuts of the
published shape, extrapolated per block to full depth, next to `mlx-grpo plan`'s prediction.

The batch is the common recipe: 4 prompts x 8 completions, 256-token prompts, LoRA r16, float32 (the CPU
backend; bf16 is checked separately at small shapes). The update and the reference pass are measured
on one micro-batch (one completion, 128-position head chunks, checkpointed blocks: the settings that
fit a 16 GB Mac), the rollout on the whole batch with a short completion budget (its KV cache is
allocated up front, so the budget only scales a term the formula takes exactly).

    python benchmarks/scale_table.py --out scale.jsonl          # measure (slow: ~30 min on 2 cores)
    python benchmarks/scale_table.py --render scale.jsonl       # the markdown table
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from memory_probe import Probe, measure

from mlx_grpo.config.train_config import load_config
from mlx_grpo.planning.plan import GB, MemorySettings, ModelShape, Shapes, predict
from mlx_grpo.planning.presets import PRESETS, preset_config

PROMPTS, GROUP, PROMPT_LENGTH, RANK = 4, 8, 256, 16
LENGTHS = (256, 1024)
SETTINGS = MemorySettings(micro_batch_size=1, logits_chunk_size=128, grad_checkpoint=True)
ROLLOUT_BUDGET = 32  # decode steps measured; the KV cache is sized for prompt + budget


def run_config(completion: int):
    return load_config(None, {"use_lora": True, "lora_rank": RANK, "batch_size": PROMPTS, "num_generations": GROUP,
                              "max_prompt_length": PROMPT_LENGTH, "max_generation_steps": completion,
                              "micro_batch_size": SETTINGS.micro_batch_size,
                              "logits_chunk_size": SETTINGS.logits_chunk_size,
                              "grad_checkpoint": SETTINGS.grad_checkpoint, "dtype": "float32"})


def measure_all(out: Path, presets: list[str]) -> None:
    with out.open("a") as fh:
        for name in presets:
            for completion in LENGTHS:
                for layers in (1, 2):
                    probe = Probe(preset=name, layers=layers, sequences=1, group_size=1, prompt=PROMPT_LENGTH,
                                  completion=completion, micro_batch_size=1, chunk=SETTINGS.logits_chunk_size,
                                  grad_checkpoint=SETTINGS.grad_checkpoint, lora_rank=RANK)
                    fh.write(json.dumps({"preset": name, "completion": completion, "layers": layers,
                                         **measure(probe)}) + "\n")
                    fh.flush()
            for layers in (1, 2):
                probe = Probe(preset=name, layers=layers, sequences=PROMPTS * GROUP, group_size=GROUP,
                              prompt=PROMPT_LENGTH, completion=ROLLOUT_BUDGET, rollout=True, train=False,
                              lora_rank=RANK)
                fh.write(json.dumps({"preset": name, "completion": ROLLOUT_BUDGET, "layers": layers,
                                     "phase": "rollout", **measure(probe)}) + "\n")
                fh.flush()


def extrapolate(one: float, two: float, layers: int) -> float:
    return one + (layers - 1) * (two - one)


def full_depth(found: dict[int, dict], phase: str, layers: int) -> float:
    """A phase's peak at full depth from its 1- and 2-block measurements. Weights and LoRA state grow
    by the same amount per block; so do the update's kept activations. The reference pass and the
    rollout hold one block's activations at a time, so their extra does not grow (measured peaks of
    transient buffers differ by scheduling noise, which a slope would multiply by the depth), except
    the rollout's KV cache, which is exact per block."""
    resident = extrapolate(*(found[k]["weights"] + found[k]["trainable_state"] for k in (1, 2)), layers)
    if phase == "update":
        return resident + extrapolate(found[1]["update"], found[2]["update"], layers)
    if phase == "ref":
        return resident + max(found[1]["ref"], found[2]["ref"])
    kv_per_block = found[1]["kv_bytes"]
    transient = max(found[k]["rollout"] - found[k]["kv_bytes"] for k in (1, 2))
    return resident + transient + kv_per_block * layers


def render(path: Path) -> str:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    lines = ["| preset | completion | phase | measured, 1 block | 2 blocks | full depth (extrapolated) | "
             "plan | plan / measured |", "|---|---|---|---|---|---|---|---|"]
    for name in dict.fromkeys(r["preset"] for r in rows):
        full = ModelShape.from_config(preset_config(name))
        for completion in (*LENGTHS, ROLLOUT_BUDGET):
            found = {r["layers"]: r for r in rows if r["preset"] == name and r["completion"] == completion}
            if set(found) != {1, 2}:
                continue
            phases = ("rollout",) if completion == ROLLOUT_BUDGET else ("ref", "update")
            config = run_config(completion)
            shapes = Shapes(PROMPTS, GROUP, PROMPT_LENGTH, completion)
            for phase in phases:
                if phase != "rollout":
                    shapes_measured = replace(shapes, prompts=1, group_size=1)
                else:
                    shapes_measured = shapes
                # measured: peak above what was resident before the phase, plus the weights and LoRA state
                measured = [found[k][phase] + found[k]["weights"] + found[k]["trainable_state"] for k in (1, 2)]
                estimate = full_depth(found, phase, full.layers)
                peaks = predict(full, shapes_measured, config, SETTINGS, "float32")
                predicted = {"rollout": peaks.rollout, "ref": peaks.reference, "update": peaks.update}[phase]
                lines.append(f"| {name} | {completion} | {phase} | {measured[0] / GB:.2f} GB "
                             f"| {measured[1] / GB:.2f} GB"
                             f" | {estimate / GB:.2f} GB | {predicted / GB:.2f} GB | {predicted / estimate:.2f} |")
    return "\n".join(lines)


MAC_MEMORY = (8, 16, 24, 32, 48, 64, 96, 128)


def smallest_mac(shape: ModelShape, completion: int) -> tuple[int | None, MemorySettings | None]:
    """The smallest Mac (GB of unified memory) on which the recipe fits with some memory setting."""
    from mlx_grpo.planning.budget import plan
    from mlx_grpo.planning.fitting import mac_working_set

    config = run_config(completion)
    shapes = Shapes(PROMPTS, GROUP, PROMPT_LENGTH, completion)
    for memory in MAC_MEMORY:
        verdict = plan(shape, shapes, config, "bfloat16", mac_working_set(memory), "")
        if verdict.fitting is not None:
            return memory, verdict.fitting
    return None, None


def fit_table() -> str:
    """Which model sizes and completion lengths fit which Mac, from the plan's formula (bf16, LoRA r16)."""
    lengths = (256, 1024, 2048)
    lines = ["| model | " + " | ".join(f"{n}-token completions" for n in lengths) + " |",
             "|---|" + "---|" * len(lengths)]
    for name in PRESETS:
        full = ModelShape.from_config(preset_config(name))
        cells = []
        for completion in lengths:
            memory, _ = smallest_mac(full, completion)
            four_bit, _ = smallest_mac(replace(full, bits=4), completion)
            text = f"{memory} GB" if memory else "> 128 GB"
            if four_bit and four_bit != memory:
                text += f" ({four_bit} GB 4-bit)"
            cells.append(text)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="append measurements to this JSONL file")
    parser.add_argument("--render", type=Path, help="print the markdown table of a measurements file")
    parser.add_argument("--presets", nargs="+", default=list(PRESETS))
    parser.add_argument("--fit-table", action="store_true", help="print which Mac each preset fits (formula only)")
    args = parser.parse_args()
    if args.out:
        measure_all(args.out, args.presets)
    if args.render:
        print(render(args.render))
    if args.fit_table:
        print(fit_table())


if __name__ == "__main__":
    import sys

    from mlx_grpo.planning.blas import reexec_with_openblas

    reexec_with_openblas([str(Path(__file__).resolve()), *sys.argv[1:]])  # OpenBLAS on Linux: ~20x the matmuls
    main()
