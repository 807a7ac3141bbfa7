"""Numerical equivalences: two ways the trainer computes the same thing (the shared prompt, the chunked head,
micro-batches, resume) agree within float32's rounding."""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

from ...checkpoint import weights_name
from ...telemetry.rundir.layout import RunPaths
from .common import FP32_TOLERANCE, Check, device_name, max_difference, perturbed, sample_batch, small_config, verdict


def check_precision() -> Check:
    """What `dtype: auto` resolves to: bf16 for LoRA on a GPU (half the memory), float32 elsewhere."""
    from ...models import policy as models

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
    from ...models.policy import resolve_dtype
    from ...update import completion_logprobs, shares_prompts

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
    from ...models.policy import has_plain_head, resolve_dtype
    from ...update import completion_logprobs

    model, mask, t = trainer.policy.model, np.array(batch.mask), trainer.config.temperature
    if not has_plain_head(model):
        return Check("chunked_head", "skip", "this model family runs its own head (no chunks)")
    chunked = perturbed("chunked_head", np.array(completion_logprobs(model, batch, t, chunk_size=3)) * mask)
    whole = np.array(completion_logprobs(model, batch, t)) * mask
    diff, tol = max_difference(chunked, whole), FP32_TOLERANCE
    return Check("chunked_head", verdict(diff <= tol),
                 f"log-probs, LM head 3 positions at a time vs one pass: max |difference| {diff:.1e} "
                 f"(tolerance {tol:g})",
                 {"max_abs_difference": diff, "tolerance": tol}, dtype=resolve_dtype(trainer.config))


def sgd_step(config, base_dir: Path, batch, advantages) -> np.ndarray:
    """How one update of the trainer (plain SGD at rate 1: the change is the clipped gradient itself) moves
    the trainable weights, flattened. AdamW's first step is about the gradient's sign, which rounding flips
    for near-zero entries."""
    import mlx.optimizers as optim
    from mlx.utils import tree_flatten

    from ...trainer import Trainer

    trainer = replace(Trainer.build(config, base_dir), optimizer=optim.SGD(learning_rate=1.0))
    before = {k: np.array(v) for k, v in tree_flatten(trainer.policy.model.trainable_parameters())}
    trainer.update(batch, advantages, trainer.reference_logprobs(batch))
    after = tree_flatten(trainer.policy.model.trainable_parameters())
    return np.concatenate([(np.array(v) - before[k]).ravel() for k, v in after])


def relative_difference(a: np.ndarray, b: np.ndarray) -> float:
    return max_difference(a, b) / (float(np.max(np.abs(b))) or 1.0)


def check_micro_batches(base_dir: Path, batch, advantages) -> Check:
    """One update of the same weights on the same batch, whole vs in micro-batches of 3 (cutting groups)."""
    from ...models.policy import resolve_dtype

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

    from ...update import completion_logprobs

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
    from ...models.policy import resolve_dtype
    from ...run.loop import train
    from ...trainer import Trainer

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
    records = [[json.loads(line) for line in RunPaths(run).metrics.read_text().splitlines()]
               for run in (whole, resumed)]
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


