"""`mlx-grpo selftest`: prove the product on this machine, and write one report to send back.

Each check runs the project's own code (the trainer, its update, the memory plan, resume, bench) and
compares two ways of computing the same thing, two devices, or a prediction with a measurement, against a
stated tolerance. A check passes, fails, or is skipped with its reason, and records the dtype and device it
ran in. The report is rewritten before and after every check, so a run that the OS or Metal ends leaves
the checks so far and the name of the one that was running. docs/PLATFORMS.md explains each line and which
check catches which known Mac defect.

Test-only switches (never set by the product): `MLX_GRPO_SELFTEST_PERTURB=<check>` perturbs the first side
of that check's comparison (a relative 1e-3), and `MLX_GRPO_SELFTEST_ABORT=<check>` writes MLX's Metal error
to file descriptor 2 and ends the process with SIGABRT when that check starts, as a Metal abort does: tests
use them to prove each check can fail and that an abort leaves a report and the cause in the log.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import subprocess
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..checkpoint import weights_name
from ..telemetry.metrics.names import EVAL_ACCURACY
from ..telemetry.rundir.layout import RunPaths

PERTURB_ENV = "MLX_GRPO_SELFTEST_PERTURB"
ABORT_ENV = "MLX_GRPO_SELFTEST_ABORT"
# what MLX before 0.32 writes to file descriptor 2 as Metal's watchdog ends a command buffer, then it aborts
METAL_ABORT_LINE = ("[METAL] Command buffer execution failed: Impacting Interactivity "
                    "(0000000e:kIOGPUCommandBufferCallbackErrorImpactingInteractivity)")

# Measured here (Linux x86_64, 2 cores, MLX CPU backend, fp32): the default model's held-out accuracy gain
# over `LEARNING_STEPS` steps of the default config (eval before the first update and at the end). A Mac computes other
# roundings and samples other completions, so the check asks for at least half of it.
LEARNING_STEPS = 60
REFERENCE_GAIN = 0.18  # 32% -> 50% (seed 0, 200 held-out rows; docs/PLATFORMS.md, "selftest")
LEARNING_SHARE = 0.5

PRESET = "qwen2.5-0.5b"  # a published shape (152k vocabulary), cut to PRESET_LAYERS blocks, random weights
PRESET_LAYERS = 2
# The plan is fitted within ~15% of measurements (plan.py, docs/SCALE.md): a phase passes when its planned
# peak is within this band of the measured one (below it, a run the plan accepts could not fit).
PLAN_BAND = (0.85, 1.5)
FLAT_GROWTH = 0.05  # rollout peak above the KV cache may grow by this share of it from T to 8T tokens

# float32 on two paths or two devices: the same sums in another order differ by ~1e-6 at these sizes (measured
# 1.9e-6 on the shared-prompt path); 1e-4 leaves room and still sees a broken kernel (errors of 1e-3 and up).
FP32_TOLERANCE = 1e-4
# Two bfloat16 computations can each be off the exact value by bf16's rounding (8 bits of mantissa), so they
# may differ by twice the rounding measured on this machine (bf16 against float32 on the reference device),
# plus a floor for paths where it measures ~0.
BF16_FLOOR = 1e-3

REAL_MODEL = "smollm2"  # SmolLM2-135M-Instruct, its Q4_1 GGUF (tools/smollm2.py): a real 4-bit base and tokenizer
REAL_STEPS = 3
REAL_EVAL_ROWS = 8
LOG_TAIL_LINES = 50


@dataclass
class Check:
    name: str
    status: str  # "pass", "fail" or "skip"
    detail: str  # one line: what was compared, the numbers, the tolerance (or why skipped)
    measured: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    dtype: str = ""  # what the check computed in ("float32", "bfloat16 + 4-bit base", ...)
    device: str = ""  # "cpu", "gpu", or "gpu vs cpu"
    error: str = ""  # the whole traceback of a check that raised


def perturbed(check: str, values: np.ndarray) -> np.ndarray:
    """`values`, nudged when the test switch names this check."""
    return values * (1 + 1e-3) + 1e-3 if os.environ.get(PERTURB_ENV) == check else values


def max_difference(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0


def device_name() -> str:
    import mlx.core as mx

    return "gpu" if mx.default_device().type == mx.gpu else "cpu"


def verdict(ok: bool) -> str:
    return "pass" if ok else "fail"


# ----------------------------------------------------------------------------- environment

def gpu_cores() -> int | None:
    """The Apple GPU's core count (ioreg's gpu-core-count), None elsewhere."""
    if platform.system() != "Darwin":
        return None
    try:
        text = subprocess.run(["ioreg", "-rc", "AGXAccelerator", "-d", "1"], capture_output=True, text=True,
                              timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in text.splitlines():
        if '"gpu-core-count"' in line:
            try:
                return int(line.split("=")[-1].strip())
            except ValueError:
                return None
    return None


def memory_state() -> dict[str, Any]:
    """Swap in use and macOS's memory pressure, now (None where the OS has no such reading)."""
    from ..telemetry.metrics.system import PRESSURE_LEVELS, memory_pressure_level, swap_used_bytes

    level = memory_pressure_level()
    return {"swap_used_bytes": swap_used_bytes(),
            "memory_pressure": PRESSURE_LEVELS.get(level, str(level)) if level is not None else None}


def cache_limit_now() -> int:
    import mlx.core as mx

    current = mx.set_cache_limit(0)
    mx.set_cache_limit(current)
    return int(current)


def environment(tf32_at_start: str | None = None) -> dict[str, Any]:
    """The machine, read without changing it: the selftest does not wire memory itself, so a `train` or
    `bench` that stopped wiring would show in the read-back of the `memory` and `bench` checks.
    `tf32_at_start`: MLX_ENABLE_TF32 as the user had it, before the selftest set 0."""
    import mlx.core as mx
    import psutil

    from ..planning import chips
    from ..planning.machine import (
        NOT_ON_THIS_OS,
        cpu_model,
        device_info,
        low_power_mode,
        memory_share,
        power_source,
        thermal_state,
        versions,
        wired_limit,
        wiring_takes_effect,
    )
    from ..planning.tf32 import ENV, float32_state

    info = device_info()
    chip = chips.this_chip()
    float32 = float32_state()
    return {
        "chip": info.get("device_name") or cpu_model(),
        "cpu": cpu_model(),
        "gpu_cores": gpu_cores(),
        "gpu_architecture": info.get("architecture") if mx.metal.is_available() else None,
        "bandwidth_gb_s": chip.bandwidth_gb_s if chip else None,
        "memory_bytes": info.get("memory_size") or psutil.virtual_memory().total,
        "working_set_bytes": info.get("max_recommended_working_set_size"),
        "wired_limit_bytes": wired_limit(),  # what `train` asks for; read back in the `memory` check
        "wiring_takes_effect": wiring_takes_effect(),  # MLX wires nothing before macOS 15
        "cache_limit_bytes": cache_limit_now(),
        "memory_share": memory_share(),
        "neural_accelerators": float32.accelerators,  # an M5's GPU: float32 products in TF32 unless the flag is 0
        "tf32_setting_at_start": tf32_at_start,
        "tf32_setting": os.environ.get(ENV),
        "float32": float32.describe(),
        "os": platform.platform(),
        "macos": platform.mac_ver()[0] or None,
        "power_source": power_source(),
        "low_power_mode": low_power_mode(),
        "thermal_state": thermal_state(),
        **memory_state(),
        "memory_pressure_note": None if platform.system() == "Darwin" else f"memory pressure: {NOT_ON_THIS_OS}",
        "backend": "metal" if mx.metal.is_available() and mx.default_device().type == mx.gpu else "cpu",
        "load_average": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "cores": os.cpu_count(),
        **versions(),
    }


# ----------------------------------------------------------------------------- numerical equivalences

def small_config(**overrides):
    from ..config.train_config import load_config

    return load_config(None, {"batch_size": 4, "num_generations": 4, "max_generation_steps": 12, "eval_size": 8,
                              "micro_batch_size": 0, "wandb": False, **overrides})


def sample_batch(trainer):
    """A real rollout of the trainer's model on its task, laid out for the update."""
    from ..trainer import step_key
    from ..update import build_train_batch

    prompts = trainer.draw_prompts()
    rollout = trainer.rollout(prompts, step_key(trainer.config.seed, 1), trainer.config.max_generation_steps)
    batch = build_train_batch(rollout, trainer.policy.pad_id)
    advantages = trainer.advantages(trainer.score(prompts, rollout), prompts.group_size)
    return batch, advantages


def check_precision() -> Check:
    """What `dtype: auto` resolves to: bf16 for LoRA on a GPU (half the memory), float32 elsewhere."""
    from ..models import policy as models

    want = {("LoRA", "gpu"): "bfloat16", ("LoRA", "cpu"): "float32", ("full", "gpu"): "float32",
            ("full", "cpu"): "float32"}
    got = {(kind, dev): models.resolve_dtype(small_config(use_lora=kind == "LoRA"), gpu=dev == "gpu")
           for kind, dev in want}
    wrong = [f"{kind} on the {dev}: {got[kind, dev]} (want {want[kind, dev]})" for kind, dev in want
             if got[kind, dev] != want[kind, dev]]
    here = models.resolve_dtype(small_config(use_lora=True))
    return Check("precision", verdict(not wrong),
                 "dtype: auto " + ("resolves as documented: LoRA bfloat16 on a GPU, float32 on the CPU and for full "
                                   "fine-tuning" if not wrong else "WRONG: " + "; ".join(wrong))
                 + f"; a LoRA run here computes in {here}",
                 {"resolved": {f"{k} {d}": v for (k, d), v in got.items()}, "lora_here": here},
                 dtype=here, device=device_name())


def check_shared_prompts(trainer, batch) -> Check:
    from ..models.policy import resolve_dtype
    from ..update import completion_logprobs, shares_prompts

    model, mask, t = trainer.policy.model, np.array(batch.mask), trainer.config.temperature
    if not shares_prompts(model, batch):
        return Check("shared_prompts", "skip", "this model cannot share prompt passes (no plain KV cache)")
    shared = perturbed("shared_prompts", np.array(completion_logprobs(model, batch, t)) * mask)
    whole = np.array(completion_logprobs(model, replace(batch, prompts=[]), t)) * mask
    diff, tol = max_difference(shared, whole), FP32_TOLERANCE
    return Check("shared_prompts", verdict(diff <= tol),
                 f"log-probs, one pass per prompt vs whole sequences: max |difference| {diff:.1e} (tolerance {tol:g})",
                 {"max_abs_difference": diff, "tolerance": tol}, dtype=resolve_dtype(trainer.config))


def check_chunked_head(trainer, batch) -> Check:
    from ..models.policy import has_plain_head, resolve_dtype
    from ..update import completion_logprobs

    model, mask, t = trainer.policy.model, np.array(batch.mask), trainer.config.temperature
    if not has_plain_head(model):
        return Check("chunked_head", "skip", "this model family runs its own head (no chunks)")
    chunked = perturbed("chunked_head", np.array(completion_logprobs(model, batch, t, chunk_size=3)) * mask)
    whole = np.array(completion_logprobs(model, batch, t)) * mask
    diff, tol = max_difference(chunked, whole), FP32_TOLERANCE
    return Check("chunked_head", verdict(diff <= tol),
                 f"log-probs, LM head 3 positions at a time vs one pass: max |difference| {diff:.1e} (tolerance {tol:g})",
                 {"max_abs_difference": diff, "tolerance": tol}, dtype=resolve_dtype(trainer.config))


def sgd_step(config, base_dir: Path, batch, advantages) -> np.ndarray:
    """How one update of the trainer (plain SGD at rate 1: the change is the clipped gradient itself) moves
    the trainable weights, flattened. AdamW's first step is about the gradient's sign, which rounding flips
    for near-zero entries."""
    import mlx.optimizers as optim
    from mlx.utils import tree_flatten

    from ..trainer import Trainer

    trainer = replace(Trainer.build(config, base_dir), optimizer=optim.SGD(learning_rate=1.0))
    before = {k: np.array(v) for k, v in tree_flatten(trainer.policy.model.trainable_parameters())}
    trainer.update(batch, advantages, trainer.reference_logprobs(batch))
    after = tree_flatten(trainer.policy.model.trainable_parameters())
    return np.concatenate([(np.array(v) - before[k]).ravel() for k, v in after])


def relative_difference(a: np.ndarray, b: np.ndarray) -> float:
    return max_difference(a, b) / (float(np.max(np.abs(b))) or 1.0)


def check_micro_batches(base_dir: Path, batch, advantages) -> Check:
    """One update of the same weights on the same batch, whole vs in micro-batches of 3 (cutting groups)."""
    from ..models.policy import resolve_dtype

    whole = sgd_step(small_config(), base_dir, batch, advantages)
    micro = perturbed("micro_batches", sgd_step(small_config(micro_batch_size=3), base_dir, batch, advantages))
    diff, tol = relative_difference(micro, whole), FP32_TOLERANCE
    return Check("micro_batches", verdict(diff <= tol),
                 f"gradient step of one update, micro-batches of 3 vs the whole batch: max difference {diff:.1e} "
                 f"of the largest entry (tolerance {tol:g})", {"relative_difference": diff, "tolerance": tol},
                 dtype=resolve_dtype(small_config()))


def scatter_adds(arrays: list) -> list[str]:
    """The scatter-add primitives that compute `arrays` (MLX's graph export). On Metal a scatter-add is one
    atomic add per element, in thread-scheduling order: not reproducible run to run. ("ScatterAxis" is
    take_along_axis's backward: one index per row, no two adds meet.)"""
    import re

    import mlx.core as mx

    with tempfile.NamedTemporaryFile("w+", suffix=".dot") as dot:
        mx.export_to_dot(dot.name, *arrays)
        return sorted({n for n in re.findall(r'label ="([^"]+)"', dot.read()) if n.startswith("Scatter ")})


def backward_scatter_adds(trainer, batch) -> list[str]:
    """Scatter-adds in the gradient of the trainer's loss (its trainable weights) on `batch`."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from ..update import completion_logprobs

    model = trainer.policy.model

    def loss(params):
        model.update(params)
        return (completion_logprobs(model, batch, trainer.config.temperature) * batch.mask).sum()

    params = model.trainable_parameters()
    grads = mx.grad(loss)(params)
    names = scatter_adds([g for _, g in tree_flatten(grads)])
    model.update(params)
    return names


def check_resume(base_dir: Path, work: Path) -> Check:
    """LoRA on the shipped (dense) model, the configuration a Mac runs: its backward has no scatter-add, so a
    run resumed from its step-2 checkpoint must equal the uninterrupted 4-step run bit for bit on any backend
    (full fine-tuning differentiates the embedding lookup through a scatter-add: docs/PLATFORMS.md)."""
    from ..models.policy import resolve_dtype
    from ..run.loop import train
    from ..trainer import Trainer

    config = small_config(num_steps=4, checkpoint_every=2, keep_checkpoints=2, eval_every=0, batch_size=2,
                          max_generation_steps=8, use_lora=True, lora_rank=8, lora_layers=-1, learning_rate=1e-3,
                          monitoring_dir=str(work / "runs"), run_name="uninterrupted")
    probe = Trainer.build(config, base_dir)
    scatters = backward_scatter_adds(probe, sample_batch(probe)[0])
    whole = Path(train(config, base_dir)["run_dir"])
    resumed = work / "runs" / "resumed"
    shutil.copytree(whole, resumed)
    shutil.rmtree(RunPaths(resumed).checkpoint(4))
    train(replace(config, run_name="resumed"), base_dir, resume_dir=resumed)

    def final_weights(run: Path) -> dict[str, np.ndarray]:
        import mlx.core as mx

        folder = RunPaths(run).checkpoint(4)
        return {k: np.array(v) for k, v in mx.load(str(folder / weights_name(folder))).items()}

    a, b = final_weights(whole), final_weights(resumed)
    diff = max(max_difference(perturbed("resume", a[k]), b[k]) for k in a)
    records = [[json.loads(line) for line in RunPaths(run).metrics.read_text().splitlines()] for run in (whole, resumed)]
    clock = ("time", "timing/", "system/", "throughput/", "perf/", "memory/")  # measured, not computed
    computed = [[{k: v for k, v in r.items() if not k.startswith(clock)}
                 for r in rs if r.get("step", 0) > 2] for rs in records]
    same_records = computed[0] == computed[1]
    ok = diff == 0.0 and same_records and not scatters
    return Check("resume", verdict(ok),
                 f"LoRA, 4 steps vs resumed at step 2: final adapters max |difference| {diff:.1e} (tolerance 0), "
                 f"steps 3-4 records {'identical' if same_records else 'DIFFER'}; scatter-adds in the backward: "
                 f"{', '.join(scatters) or 'none'}",
                 {"max_abs_difference": diff, "records_identical": same_records, "tolerance": 0.0,
                  "backward_scatter_adds": scatters}, dtype=resolve_dtype(config))


# ----------------------------------------------------------------------------- Metal against the CPU

def logprobs_on(device, model, batch, temperature: float) -> np.ndarray:
    import mlx.core as mx

    from ..update import completion_logprobs

    with mx.stream(device):
        return np.array(completion_logprobs(model, batch, temperature).astype(mx.float32)) * np.array(batch.mask)


def cast_model(model, dtype):
    """`model`'s floating weights in `dtype` (a copy of the arrays; packed quantized weights stay)."""
    import mlx.core as mx
    from mlx.utils import tree_map

    model.update(tree_map(lambda v: v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) else v,
                          model.parameters()))
    return model


def compare_devices(first, second, base_dir: Path, trainer, batch, advantages,
                    tf32: Callable[[], np.ndarray] | None = None, real_kernels: bool = False) -> Check:
    """Log-probs and one update computed on `first` against `second` (the Metal GPU against the CPU in the
    selftest): the default model in float32 and bfloat16, a 4-bit copy of it, and one SGD update in float32
    (full fine-tuning) and bfloat16 (LoRA). bf16 tolerances are twice the bf16 rounding measured on `second`.
    The float32 rows expect full float32 on both (MLX_ENABLE_TF32=0 on an M5). `tf32`: `first`'s float32
    log-probs as it computes them by default (TF32 on an M5's Neural Accelerators), held to twice TF32's
    rounding emulated on `second` (11 significant bits, tf32.py). `real_kernels`: SmolLM2's rows too
    (`compare_real_kernels`)."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_map

    from ..planning.tf32 import TF32_BITS, tf32_rounding

    t = trainer.config.temperature
    model = trainer.policy.model
    original = tree_map(lambda v: v, model.parameters())
    rows: dict[str, dict[str, float]] = {}

    def row(name: str, a: np.ndarray, b: np.ndarray, tol: float, relative: bool = False) -> None:
        diff = relative_difference(a, b) if relative else max_difference(a, b)
        rows[name] = {"difference": diff, "tolerance": tol}

    exact = logprobs_on(second, model, batch, t)
    row("log-probs float32", perturbed("devices", logprobs_on(first, model, batch, t)), exact, FP32_TOLERANCE)
    if tf32 is not None:
        with tf32_rounding():
            emulated = max_difference(logprobs_on(second, model, batch, t), exact)
        row(f"log-probs TF32 ({TF32_BITS} bits)", perturbed("devices", tf32()), exact, 2 * emulated + FP32_TOLERANCE)
    cast_model(model, mx.bfloat16)
    rounding = max_difference(logprobs_on(second, model, batch, t), exact)
    row("log-probs bfloat16", perturbed("devices", logprobs_on(first, model, batch, t)),
        logprobs_on(second, model, batch, t), 2 * rounding + BF16_FLOOR)
    model.update(original)
    nn.quantize(model, group_size=32, bits=4)
    row("log-probs 4-bit", perturbed("devices", logprobs_on(first, model, batch, t)),
        logprobs_on(second, model, batch, t), FP32_TOLERANCE)
    del model  # the trainer's model is quantized now: the caller's shared trainer must not be reused
    full, lora = small_config(), small_config(use_lora=True, lora_rank=8, lora_layers=-1, dtype="bfloat16")
    moves = {}
    for name, config in (("full", full), ("lora", lora)):
        for device in (first, second):
            with mx.stream(device):
                moves[name, str(device)] = sgd_step(config, base_dir, batch, advantages)
    row("update float32", perturbed("devices", moves["full", str(first)]), moves["full", str(second)],
        FP32_TOLERANCE, relative=True)
    with mx.stream(second):
        lora_exact = sgd_step(replace(lora, dtype="float32"), base_dir, batch, advantages)
    lora_rounding = relative_difference(moves["lora", str(second)], lora_exact)
    row("update bfloat16 LoRA", perturbed("devices", moves["lora", str(first)]), moves["lora", str(second)],
        2 * lora_rounding + BF16_FLOOR, relative=True)
    if real_kernels:
        rows.update(compare_real_kernels(first, second, base_dir))
    failed = [name for name, r in rows.items() if not r["difference"] <= r["tolerance"]]
    text = ", ".join(f"{name} {r['difference']:.1e} (tol {r['tolerance']:.1e})" for name, r in rows.items())
    return Check("devices", verdict(not failed), f"{first} vs {second}: {text}"
                 + (f"; FAILED: {', '.join(failed)}" if failed else ""), rows,
                 dtype="float32, bfloat16, 4-bit" + (", SmolLM2 4-bit" if real_kernels else ""),
                 device=f"{first} vs {second}")


# SmolLM2's rows: sums in another order (one pass per prompt against whole sequences, on the reference device)
# are the float32 difference two correct kernels may show; the tolerance is this many times that, above 1e-4.
REORDER_FACTOR = 10


def compare_real_kernels(first, second, base_dir: Path) -> dict[str, dict[str, float]]:
    """The kernels a real Mac run takes, on SmolLM2-135M (head dim 64: Metal's fused attention; its Q4_1 base
    kept 4-bit): float32 log-probs of the dequantized model on `first` against `second`; bf16 log-probs on the
    4-bit base on `first` (a Mac run's configuration) against float32 dequantized on `second`; and one LoRA
    gradient through the 4-bit base (the quantized matmul's backward, its own Metal kernels) on both. Rows as
    `compare_devices` keeps them, each tolerance derived on `second`: float32 rows from the same sums in
    another order, the bf16 row from the same bf16-scaled weights computed plain in bf16."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten
    from mlx_lm.utils import dequantize_model

    from ..models.policy import apply_adapters, load_policy
    from ..update import completion_logprobs

    base = dict(model_id=REAL_MODEL, use_chat_template=False, system_prompt=None, dtype="float32", use_lora=True)
    plain, tokenizer = load_policy(small_config(**base, quantized_base="dequantize"), base_dir)
    batch = reply_batch(tokenizer, sum_rows(4, False, 3))
    rows: dict[str, dict[str, float]] = {}
    exact = logprobs_on(second, plain, batch, 1.0)
    reorder = max_difference(logprobs_on(second, plain, replace(batch, prompts=[]), 1.0), exact)
    rows["SmolLM2 log-probs float32, fused attention"] = {
        "difference": max_difference(perturbed("devices", logprobs_on(first, plain, batch, 1.0)), exact),
        "tolerance": FP32_TOLERANCE + REORDER_FACTOR * reorder}
    del plain
    kept, _ = load_policy(small_config(**base, quantized_base="keep"), base_dir)
    apply_adapters(kept, small_config(use_lora=True, lora_rank=8, lora_layers=2))

    def loss(m, rows_batch):
        return -(completion_logprobs(m, rows_batch, 1.0) * rows_batch.mask).sum() / rows_batch.mask.sum()

    def gradient(device, rows_batch) -> np.ndarray:
        with mx.stream(device):
            grads = nn.value_and_grad(kept, lambda m: loss(m, rows_batch))(kept)[1]
            return np.concatenate([np.array(g).ravel() for _, g in tree_flatten(grads)])

    reference = gradient(second, batch)
    reorder = relative_difference(gradient(second, replace(batch, prompts=[])), reference)
    rows["SmolLM2 LoRA gradient through the 4-bit base"] = {
        "difference": relative_difference(perturbed("devices", gradient(first, batch)), reference),
        "tolerance": FP32_TOLERANCE + REORDER_FACTOR * reorder}
    cast_model(kept, mx.bfloat16)  # a Mac run: bf16 activations, bf16 scales and biases on the 4-bit codes
    on_first = perturbed("devices", logprobs_on(first, kept, batch, 1.0))
    dequantize_model(kept)  # the same bf16-scaled weights, plain bf16: the CPU's dense path sums in float32
    rounding = max_difference(logprobs_on(second, kept, batch, 1.0), exact)
    rows["SmolLM2 log-probs bfloat16 on the 4-bit base vs float32"] = {
        "difference": max_difference(on_first, exact), "tolerance": 2 * rounding + BF16_FLOOR}
    return rows


def check_devices(base_dir: Path, real: bool = True) -> Check:
    """The Metal GPU against the CPU (`compare_devices`); with `real`, on SmolLM2 too (downloaded here on
    first use, as `real_model` would; its rows are left out, and said so, when it cannot be had)."""
    import mlx.core as mx

    from ..common.errors import UserError
    from ..models.smollm2 import smollm2_path
    from ..planning.tf32 import float32_state
    from ..trainer import Trainer

    if not mx.metal.is_available():
        return Check("devices", "skip", "no Metal GPU in this process (MLX's CPU backend): nothing to compare "
                     "the CPU with", dtype="float32, bfloat16, 4-bit", device="cpu")
    trainer = Trainer.build(small_config(), base_dir)  # its own: the comparison quantizes the model
    batch, advantages = sample_batch(trainer)
    tf32 = (lambda: tf32_child_logprobs(batch, trainer.config.temperature)) if float32_state().accelerators else None
    missing = "--quick: no SmolLM2 rows" if not real else None
    if real:
        try:
            smollm2_path(download=True)
        except UserError as err:
            missing = f"no SmolLM2 rows ({err})"
    check = compare_devices(mx.gpu, mx.cpu, base_dir, trainer, batch, advantages, tf32=tf32,
                            real_kernels=missing is None)
    if missing:
        check.detail += f"; {missing}"
    return check


def tf32_child_logprobs(batch, temperature: float) -> np.ndarray:
    """The default model's float32 log-probs of `batch` on the GPU as MLX computes them by default: in a child
    process without MLX_ENABLE_TF32 (this process runs with 0, and MLX reads it once)."""
    import sys

    from ..planning.tf32 import ENV

    whole = replace(batch, prompts=[])
    with tempfile.TemporaryDirectory(prefix="mlx-grpo-tf32-") as tmp:
        saved, out = Path(tmp) / "batch.npz", Path(tmp) / "logprobs.npy"
        np.savez(saved, inputs=np.array(whole.inputs), targets=np.array(whole.targets),
                 positions=np.array(whole.positions), mask=np.array(whole.mask), num_tokens=whole.num_tokens,
                 temperature=temperature)
        child = {k: v for k, v in os.environ.items() if k != ENV}  # MLX's default: TF32 on Neural Accelerators
        subprocess.run([sys.executable, "-m", "mlx_grpo.measuring.tf32_child", str(saved), str(out)], env=child, check=True,
                       capture_output=True, timeout=600)
        return np.load(out)


# ----------------------------------------------------------------------------- memory

# Two small in-memory shapes the plan must count exactly: a dense block and a mixture of experts
PLAN_SHAPES = {
    "llama": {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 300, "rms_norm_eps": 1e-6,
              "rope_theta": 10000.0, "tie_word_embeddings": False},
    "qwen3_moe": {"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 300, "rms_norm_eps": 1e-6,
                  "rope_theta": 1000000.0, "tie_word_embeddings": False, "head_dim": 16, "num_experts": 4,
                  "num_experts_per_tok": 2, "moe_intermediate_size": 32, "decoder_sparse_step": 1,
                  "mlp_only_layers": [], "norm_topk_prob": True, "max_position_embeddings": 512},
}


# the plan leaves out vectors such as qwen3's per-head norms (0.06% of the small MoE here); a family counted
# wrong is off by whole matrices (the MoE's expert adapters were 26x under)
PLAN_COUNT_TOLERANCE = 0.01


def check_plan_counts() -> Check:
    """The plan's parameter counts (weights, and LoRA adapters at rank 8 on every block) against the models
    mlx-lm builds: a dense block and a mixture of experts, whose experts each get their own adapters."""
    import importlib

    from mlx.utils import tree_flatten
    from mlx_lm.tuner.utils import linear_to_lora_layers

    from ..planning.plan import ModelShape

    rows, ok = {}, True
    for family, args in PLAN_SHAPES.items():
        module = importlib.import_module(f"mlx_lm.models.{family}")
        model = module.Model(module.ModelArgs.from_dict(args))
        real = sum(v.size for _, v in tree_flatten(model.parameters()))
        model.freeze()
        linear_to_lora_layers(model, args["num_hidden_layers"], {"rank": 8, "scale": 2.0, "dropout": 0.0})
        real_lora = sum(v.size for _, v in tree_flatten(model.trainable_parameters()))
        shape = ModelShape.from_config(args)
        planned = shape.parameters()
        planned_lora = shape.lora_parameters(8, args["num_hidden_layers"])
        rows[family] = {"parameters": real, "planned": planned, "lora": real_lora, "planned_lora": planned_lora}
        ok &= abs(planned / real - 1) <= PLAN_COUNT_TOLERANCE and abs(planned_lora / real_lora - 1) <= PLAN_COUNT_TOLERANCE
    text = ", ".join(f"{f} {r['planned']:.0f}/{r['parameters']} weights, {r['planned_lora']}/{r['lora']} LoRA"
                     for f, r in rows.items())
    return Check("plan_counts", verdict(ok), f"planned/real parameters: {text} (tolerance "
                 f"{PLAN_COUNT_TOLERANCE:.0%})", rows,
                 dtype="float32", device=device_name())


def preset_model_dir(out: Path) -> Path:
    """A random-weight model of PRESET's shape with the shipped tokenizer (ids past it decode to nothing)."""
    from mlx_lm.utils import save_config, save_model

    from ..models.policy import DEFAULT_MODEL_DIR
    from ..planning.presets import preset_config, preset_model

    out.mkdir(parents=True, exist_ok=True)
    save_model(out, preset_model(PRESET, layers=PRESET_LAYERS))
    save_config(dict(preset_config(PRESET, layers=PRESET_LAYERS)), out / "config.json")
    for name in DEFAULT_MODEL_DIR.iterdir():
        if "token" in name.name:
            shutil.copy(name, out / name.name)
    return out


def check_plan(base_dir: Path, model_dir: Path) -> tuple[Check, Any]:
    """The plan's peak of each phase against the trainer's measured peak, one step at full lengths."""
    import mlx.core as mx

    from ..models.policy import resolve_dtype
    from ..planning.fitting import read_model_shape
    from ..planning.plan import MemorySettings, Shapes, predict
    from .workload import Workload

    prompt_length = 16
    config = small_config(model_id=str(model_dir), use_lora=True, lora_layers=-1, batch_size=2,
                          max_generation_steps=32, max_prompt_length=prompt_length, beta=0.04)
    # MLX's peak counter is process-wide: arrays alive before the check (a caller's own, e.g. a test session's)
    # are not this step's and are taken off
    already_alive = mx.get_active_memory()
    work = Workload(config, base_dir, prompt_length)
    _, measured = work.step(1)
    measured = {phase: peak - already_alive for phase, peak in measured.items()}
    planned = predict(read_model_shape(str(model_dir), base_dir),
                      Shapes(config.batch_size, config.num_generations, prompt_length, config.max_generation_steps,
                             cpu=mx.default_device().type == mx.cpu), config, MemorySettings(0, 0, False), resolve_dtype(config))
    rows, ok = {}, True
    for phase, attribute in (("rollout", "rollout"), ("ref", "reference"), ("update", "update")):
        have = perturbed("plan", np.array(measured[phase]))
        want = getattr(planned, attribute)
        rows[phase] = {"measured_bytes": float(have), "planned_bytes": want, "planned_over_measured": want / float(have)}
        ok &= PLAN_BAND[0] <= want / float(have) <= PLAN_BAND[1]
    text = ", ".join(f"{p} {r['measured_bytes'] / 2**20:.0f}/{r['planned_bytes'] / 2**20:.0f} MiB" for p, r in rows.items())
    return Check("memory_plan", verdict(ok),
                 f"{PRESET} ({PRESET_LAYERS} layers) measured/planned peak: {text} (pass: planned within "
                 f"{PLAN_BAND[0]:g}-{PLAN_BAND[1]:g}x measured)", rows, dtype=resolve_dtype(config),
                 device=device_name()), work


def check_rollout_flat(work) -> Check:
    """The rollout's peak above its KV cache, at T and 8T new tokens: it must not grow with T."""
    import mlx.core as mx

    from ..models.policy import resolve_dtype
    from ..trainer import step_key
    from .benchmark import kv_bytes_per_token

    prompt = max(len(e.tokens) for e in work.fixed.encoded)
    rows = work.sequences
    above = {}
    for steps in (8, 64):
        mx.clear_cache()
        mx.reset_peak_memory()
        base = mx.get_active_memory()
        work.trainer.rollout(work.fixed, step_key(0, steps), steps)
        kv = kv_bytes_per_token(work.model) * rows * (prompt + steps)
        above[steps] = float(perturbed("rollout_flat", np.array(mx.get_peak_memory() - base - kv)))
    growth = (above[64] - above[8]) / max(above[8], 1.0)
    return Check("rollout_flat", verdict(growth <= FLAT_GROWTH),
                 f"rollout peak above its KV cache, 8 vs 64 new tokens: {above[8] / 2**20:.1f} -> "
                 f"{above[64] / 2**20:.1f} MiB ({growth:+.1%}, tolerance +{FLAT_GROWTH:.0%})",
                 {"above_kv_bytes": above, "growth": growth, "tolerance": FLAT_GROWTH},
                 dtype=resolve_dtype(work.trainer.config), device=device_name())


def check_memory(base_dir: Path, work: Path, initial_cache_limit: int) -> Check:
    """A short LoRA `train` run as a user starts it: the wired limit it set, read back (Metal); the buffer cache
    limit it set from its plan, read back, and the cache logged between its steps against it; swap and
    memory pressure before and after."""
    import mlx.core as mx

    from ..models.policy import resolve_dtype
    from ..planning.fitting import fit_run
    from ..planning.machine import cache_limit_for, wired_limit, wired_limit_in_effect, wiring_takes_effect
    from ..run.loop import train
    from ..trainer import Trainer

    config = small_config(num_steps=3, eval_every=0, checkpoint_every=0, use_lora=True, lora_layers=-1,
                          batch_size=2, monitoring_dir=str(work / "runs"), run_name="memory")
    if mx.metal.is_available():
        mx.set_wired_limit(0)  # what follows reads back train's own wiring, not an earlier check's
    mx.set_cache_limit(initial_cache_limit)
    before = memory_state()
    run = Path(train(config, base_dir)["run_dir"])
    after = memory_state()
    wired, wanted_wired = wired_limit_in_effect(), wired_limit()
    cache_limit = cache_limit_now()
    planned_peak = fit_run(config, base_dir)[2]
    wanted_cache = cache_limit_for(Trainer.build(config, base_dir).resident_bytes(), planned_peak)
    cached = [r.get("system/accel_cache_gb") for r in map(json.loads, RunPaths(run).metrics.read_text().splitlines())
              if "step" in r]
    cached = [c * 1e9 for c in cached if c is not None]
    worst_cache = float(perturbed("memory", np.array(max(cached, default=0.0))))
    problems = []
    if wanted_wired is not None and wired != wanted_wired:
        problems.append(f"wired limit read back {wired} B, train asks for {wanted_wired} B")
    if wanted_cache is None or cache_limit != wanted_cache:
        problems.append(f"cache limit read back {cache_limit / 2**20:.1f} MiB, the plan gives "
                        f"{(wanted_cache or 0) / 2**20:.1f} MiB")
    if wanted_cache is not None and worst_cache > wanted_cache:
        problems.append(f"cache between steps {worst_cache / 2**20:.1f} MiB, above the limit")
    effect = {True: "", False: " (macOS < 15: MLX wires nothing)", None: ""}[wiring_takes_effect()]
    wired_text = f"wired limit {wired / 2**30:.2f} GiB read back{effect}" if wired is not None else \
        "wired limit n/a (no Metal)"
    swap = lambda s: "n/a" if s["swap_used_bytes"] is None else f"{s['swap_used_bytes'] / 2**30:.2f} GiB"  # noqa: E731
    pressure = lambda s: s["memory_pressure"] or "n/a"  # noqa: E731
    detail = (f"{wired_text}; cache limit {cache_limit / 2**20:.1f} MiB (plan: {(wanted_cache or 0) / 2**20:.1f}), "
              f"cache between steps <= {worst_cache / 2**20:.1f} MiB; swap {swap(before)} -> {swap(after)}, "
              f"pressure {pressure(before)} -> {pressure(after)}")
    return Check("memory", verdict(not problems), detail + ("; " + "; ".join(problems) if problems else ""),
                 {"wired_limit_read_back": wired, "wired_limit_wanted": wanted_wired,
                  "wiring_takes_effect": wiring_takes_effect(), "cache_limit_read_back": cache_limit,
                  "cache_limit_planned": wanted_cache, "cache_between_steps_bytes": cached,
                  "before": before, "after": after}, dtype=resolve_dtype(config), device=device_name())


# ----------------------------------------------------------------------------- a real 4-bit model

def sum_rows(count: int, held_out: bool, seed: int) -> list[dict]:
    """"What is a + b?" rows; a pair is held out or trained on by a fixed rule, never both."""
    import random

    rng, rows, seen = random.Random(seed), [], set()
    while len(rows) < count:
        a, b = rng.randint(0, 30), rng.randint(0, 30)
        if ((a * 7 + b * 13) % 4 == 0) != held_out or (held_out and (a, b) in seen):
            continue
        seen.add((a, b))
        rows.append({"prompt": f"What is {a} + {b}?", "answer": str(a + b)})
    return rows


def reply_batch(tokenizer, rows: list[dict]):
    """Each row's prompt followed by its reference reply ("2 + 3 = 5."), laid out for `completion_logprobs`."""
    from ..rollout import Rollout
    from ..update import build_train_batch

    prompts = [tokenizer.encode(row["prompt"]) for row in rows]
    replies = [tokenizer.encode(f" {row['prompt'][8:-1]} = {row['answer']}.", add_special_tokens=False)
               for row in rows]
    rollout = Rollout(prompts, replies, [[0.0] * len(r) for r in replies], [False] * len(rows), 0.0)
    return build_train_batch(rollout, tokenizer.pad_token_id or 0)


def reply_logprob(model, batch) -> float:
    """Mean log-prob per token of the reference replies."""
    from ..update import completion_logprobs

    mask = np.array(batch.mask)
    return float((np.array(completion_logprobs(model, batch, 1.0)) * mask).sum() / mask.sum())


def bf16_update(model, batch) -> dict[str, Any]:
    """One AdamW step of bf16 LoRA on the 4-bit base, raising the replies' log-likelihood: log-probs against
    float32 first, then loss, adapter change and log-prob after."""
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    from mlx.utils import tree_flatten

    from ..models.policy import apply_adapters
    from ..update import completion_logprobs

    mask = np.array(batch.mask)
    exact = np.array(completion_logprobs(model, batch, 1.0)) * mask
    cast_model(model, mx.bfloat16)
    rounded = perturbed("real_model", np.array(completion_logprobs(model, batch, 1.0).astype(mx.float32)) * mask)
    apply_adapters(model, small_config(use_lora=True, lora_rank=8, lora_layers=2))
    before = reply_logprob(model, batch)
    start = {k: np.array(v) for k, v in tree_flatten(model.trainable_parameters())}

    def loss_fn(m):
        return -(completion_logprobs(m, batch, 1.0) * batch.mask).sum() / batch.mask.sum()

    loss, grads = nn.value_and_grad(model, loss_fn)(model)
    optim.AdamW(learning_rate=1e-3).update(model, grads)
    mx.eval(model.parameters())
    moved = max(float(np.max(np.abs(np.array(v) - start[k]))) for k, v in tree_flatten(model.trainable_parameters()))
    return {"bf16_vs_fp32": max_difference(rounded, exact), "loss": float(loss), "adapter_change": moved,
            "logprob_before": before, "logprob_after": reply_logprob(model, batch)}


# bf16 against float32 log-probs of SmolLM2's replies, max per token. Through 30 blocks of bf16 rounding (8-bit
# mantissa) with the weights dequantized: 0.042 measured here; Metal's quantized kernels accumulate in float32 as
# the dense path does, so 6x that. MLX's CPU quantized matmul in bf16 rounds its sums (2.4 measured here, 7x the
# dense bf16 error at one matmul): on the CPU backend the figure is reported, not judged (docs/PLATFORMS.md).
REAL_BF16_TOLERANCE = 0.25
# held-out replies' mean log-prob per token may fall by this much over the GRPO steps, which do not train on
# them (+0.016 measured here over 3 steps); a broken update costs whole nats
REAL_DRIFT_TOLERANCE = 0.1


def check_real_model(base_dir: Path) -> Check:
    """SmolLM2-135M-Instruct's 4-bit GGUF, kept quantized (on a Mac, Metal's quantized matmul and its backward):
    (1) bf16 on this device: log-probs against float32 and one bf16 LoRA step (finite loss, adapters move,
    the trained replies' log-prob rises); (2) a few GRPO steps in the run's own dtype (`auto`: bf16 LoRA on a
    GPU; float32 on the CPU backend, where bf16 matmuls run ~30x slower) with finite losses, adapters that
    move, held-out replies' log-prob not worse, the frozen weights in the run's dtype and the base still
    4-bit; rollout tokens/s against the chip's decode ceiling."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from ..common.errors import UserError
    from ..models.policy import is_quantized, load_policy, resolve_dtype
    from ..models.smollm2 import smollm2_path
    from ..planning import chips
    from ..trainer import Trainer
    from .benchmark import bandwidth_report

    try:
        smollm2_path(download=True)
    except UserError as err:
        return Check("real_model", "skip", f"SmolLM2 not available: {err}", dtype="bfloat16 + 4-bit base")
    held_out = sum_rows(2, True, 1)
    base = dict(model_id=REAL_MODEL, quantized_base="keep", use_chat_template=False, system_prompt=None)
    fp32, tokenizer = load_policy(small_config(**base, dtype="float32", use_lora=True), base_dir)
    bf16 = bf16_update(fp32, reply_batch(tokenizer, sum_rows(1, False, 2)))
    del fp32
    config = small_config(**base, dtype="auto", use_lora=True, lora_rank=8, lora_alpha=16, lora_layers=2,
                          batch_size=1, num_generations=4, max_generation_steps=6, max_prompt_length=32,
                          learning_rate=1e-4, beta=0.0, lr_schedule="constant", warmup_fraction=0.0,
                          num_steps=REAL_STEPS, rewards=["last_number_check", "last_number_digits"],
                          correctness="last_number", eval_size=len(held_out))
    dtype = resolve_dtype(config)
    trainer = Trainer.build(config, base_dir, rows=(sum_rows(64, False, 0), held_out))
    model = trainer.policy.model
    frozen = sorted({str(v.dtype).split(".")[-1] for k, v in tree_flatten(model.parameters())
                     if mx.issubdtype(v.dtype, mx.floating) and "lora_" not in k})
    quantized = is_quantized(model)
    adapters = {k: np.array(v) for k, v in tree_flatten(model.trainable_parameters())}
    replies = reply_batch(trainer.policy.tokenizer, held_out)
    first = reply_logprob(model, replies)
    losses, tokens, rollout_seconds = [], 0, 0.0
    for step in range(1, REAL_STEPS + 1):
        data = trainer.step(step)
        losses.append(float(data.update.loss) if not data.update.skipped else math.nan)
        tokens += int(data.lengths.sum())
        rollout_seconds += data.seconds.get("rollout", 0.0)
    last = reply_logprob(model, replies)
    moved = max(float(np.max(np.abs(np.array(v) - adapters[k])))
                for k, v in tree_flatten(model.trainable_parameters()))
    tokens_per_s = tokens / rollout_seconds if rollout_seconds else None
    bandwidth = bandwidth_report(tokens_per_s, model, config.num_generations, config.max_prompt_length,
                                 config.max_generation_steps, chips.this_chip())
    problems = []
    judged = mx.default_device().type == mx.gpu
    if judged and not bf16["bf16_vs_fp32"] <= REAL_BF16_TOLERANCE:
        problems.append(f"bf16 log-probs off float32 by {bf16['bf16_vs_fp32']:.2f}")
    if not (math.isfinite(bf16["loss"]) and bf16["adapter_change"] > 0
            and bf16["logprob_after"] > bf16["logprob_before"]):
        problems.append("the bf16 LoRA step did not raise the replies' log-prob")
    if not all(math.isfinite(x) for x in losses):
        problems.append("a GRPO loss was not finite (update skipped)")
    if not moved > 0:
        problems.append("the adapters did not move")
    if not last >= first - REAL_DRIFT_TOLERANCE:
        problems.append("held-out replies' log-prob fell")
    if frozen != [dtype]:
        problems.append(f"frozen weights in {', '.join(frozen)}, not {dtype}")
    if not quantized:
        problems.append("the base is no longer quantized")
    speed = f"{tokens_per_s:.1f} rollout tokens/s" if tokens_per_s else "no rollout timing"
    if bandwidth:
        speed += f" ({bandwidth['percent_of_ceiling']:.0f}% of the {bandwidth['chip']}'s decode ceiling)"
    tolerance = f"tolerance {REAL_BF16_TOLERANCE:g}" if judged else "not judged: MLX's CPU bf16 quantized matmul"
    detail = (f"SmolLM2-135M 4-bit: bf16 vs float32 log-probs {bf16['bf16_vs_fp32']:.2f} ({tolerance}), a bf16 LoRA step {bf16['logprob_before']:.2f} -> {bf16['logprob_after']:.2f} "
              f"per token; {REAL_STEPS} GRPO steps in {dtype} LoRA: losses {', '.join(f'{x:.3g}' for x in losses)}, "
              f"adapters moved by up to {moved:.1e}, held-out replies {first:.3f} -> {last:.3f} per token (may fall "
              f"<= {REAL_DRIFT_TOLERANCE:g}), base {'4-bit' if quantized else 'NOT quantized'}, frozen weights "
              f"{'/'.join(frozen)}; {speed}")
    return Check("real_model", verdict(not problems), detail + ("; FAILED: " + "; ".join(problems) if problems else ""),
                 {"bf16": bf16, "losses": losses, "adapter_change": moved, "heldout_logprob_first": first,
                  "heldout_logprob_last": last, "frozen_dtypes": frozen, "quantized_base": quantized,
                  "rollout_tokens_per_s": tokens_per_s, "bandwidth": bandwidth},
                 dtype=f"bfloat16 step, {dtype} GRPO, 4-bit base", device=device_name())


# ----------------------------------------------------------------------------- learning and speed

def check_learning(base_dir: Path, work: Path) -> Check:
    from ..config.train_config import load_config
    from ..run.loop import train

    config = load_config(None, {"num_steps": LEARNING_STEPS, "eval_every": LEARNING_STEPS, "wandb": False,
                                "monitoring_dir": str(work / "runs"), "run_name": "learning"})
    start = time.perf_counter()
    run = Path(train(config, base_dir)["run_dir"])
    seconds = time.perf_counter() - start
    accuracy = [r[EVAL_ACCURACY] for r in map(json.loads, RunPaths(run).metrics.read_text().splitlines())
                if EVAL_ACCURACY in r]
    gain = float(perturbed("learning", np.array(accuracy[-1] - accuracy[0])))
    want = LEARNING_SHARE * REFERENCE_GAIN
    return Check("learning", verdict(gain >= want),
                 f"default config, {LEARNING_STEPS} steps: held-out {accuracy[0]:.0%} -> {accuracy[-1]:.0%} "
                 f"({gain * 100:+.0f} points; ours {REFERENCE_GAIN * 100:+.0f}, pass at >= {want * 100:+.0f}) in "
                 f"{seconds:.0f} s", {"first": accuracy[0], "last": accuracy[-1], "gain": gain,
                                      "reference_gain": REFERENCE_GAIN, "seconds": seconds},
                 dtype="float32", device=device_name())


def check_bench(base_dir: Path) -> Check:
    """bench's goals, its tokens/s and share of the chip's decode ceiling, and (Metal) the wired limit bench
    set, read back."""
    import mlx.core as mx

    from ..config.train_config import load_config
    from ..planning.machine import wired_limit, wired_limit_in_effect
    from .benchmark import BenchOptions, run_bench

    if mx.metal.is_available():
        mx.set_wired_limit(0)  # read back bench's own wiring below
    report = run_bench(BenchOptions(load_config(), base_dir, repetitions=2, warmup=1, memory=False))
    wired, wanted_wired = wired_limit_in_effect(), wired_limit()
    goals = {g["name"]: {"measured": g["measured"], "target": g["target"], "met": g["met"]} for g in report["goals"]}
    ratios = {name: r.get("median") for name, r in report["ratios"].items() if isinstance(r, dict)}
    speeds = {name: p["tokens_per_s"]["median"] for name, p in report["paths"].items()}
    missed = [name for name, g in goals.items() if g["met"] is False]
    text = ", ".join(f"{n} {g['measured']:.2f}" for n, g in goals.items() if g["measured"] is not None)
    text += "; tokens/s " + ", ".join(f"{n} {v:.0f}" for n, v in speeds.items() if n in ("rollout", "update"))
    bandwidth = report.get("bandwidth")
    text += (f" ({bandwidth['percent_of_ceiling']:.0f}% of the {bandwidth['chip']}'s decode ceiling)" if bandwidth
             else " (no chip in the bandwidth table here)")
    load, cores = (os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0), os.cpu_count() or 1
    measured = {"goals": goals, "ratios": ratios, "tokens_per_s": speeds, "bandwidth": bandwidth,
                "wired_limit_read_back": wired, "wired_limit_wanted": wanted_wired, "load_average": load}
    extra = dict(dtype="float32", device=device_name())
    if wanted_wired is not None and wired != wanted_wired:
        return Check("bench", "fail", f"bench ran without wiring memory (read back {wired} B, train wires "
                     f"{wanted_wired} B): its figures are not the trained configuration's; {text}", measured, **extra)
    if missed and load > cores:
        return Check("bench", "skip", f"goals missed ({', '.join(missed)}) with the machine busy (load {load:.1f} "
                     f"on {cores} cores): ratios recorded, not judged; {text}", measured, **extra)
    return Check("bench", "fail" if missed else "pass",
                 f"bench goals {'missed: ' + ', '.join(missed) if missed else 'met'}; {text}", measured, **extra)


# ----------------------------------------------------------------------------- the whole test

CHECKS = ("precision", "shared_prompts", "chunked_head", "micro_batches", "resume", "devices", "plan_counts",
          "memory_plan", "rollout_flat", "memory", "real_model", "learning", "bench")
QUICK_SKIP = ("real_model",)  # `--quick`: the real model is the one download and the longest check
SEND_BACK = ("send back: {out} (and {log} if a check failed or the run stopped early): attach both to an issue "
             "of the mlx-grpo repository, or to whoever asked you to run this. They hold no paths to your data "
             "and no model weights.")


def log_tail(path: Path | None) -> list[str]:
    if path is None or not path.exists():
        return []
    with open(path, "rb") as log:
        log.seek(0, os.SEEK_END)
        log.seek(max(0, log.tell() - 64_000))
        return log.read().decode("utf-8", "replace").splitlines()[-LOG_TAIL_LINES:]


def run_selftest(base_dir: Path, skip: set[str] = frozenset(), say: Callable[[str], None] = print,
                 write: Callable[[dict], None] = lambda report: None, log: Path | None = None,
                 out_name: str = "mlx-grpo-selftest.json", tf32_at_start: str | None = None) -> dict:
    """Every check in order; a check that raises fails with its whole traceback (the others still run).
    `write` gets the report before each check (naming it as running) and after it: a process that dies
    mid-check leaves the checks so far. The caller has set MLX_ENABLE_TF32=0 (tf32.full_float32) before MLX's
    first matmul; `tf32_at_start` is what it was."""
    import mlx.core as mx

    from ..trainer import Trainer

    started = time.perf_counter()
    env = environment(tf32_at_start)
    results: list[Check] = []

    def report(running: str | None) -> dict:
        doc = {"schema": "mlx-grpo-selftest/2", "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "environment": env, "checks": [asdict(c) for c in results], "running": running,
               "finished": running is None and len(results) == len(CHECKS),
               "passed": all(c.status != "fail" for c in results) and running is None,
               "seconds": round(time.perf_counter() - started, 1), "log_tail": log_tail(log)}
        doc["summary"] = summary(doc) + [SEND_BACK.format(out=out_name, log=log.name if log else "the log")]
        return doc

    with tempfile.TemporaryDirectory(prefix="mlx-grpo-selftest-") as tmp:
        work = Path(tmp)
        state: dict[str, Any] = {}

        def prepare_batch() -> tuple:
            if "batch" not in state:
                trainer = Trainer.build(small_config(), base_dir)
                state["trainer"], (state["batch"], state["advantages"]) = trainer, sample_batch(trainer)
            return state["trainer"], state["batch"], state["advantages"]

        def plan_and_flat(name: str) -> Check:
            if "plan" not in state:
                state["plan"], state["work"] = check_plan(base_dir, preset_model_dir(work / "preset"))
            return state["plan"] if name == "memory_plan" else check_rollout_flat(state["work"])

        runners: dict[str, Callable[[], Check]] = {
            "precision": check_precision,
            "shared_prompts": lambda: check_shared_prompts(*prepare_batch()[:2]),
            "chunked_head": lambda: check_chunked_head(*prepare_batch()[:2]),
            "micro_batches": lambda: check_micro_batches(base_dir, *prepare_batch()[1:]),
            "resume": lambda: check_resume(base_dir, work),
            "devices": lambda: check_devices(base_dir, real="real_model" not in skip),
            "plan_counts": check_plan_counts,
            "memory_plan": lambda: plan_and_flat("memory_plan"),
            "rollout_flat": lambda: plan_and_flat("rollout_flat"),
            "memory": lambda: check_memory(base_dir, work, env["cache_limit_bytes"]),
            "real_model": lambda: check_real_model(base_dir),
            "learning": lambda: check_learning(base_dir, work),
            "bench": lambda: check_bench(base_dir),
        }
        for name in CHECKS:
            write(report(name))
            start = time.perf_counter()
            if name in skip:
                check = Check(name, "skip", "skipped by --skip" + (" or --quick" if name in QUICK_SKIP else ""))
            else:
                if os.environ.get(ABORT_ENV) == name:  # test-only: what a Metal abort does to the process
                    os.write(2, f"{METAL_ABORT_LINE}\n".encode())
                    os.abort()
                try:
                    check = runners[name]()
                except Exception as err:  # noqa: BLE001 - a check that crashes is a failed check, reported
                    from ..run.loop import metal_failure

                    text = str(err).strip().replace("\n", " ")
                    failure = metal_failure(err)
                    check = Check(name, "fail", f"{failure}; run the selftest again in a new process" if failure
                                  else f"raised {type(err).__name__}: {text[:300]}", error=traceback.format_exc())
            check.device = check.device or device_name()
            check.seconds = round(time.perf_counter() - start, 1)
            results.append(check)
            say(summary_line(check))
            mx.clear_cache()
            mx.set_cache_limit(env["cache_limit_bytes"])  # a `train` inside the check set its own plan's
    final = report(None)
    write(final)
    return final


def summary_line(check: Check) -> str:
    where = f" ({check.dtype}, {check.device})" if check.dtype else f" ({check.device})" if check.device else ""
    return f"{check.status.upper():<5} {check.name:<15} {check.detail}{where}  [{check.seconds:.0f} s]"


def summary(report: dict) -> list[str]:
    env = report["environment"]
    gib = lambda n: f"{n / 2**30:.1f} GiB" if n is not None else "n/a"  # noqa: E731
    state = ("PASSED" if report["passed"] else "FAILED") if report["running"] is None else \
        f"STOPPED during '{report['running']}'"
    wiring = {True: "", False: " (no effect before macOS 15)", None: ""}[env["wiring_takes_effect"]]
    lines = [
        f"mlx-grpo selftest {report['created']}: {state} after {report['seconds']:.0f} s",
        f"machine  {env['chip']}, GPU {env['gpu_architecture'] or 'n/a'} with {env['gpu_cores'] or 'n/a'} cores, "
        f"memory {gib(env['memory_bytes'])}, working set {gib(env['working_set_bytes'])}, wired limit "
        f"{gib(env['wired_limit_bytes'])}{wiring}, {'macOS ' + env['macos'] if env['macos'] else env['os']}, "
        f"load {env['load_average']} on {env['cores']} cores",
        f"power    {env['power_source']}, Low Power Mode {env['low_power_mode']}, thermal {env['thermal_state']}, "
        f"swap {gib(env['swap_used_bytes'])}, memory pressure "
        f"{env['memory_pressure'] or 'not available on this OS'}",
        f"float32  {env['float32']}; MLX_ENABLE_TF32 was {env['tf32_setting_at_start'] or 'unset'} at start, the "
        f"selftest runs with {env['tf32_setting'] or 'it unset'} so its float32 rows compare full float32",
        f"versions mlx {env['mlx']}, mlx-lm {env['mlx_lm']}, mlx-grpo {env['mlx_grpo']}, python {env['python']}; "
        f"backend {env['backend']}",
    ]
    lines += [summary_line(Check(**c)) for c in report["checks"]]
    return lines
