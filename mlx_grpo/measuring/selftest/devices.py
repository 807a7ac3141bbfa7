"""Metal against the CPU: the same log-probs and updates on two devices, and the real model's kernels."""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Callable

import numpy as np

from .common import (
    BF16_FLOOR,
    FP32_TOLERANCE,
    REAL_MODEL,
    Check,
    max_difference,
    perturbed,
    reply_batch,
    sample_batch,
    small_config,
    sum_rows,
    verdict,
)
from .numerics import relative_difference, sgd_step


def logprobs_on(device, model, batch, temperature: float) -> np.ndarray:
    import mlx.core as mx

    from ...update import completion_logprobs

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

    from ...planning.tf32 import TF32_BITS, tf32_rounding

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

    from ...models.policy import apply_adapters, load_policy
    from ...update import completion_logprobs

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

    from ...common.errors import UserError
    from ...models.smollm2 import smollm2_path
    from ...planning.tf32 import float32_state
    from ...trainer import Trainer

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

    from ...planning.tf32 import ENV

    whole = replace(batch, prompts=[])
    with tempfile.TemporaryDirectory(prefix="mlx-grpo-tf32-") as tmp:
        saved, out = Path(tmp) / "batch.npz", Path(tmp) / "logprobs.npy"
        np.savez(saved, inputs=np.array(whole.inputs), targets=np.array(whole.targets),
                 positions=np.array(whole.positions), mask=np.array(whole.mask), num_tokens=whole.num_tokens,
                 temperature=temperature)
        child = {k: v for k, v in os.environ.items() if k != ENV}  # MLX's default: TF32 on Neural Accelerators
        subprocess.run([sys.executable, "-m", "mlx_grpo.measuring.tf32_child", str(saved), str(out)], env=child,
                       check=True,
                       capture_output=True, timeout=600)
        return np.load(out)


