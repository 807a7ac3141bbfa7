"""A real 4-bit model: SmolLM2-135M's GGUF kept quantized, in bf16 and through a few GRPO steps."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from .common import (
    REAL_MODEL,
    Check,
    device_name,
    max_difference,
    perturbed,
    reply_batch,
    small_config,
    sum_rows,
    verdict,
)
from .devices import cast_model

REAL_STEPS = 3

def reply_logprob(model, batch) -> float:
    """Mean log-prob per token of the reference replies."""
    from ...update import completion_logprobs

    mask = np.array(batch.mask)
    return float((np.array(completion_logprobs(model, batch, 1.0)) * mask).sum() / mask.sum())


def bf16_update(model, batch) -> dict[str, Any]:
    """One AdamW step of bf16 LoRA on the 4-bit base, raising the replies' log-likelihood: log-probs against
    float32 first, then loss, adapter change and log-prob after."""
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    from mlx.utils import tree_flatten

    from ...models.policy import apply_adapters
    from ...update import completion_logprobs

    mask = np.array(batch.mask)
    exact = np.array(completion_logprobs(model, batch, 1.0)) * mask
    cast_model(model, mx.bfloat16)
    # new adapters add zero (LoRA's B starts at 0), so the step's own forward gives the bf16 log-probs and the
    # log-prob before the step: one bf16 pass instead of three (the CPU's bf16 quantized matmul is slow)
    apply_adapters(model, small_config(use_lora=True, lora_rank=8, lora_layers=2))
    start = {k: np.array(v) for k, v in tree_flatten(model.trainable_parameters())}

    def loss_fn(m):
        logprobs = completion_logprobs(m, batch, 1.0)
        return -(logprobs * batch.mask).sum() / batch.mask.sum(), logprobs

    (loss, logprobs), grads = nn.value_and_grad(model, loss_fn)(model)
    rounded = perturbed("real_model", np.array(logprobs.astype(mx.float32)) * mask)
    before = -float(loss)
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

    from ...common.errors import UserError
    from ...models.policy import load_policy, resolve_dtype
    from ...models.smollm2 import smollm2_path
    from ...planning import chips
    from ...trainer import Trainer
    from ..benchmark import bandwidth_report

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
    run = grpo_steps(Trainer.build(config, base_dir, rows=(sum_rows(64, False, 0), held_out)), held_out)
    run["bandwidth"] = bandwidth_report(run["rollout_tokens_per_s"], run.pop("model"), config.num_generations,
                                        config.max_prompt_length, config.max_generation_steps, chips.this_chip())
    judged = mx.default_device().type == mx.gpu
    problems = real_model_problems(bf16, run, dtype, judged)
    return Check("real_model", verdict(not problems),
                 real_model_detail(bf16, run, dtype, judged) + ("; FAILED: " + "; ".join(problems) if problems else ""),
                 {"bf16": bf16, **run}, dtype=f"bfloat16 step, {dtype} GRPO, 4-bit base", device=device_name())


def grpo_steps(trainer, held_out: list[dict]) -> dict[str, Any]:
    """`REAL_STEPS` GRPO steps of `trainer`: their losses, how far the adapters moved, the held-out replies'
    log-prob before and after, the frozen weights' dtypes, whether the base stayed quantized, rollout speed."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from ...models.policy import is_quantized

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
    return {"losses": losses, "adapter_change": moved, "heldout_logprob_first": first,
            "heldout_logprob_last": last, "frozen_dtypes": frozen, "quantized_base": quantized,
            "rollout_tokens_per_s": tokens / rollout_seconds if rollout_seconds else None, "model": model}


def real_model_problems(bf16: dict[str, Any], run: dict[str, Any], dtype: str, judged: bool) -> list[str]:
    problems = []
    if judged and not bf16["bf16_vs_fp32"] <= REAL_BF16_TOLERANCE:
        problems.append(f"bf16 log-probs off float32 by {bf16['bf16_vs_fp32']:.2f}")
    if not (math.isfinite(bf16["loss"]) and bf16["adapter_change"] > 0
            and bf16["logprob_after"] > bf16["logprob_before"]):
        problems.append("the bf16 LoRA step did not raise the replies' log-prob")
    if not all(math.isfinite(x) for x in run["losses"]):
        problems.append("a GRPO loss was not finite (update skipped)")
    if not run["adapter_change"] > 0:
        problems.append("the adapters did not move")
    if not run["heldout_logprob_last"] >= run["heldout_logprob_first"] - REAL_DRIFT_TOLERANCE:
        problems.append("held-out replies' log-prob fell")
    if run["frozen_dtypes"] != [dtype]:
        problems.append(f"frozen weights in {', '.join(run['frozen_dtypes'])}, not {dtype}")
    if not run["quantized_base"]:
        problems.append("the base is no longer quantized")
    return problems


def real_model_detail(bf16: dict[str, Any], run: dict[str, Any], dtype: str, judged: bool) -> str:
    tokens_per_s, bandwidth = run["rollout_tokens_per_s"], run["bandwidth"]
    speed = f"{tokens_per_s:.1f} rollout tokens/s" if tokens_per_s else "no rollout timing"
    if bandwidth:
        speed += f" ({bandwidth['percent_of_ceiling']:.0f}% of the {bandwidth['chip']}'s decode ceiling)"
    tolerance = f"tolerance {REAL_BF16_TOLERANCE:g}" if judged else "not judged: MLX's CPU bf16 quantized matmul"
    return (f"SmolLM2-135M 4-bit: bf16 vs float32 log-probs {bf16['bf16_vs_fp32']:.2f} ({tolerance}), a bf16 LoRA "
            f"step {bf16['logprob_before']:.2f} -> {bf16['logprob_after']:.2f} per token; {REAL_STEPS} GRPO steps "
            f"in {dtype} LoRA: losses {', '.join(f'{x:.3g}' for x in run['losses'])}, adapters moved by up to "
            f"{run['adapter_change']:.1e}, held-out replies {run['heldout_logprob_first']:.3f} -> "
            f"{run['heldout_logprob_last']:.3f} per token (may fall <= {REAL_DRIFT_TOLERANCE:g}), base "
            f"{'4-bit' if run['quantized_base'] else 'NOT quantized'}, frozen weights "
            f"{'/'.join(run['frozen_dtypes'])}; {speed}")
