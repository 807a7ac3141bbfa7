"""Fitting a budget: the memory settings worth trying, fastest first, and the first whose predicted peak
(plan.predict) fits; `micro_batch_size: auto` resolved to speed; when no setting is enough, the smallest
changes to the run that fit."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..config.train_config import TrainConfig
from .plan import MemorySettings, ModelShape, PhasePeaks, Shapes, predict

CHUNKS = (0, 256, 128, 64, 32)


def candidate_settings(shape: "ModelShape", shapes: "Shapes") -> list[MemorySettings]:
    """Every setting worth trying, fastest first: no block recompute before recompute (about a third
    more compute), micro-batches from the smallest that runs at full speed down (a larger one is no
    faster, `fast_micro_batch`), large head chunks before small."""
    return [MemorySettings(m, c, ckpt) for ckpt in (False, True) for m in micro_batches_by_speed(shape, shapes)
            for c in CHUNKS]


@dataclass(frozen=True)
class Verdict:
    budget: float
    budget_source: str
    configured: PhasePeaks
    settings: MemorySettings  # what the config asks for
    fitting: MemorySettings | None  # the fastest settings that fit (None: nothing fits)
    fitting_peaks: PhasePeaks | None
    other_changes: list[str]  # when nothing fits: what else would
    plain_head: bool = True  # the model's head is its plain [V, H] matrix (streamed or chunked)
    frozen_head: bool = True  # ... and LoRA leaves it frozen (streamed in the update too)

    @property
    def fits(self) -> bool:
        return self.configured.peak <= self.budget

    def describe(self, settings: MemorySettings) -> str:
        return settings.describe(self.plain_head, self.frozen_head)


# Recommended settings keep the predicted peak under this share of the budget: the formula is
# within ~15% of measurements, and the system needs some memory of its own.
MARGIN = 0.85


# A forward + backward pass of at least this many floating-point operations runs the update at full speed:
# per-pass overheads are then lost in the noise. Measured at Qwen2.5-0.5B width cut to 2 layers (issue 28):
# micro-batches of 1, 2, 4 and 8 completions of 277 positions (~0.3 TFLOP a pass each) took the same time
# within +-6%, while the update's peak halved with each halving; the shipped model's whole batch (128 x 33
# positions) is ~25 GFLOP, and splitting it slows it down.
FULL_SPEED_FLOPS = 5e10
# ... and covers at least this many completion positions: every pass reads the whole [V, H] LM head (545 MB
# at Qwen2.5-0.5B in fp32) for its rows, so a pass of a few rows is bound by that read. Micro-batches of 2
# completions of 16 tokens ran the update at 0.45x the whole batch's throughput at that width.
FULL_SPEED_POSITIONS = 256


def pass_flops(shape: ModelShape, sequences: int, length: int) -> float:
    """Forward + backward floating-point operations of one update pass over `sequences` x `length` positions:
    2 per weight and position forward, twice that backward; the LM head counts with the blocks."""
    return 6.0 * sequences * length * (shape.layers * shape.block_parameters() + shape.vocab * shape.hidden)


def fast_micro_batch(shape: ModelShape, shapes: Shapes) -> int:
    """The smallest micro-batch whose passes run at full speed (FULL_SPEED_FLOPS and FULL_SPEED_POSITIONS);
    0 (the whole batch) when no smaller one does."""
    for m in sorted(m for m in candidate_micro_batches(shapes.sequences) if m):
        if pass_flops(shape, m, shapes.length) >= FULL_SPEED_FLOPS and \
                m * shapes.completion_length >= FULL_SPEED_POSITIONS:
            return m
    return 0


def micro_batches_by_speed(shape: ModelShape, shapes: Shapes) -> list[int]:
    """The smallest full-speed micro-batch, then ever smaller ones (0: the whole batch, first when even
    one pass over all of it is short)."""
    fast = fast_micro_batch(shape, shapes)
    return [m for m in candidate_micro_batches(shapes.sequences) if fast == 0 or 0 < m <= fast]


def configured_settings(config: TrainConfig, shape: ModelShape, shapes: Shapes, dtype: str,
                        budget: float) -> MemorySettings:
    """The config's memory keys, with `micro_batch_size: auto` resolved to speed, not memory: the smallest
    micro-batch that runs at full speed (`fast_micro_batch`; a larger one would only spend memory), or the
    largest smaller one whose predicted peak fits MARGIN of the budget (on a Mac the budget is already the
    recommended working set, so the rest of the machine keeps its share); when none does, the same with
    `grad_checkpoint` on."""
    if config.micro_batch_size != "auto":
        return MemorySettings(config.micro_batch_size, config.logits_chunk_size, config.grad_checkpoint)
    sizes = micro_batches_by_speed(shape, shapes)
    # block recompute (about a third more compute) only when no micro-batch fits without it: long completions
    for recompute in sorted({config.grad_checkpoint, True}):
        for m in sizes:
            settings = MemorySettings(m, config.logits_chunk_size, recompute)
            if predict(shape, shapes, config, settings, dtype).peak <= MARGIN * budget:
                return settings
    return MemorySettings(sizes[-1], config.logits_chunk_size, config.grad_checkpoint)


def candidate_micro_batches(sequences: int) -> list[int]:
    """0 (all at once), then ever smaller micro-batches down to 1."""
    return [0, *sorted({m for m in (64, 32, 16, 8, 4, 2, 1) if m < sequences}, reverse=True)]


def plan(shape: ModelShape, shapes: Shapes, config: TrainConfig, dtype: str, budget: float,
         budget_source: str, lora_dtype: str | None = None) -> Verdict:
    """`lora_dtype`: what the run would compute in with LoRA (dtype `auto` differs between the two)."""
    settings = configured_settings(config, shape, shapes, dtype, budget)
    configured = predict(shape, shapes, config, settings, dtype)
    fitting = fitting_peaks = None
    for candidate in candidate_settings(shape, shapes):
        peaks = predict(shape, shapes, config, candidate, dtype)
        if peaks.peak <= MARGIN * budget:
            fitting, fitting_peaks = candidate, peaks
            break
    other = [] if fitting is not None else bigger_changes(shape, shapes, config, dtype, lora_dtype or dtype,
                                                          MARGIN * budget)
    return Verdict(budget, budget_source, configured, settings, fitting, fitting_peaks, other, shape.plain_head,
                   config.use_lora)


def bigger_changes(shape: ModelShape, shapes: Shapes, config: TrainConfig, dtype: str, lora_dtype: str,
                   budget: float) -> list[str]:
    """When no memory setting is enough: the smallest changes to the run that fit, with the leanest
    settings. Model changes first (LoRA, a 4-bit base), each alone or with fewer prompts per step or
    shorter completions."""
    leanest = MemorySettings(1, 32, True)
    variants: list[tuple[list[str], ModelShape, TrainConfig]] = [([], shape, config)]
    dtypes = {False: dtype, True: lora_dtype}
    if not config.use_lora:
        variants.append((["use_lora: true"], shape, replace(config, use_lora=True)))
    if shape.bits is None:
        variants.append((["use_lora: true", "a 4-bit base model (mlx_lm.convert -q)"] if not config.use_lora
                         else ["a 4-bit base model (mlx_lm.convert -q)"], replace(shape, bits=4),
                         replace(config, use_lora=True)))
    found: list[str] = []
    for changes, model, cfg in variants:
        run_dtype = dtype if cfg.use_lora == config.use_lora else dtypes[True]
        if predict(model, shapes, cfg, leanest, run_dtype).peak <= budget:
            found.append(" + ".join(changes))
        else:
            for prompts in range(shapes.prompts - 1, 0, -1):
                if predict(model, replace(shapes, prompts=prompts), cfg, leanest, run_dtype).peak <= budget:
                    found.append(" + ".join([*changes, f"batch_size: {prompts}"]))
                    break
            else:
                for length in (1536, 1024, 768, 512, 384, 256, 128, 64):
                    if length < shapes.completion_length and predict(
                            model, replace(shapes, completion_length=length), cfg, leanest, run_dtype).peak <= budget:
                        found.append(" + ".join([*changes, f"max_generation_steps: {length}"]))
                        break
        if len(found) == 2:
            break
    return [f for f in found if f]
