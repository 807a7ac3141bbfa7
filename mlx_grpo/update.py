"""The policy update: training batches, completion log-probs, the GRPO loss closure and the optimiser step.

`build_train_batch` lays a rollout out as right-padded sequences; `completion_scores` scores the
completion tokens under a model (the policy, or the reference for the KL term); `update_policy` runs
`num_iterations` optimiser steps on one rollout with gradient clipping and a guard that keeps NaN/Inf
away from the weights.

Memory. A whole batch's logits are [N, T, V] floats: 32 completions of 1024 tokens over a 152k
vocabulary are 20 GB in float32 before the backward pass multiplies them. So nothing here holds the
whole batch's logits: the batch goes through the model in micro-batches of `micro_batch_size`
completions whose gradients are summed, and each micro-batch's LM head runs over `logits_chunk_size`
positions at a time, recomputed in the backward pass (`mx.checkpoint`) instead of kept. Each part
divides its loss by the sizes of the whole update (`grpo.LossTotals`), so the summed gradient is the
whole batch's gradient for every loss type, and the statistics are computed once from the gathered
log-probs. `grad_checkpoint` also recomputes each transformer block instead of keeping its activations.

Speed. A group's G completions share one pass over their prompt (`completion_states`), as in the rollout;
with LoRA on the last blocks the pass starts at the first adapted one, from the states the rollout kept
(frozen_prefix.py).
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, Callable, Iterator

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_map

from . import frozen_prefix, grpo
from .config.train_config import TrainConfig
from .extras import token_entropy
from .frozen_prefix import Captured
from .head_scores import (
    chunked_head_logprobs,
    head_token_stats,
    scaled,
    streamed_head_scores,
    streams_head,
    target_logprobs,
)
from .models.cpu_kernels import cpu_kernels
from .models.families import entropy_stride
from .models.policy import has_plain_head, lm_head, project_to_vocab
from .rollout import Rollout, has_plain_kv_cache, prefill_plain
from .telemetry.metrics.names import SAMPLING_LOGP_DIFF_MAX, SAMPLING_LOGP_DIFF_MEAN

# ----------------------------------------------------------------------------- batches

@dataclass
class TrainBatch:
    """Right-padded prompt+completion sequences and where each completion token sits."""

    inputs: mx.array  # [N, S-1]
    targets: mx.array  # [N, S-1]
    positions: mx.array  # [N, T] index into the S-1 axis of completion token t
    mask: mx.array  # [N, T] 1 for real completion tokens
    num_tokens: int  # completion tokens in the batch
    sequence_lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # prompt + completion
    # The distinct prompts, in row order (a GRPO group's rows are one run), and row i's index into them.
    # Empty: each row is scored over its whole sequence.
    prompts: list[list[int]] = field(default_factory=list)
    prompt_of_row: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    # The rollout's frozen-block outputs for these rows (frozen_prefix.py): the reference pass and the update
    # start at the first adapted block with them. None: every block runs.
    prefix: Captured | None = None

    @property
    def num_sequences(self) -> int:
        return int(self.inputs.shape[0])

    def rows(self, start: int, stop: int) -> "TrainBatch":
        """Rows start..stop, cut to their own longest sequence and completion (less padding to compute)."""
        mask = self.mask[start:stop]
        width = max(1, int(self.sequence_lengths[start:stop].max()) - 1) if self.sequence_lengths.size \
            else self.inputs.shape[1]
        # the last trained position, not the count: a multi-turn row's environment tokens are holes in its mask
        trained = np.nonzero(np.array(mask).any(axis=0))[0]
        completion = int(trained[-1]) + 1 if trained.size else 1
        of_row = self.prompt_of_row[start:stop]
        first, last = (int(of_row[0]), int(of_row[-1]) + 1) if of_row.size else (0, 0)
        return replace(self, inputs=self.inputs[start:stop, :width], targets=self.targets[start:stop, :width],
                       positions=self.positions[start:stop, :completion], mask=mask[:, :completion],
                       num_tokens=int(mask.sum().item()), sequence_lengths=self.sequence_lengths[start:stop],
                       prompts=self.prompts[first:last], prompt_of_row=of_row - first,
                       prefix=None if self.prefix is None else self.prefix.take(range(start, stop)))

    def micro_batches(self, size: int | str) -> Iterator[tuple[slice, "TrainBatch"]]:
        """(rows, micro-batch) pairs of at most `size` sequences (0: the whole batch in one). `auto` is
        resolved by the run's memory plan before training; called directly, it means the whole batch."""
        size = size if isinstance(size, int) and size > 0 else self.num_sequences
        for start in range(0, self.num_sequences, size):
            stop = min(start + size, self.num_sequences)
            yield slice(start, stop), (self if size >= self.num_sequences else self.rows(start, stop))


def build_train_batch(rollout: Rollout, pad_id: int, mask_truncated: bool = False) -> TrainBatch:
    """Prompt then completion, padded on the right: a causal mask is then exactly the rollout's view.
    `mask_truncated`: completions that hit the budget without ending get no loss tokens."""
    seqs = [p + c for p, c in zip(rollout.prompts, rollout.completions)]
    model_mask = getattr(rollout, "model_mask", None)  # S-GRPO's serial groups are one-turn rollouts without it
    width = max(len(s) for s in seqs)
    tokens = np.full((len(seqs), width), pad_id, dtype=np.int32)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = s
    t_max = max(1, max(len(c) for c in rollout.completions))
    positions = np.zeros((len(seqs), t_max), dtype=np.int32)
    mask = np.zeros((len(seqs), t_max), dtype=np.float32)
    for i, (p, c) in enumerate(zip(rollout.prompts, rollout.completions)):
        n = len(c)
        # the logit at position k predicts token k+1, so completion token t comes from len(p)-1+t
        positions[i, :n] = np.arange(len(p) - 1, len(p) - 1 + n)
        mask[i, :n] = 0.0 if mask_truncated and rollout.truncated[i] else 1.0
        if model_mask is not None:  # tool and environment tokens: no loss, no KL, no entropy
            mask[i, :n] *= np.array(model_mask[i], dtype=np.float32)
    new_prompt = [i == 0 or rollout.prompts[i] != rollout.prompts[i - 1] for i in range(len(seqs))]
    return TrainBatch(mx.array(tokens[:, :-1]), mx.array(tokens[:, 1:]), mx.array(positions), mx.array(mask),
                      int(mask.sum()), np.array([len(s) for s in seqs], dtype=np.int32),
                      [list(p) for p, new in zip(rollout.prompts, new_prompt) if new],
                      np.cumsum(new_prompt, dtype=np.int32) - 1, rollout.prefix)


# ----------------------------------------------------------------------------- scoring completions

@dataclass
class CompletionScores:
    """The log-prob of each completion token under the model, [N, T]; when asked, the entropy of its
    distribution at every `entropy_stride`-th position, [N, ceil(T / stride)]; entropy_logging's
    per-token arrays, [N, T]."""

    logp: mx.array
    entropy: mx.array | None = None
    token_stats: dict[str, mx.array] = field(default_factory=dict)


def shares_prompts(model: nn.Module, batch: TrainBatch) -> bool:
    """Whether the batch's completions can share one pass per prompt: rows with a common prompt, every
    prompt non-empty, plain key/value caches over its longest sequence (a sliding window at least that
    long counts), and no per-block recompute (`mx.checkpoint` takes arrays, not caches)."""
    longest = int(batch.sequence_lengths.max()) if batch.sequence_lengths.size else int(batch.inputs.shape[1]) + 1
    return (0 < len(batch.prompts) < batch.num_sequences and all(batch.prompts)
            and has_plain_kv_cache(model, longest)
            and not any(getattr(block, "grad_checkpointed", False) for block in getattr(model, "layers", [])))


def completion_states(model: nn.Module, batch: TrainBatch, targets: mx.array, hidden: bool,
                      gradient: bool = True) -> mx.array:
    """At the positions that predict the completion tokens: hidden states, [N, T, H] (`hidden`, a plain
    head), else logits, [N, T, V].

    The G completions of a group start from one prompt, so the prompt goes through the model once and
    its keys and values are copied to the G rows, which then run only their completion tokens on that
    cache (the rollout's own prefill, differentiated). At the default run's shape (9-token prompts,
    ~11-token completions, G = 8) that is 40% fewer tokens and ~40% less time per pass; gradients equal
    the whole-sequence pass's to float rounding (tests/core/test_shared_prompts.py).

    With the rollout's frozen-block outputs (`batch.prefix`) the forward starts at the first adapted block
    (frozen_prefix.py): the same tokens, masks and positions, without the frozen blocks' work. Without a
    `gradient` to take (the reference pass), the blocks run through models/cpu_kernels.py on the CPU."""
    with nullcontext() if gradient else cpu_kernels(model):
        return _completion_states(model, batch, targets, hidden)


def _completion_states(model: nn.Module, batch: TrainBatch, targets: mx.array, hidden: bool) -> mx.array:
    first = frozen_prefix.first_block(model) if batch.prefix is not None else 0
    prefix = batch.prefix if first else None
    if shares_prompts(model, batch):
        width = targets.shape[1]
        prompt_states = None
        if prefix is not None:
            firsts = np.searchsorted(batch.prompt_of_row, np.arange(len(batch.prompts)))
            prompt_states = frozen_prefix.left_padded([prefix.prompt[i] for i in firsts.tolist()])
        with frozen_prefix.injecting(model, prompt_states):
            last, cache = prefill_plain(model, batch.prompts, 0, max(map(len, batch.prompts)) + width,
                                        batch.prompt_of_row, hidden, first)
        if width == 1:
            return last[:, None, :]
        run = model.model if hidden else model
        fed = None if prefix is None else frozen_prefix.right_padded(prefix.completion, width - 1)
        with frozen_prefix.injecting(model, fed):
            rest = run(targets[:, :-1], cache=cache)
        return mx.concatenate([last[:, None, :], rest], axis=1)
    fed = None
    if prefix is not None:  # each row's prompt then its fed-back completion tokens, right-padded
        lengths = batch.sequence_lengths - 1
        fed = frozen_prefix.right_padded(
            [mx.concatenate([p, c[:n - p.shape[0]]]) for p, c, n in zip(prefix.prompt, prefix.completion,
                                                                        lengths.tolist())], batch.inputs.shape[1])
    with frozen_prefix.injecting(model, fed):
        states = model.model(batch.inputs) if hidden else model(batch.inputs)
    return mx.take_along_axis(states, batch.positions[:, :, None], axis=1)


def completion_scores(model: nn.Module, batch: TrainBatch, temperature: float, *, entropy_stride: int = 0,
                      token_stats: bool = False, chunk_size: int = 0, gradient: bool = True) -> CompletionScores:
    """Log-probs of the completion tokens under `model` at `temperature`, [N, T]; with `entropy_stride`
    > 0 also the entropy at every entropy_stride-th completion position (no gradient).

    A frozen plain head (LoRA, the reference pass) is streamed by default (`streamed_head_scores`): its
    logits never exist whole. `chunk_size` > 0 instead runs the LM head over that many completion
    positions at a time, in the forward and the backward pass, so at most one chunk's [N, chunk, V]
    logits exist at once; a trained head (full fine-tuning) without it builds the whole logits.
    `gradient` False: the log-probs will not be differentiated (the reference pass), which spares work."""
    targets = mx.take_along_axis(batch.targets, batch.positions, axis=1)
    if not has_plain_head(model):  # the model's own head: logits at every completion position at once
        logits = completion_states(model, batch, targets, False, gradient).astype(mx.float32) / temperature
        scores = CompletionScores(target_logprobs(logits, targets))
        if entropy_stride:
            scores.entropy = grpo.token_entropy(mx.stop_gradient(logits[:, ::entropy_stride]))
        if token_stats:
            scores.token_stats = token_entropy.token_stats(logits)
        return scores
    hidden = scaled(completion_states(model, batch, targets, True, gradient), temperature)
    head = lm_head(model)
    logp = None
    if chunk_size == 0 and streams_head(head):
        logp, entropy = streamed_head_scores(hidden, targets, head, gradient)
        scores = CompletionScores(logp, entropy[:, ::entropy_stride] if entropy_stride and entropy is not None
                                  else None)
        if entropy_stride and entropy is None:
            scores.entropy = grpo.token_entropy(project_to_vocab(head, mx.stop_gradient(
                hidden[:, ::entropy_stride])).astype(mx.float32))
        if token_stats:
            scores.token_stats = head_token_stats(mx.stop_gradient(hidden), head, chunk_size)
        return scores
    if 0 < chunk_size < targets.shape[1]:
        try:
            logp = chunked_head_logprobs(hidden, targets, head, chunk_size)
        except NotImplementedError:
            pass  # a trainable head that is not one plain matrix (LoRA on the head): all positions at once
    if logp is None:
        logp = target_logprobs(project_to_vocab(head, hidden).astype(mx.float32), targets)
    scores = CompletionScores(logp)
    if entropy_stride:
        sample = mx.stop_gradient(hidden[:, ::entropy_stride])
        scores.entropy = grpo.token_entropy(project_to_vocab(head, sample).astype(mx.float32))
    if token_stats:
        scores.token_stats = head_token_stats(mx.stop_gradient(hidden), head, chunk_size)
    return scores


def completion_logprobs(model: nn.Module, batch: TrainBatch, temperature: float, chunk_size: int = 0,
                        gradient: bool = True) -> mx.array:
    """Log-probs of the completion tokens under `model`, [N, T]."""
    return completion_scores(model, batch, temperature, chunk_size=chunk_size, gradient=gradient).logp


@lru_cache(maxsize=None)
def _checkpointed_class(block_class: type) -> type:
    def __call__(self, *args, **kwargs):
        def run(params, *args, **kwargs):
            self.update(params)
            return block_class.__call__(self, *args, **kwargs)

        return mx.checkpoint(run)(self.trainable_parameters(), *args, **kwargs)

    return type(block_class.__name__, (block_class,), {"__call__": __call__, "grad_checkpointed": True})


def checkpoint_blocks(model: nn.Module) -> None:
    """Recompute each transformer block in the backward pass instead of keeping its activations: the
    backward then holds one block's activations at a time (about a third more compute). Only this
    model's blocks change (their class becomes a checkpointing subclass; weights and names stay)."""
    for block in getattr(model, "layers", []):
        if not getattr(block, "grad_checkpointed", False):
            block.__class__ = _checkpointed_class(type(block))


# ----------------------------------------------------------------------------- the update

def loss_options(config: TrainConfig) -> grpo.LossOptions:
    """The config's loss settings, as grpo.py takes them."""
    return grpo.LossOptions(beta=config.beta, epsilon=config.epsilon, epsilon_high=config.epsilon_high,
                            loss_type=config.loss_type, importance_level=config.importance_sampling_level,
                            max_completion_length=config.max_generation_steps, delta=config.delta)


def make_loss_fn(config: TrainConfig) -> Callable:
    """loss_fn(model, micro_batch, advantages, old_logp, ref_logp, totals) -> (loss, (logp, entropy, token
    stats)): the micro-batch's share of the whole update's loss (`totals`), for nn.value_and_grad."""
    def loss_fn(model, batch: TrainBatch, advantages, old_logp, ref_logp, totals: grpo.LossTotals):
        scores = completion_scores(model, batch, config.temperature,
                                   entropy_stride=entropy_stride(config.max_generation_steps),
                                   token_stats=config.entropy_logging.enable, chunk_size=config.logits_chunk_size)
        loss = grpo.grpo_loss(scores.logp, old_logp, ref_logp, advantages, batch.mask, loss_options(config), totals)
        return loss, (mx.stop_gradient(scores.logp), scores.entropy, scores.token_stats)

    return loss_fn


def global_norm(grads: Any) -> mx.array:
    return mx.sqrt(sum(mx.sum(mx.square(g.astype(mx.float32))) for _, g in tree_flatten(grads)))


def clip_by_global_norm(grads: Any, max_norm: float) -> tuple[Any, mx.array]:
    """Scale gradients down to `max_norm` (0 turns clipping off); return them and the norm before clipping."""
    if max_norm > 0:
        return optim.clip_grad_norm(grads, max_norm)
    return grads, global_norm(grads)


class LocalReduce:
    """How one process's update sees the whole update: its own batch is all of it. `World` (distributed)
    has the same two methods over every rank."""

    def loss_totals(self, batch: TrainBatch) -> grpo.LossTotals:
        return grpo.LossTotals(batch.num_sequences, batch.num_tokens)

    def sum_update(self, loss: mx.array, grads: Any) -> tuple[mx.array, Any]:
        return loss, grads


def _pad_to(array: mx.array, width: int) -> mx.array:
    return array if array.shape[1] == width else mx.pad(array, [(0, 0), (0, width - array.shape[1])])


@dataclass
class UpdateResult:
    loss: float
    grad_norm: float
    stats: dict[str, float]
    skipped: int  # updates refused because the loss or gradient was not finite
    seconds: float
    token_stats: dict[str, np.ndarray] = field(default_factory=dict)  # entropy_logging: first pass, [N, T]
    sampling: dict[str, float] = field(default_factory=dict)  # sampling_mismatch of the first pass


def sampler_logprobs(logprobs: list[list[float]], width: int) -> np.ndarray:
    """The rollout's log-prob of each sampled token as [N, width], 0 past each completion's end."""
    out = np.zeros((len(logprobs), width), dtype=np.float32)
    for i, row in enumerate(logprobs):
        out[i, :min(len(row), width)] = row[:width]
    return out


def sampling_mismatch(first_logp: np.ndarray, sampler_logp: np.ndarray, mask: np.ndarray) -> dict[str, float]:
    """How far the update's log-probs of the sampled tokens (its first pass, before any optimiser step: the
    same weights that sampled them) are from the sampler's: |difference| mean and max in nats, and the
    importance ratio exp(update - sampler) min, mean and max, over the completion tokens. Zero in exact
    arithmetic; what is left is the two code paths' numerics (batched vs incremental attention, precision)."""
    keep = np.asarray(mask) > 0
    if not keep.any():
        return {}
    diff = (np.asarray(first_logp, dtype=np.float64) - np.asarray(sampler_logp, dtype=np.float64))[keep]
    ratio = np.exp(diff)
    return {SAMPLING_LOGP_DIFF_MEAN: float(np.abs(diff).mean()), SAMPLING_LOGP_DIFF_MAX: float(np.abs(diff).max()),
            "sampling/importance_ratio/min": float(ratio.min()), "sampling/importance_ratio/mean": float(ratio.mean()),
            "sampling/importance_ratio/max": float(ratio.max())}


def pass_statistic(name: str, so_far: float | None, value: float, passes: int, index: int) -> float | None:
    """A statistic over the update's passes: the extremes (`*_max`, `*_min`: the highest and lowest share of
    clipped tokens of any completion) over the passes that can clip, the others their mean. Pass 1 (`index`
    0) never clips, its ratio being exactly 1: a lowest share taken over it would always read 0."""
    if name.endswith("_max"):
        return value if so_far is None else max(so_far, value)
    if name.endswith("_min"):
        if index == 0 and passes > 1:
            return so_far
        return value if so_far is None else min(so_far, value)
    return (so_far or 0.0) + value / passes


def update_policy(model: nn.Module, optimizer: optim.Optimizer, loss_and_grad, batch: TrainBatch,
                  advantages: mx.array, ref_logp: mx.array | None, config: TrainConfig,
                  reduce: LocalReduce | None = None, sampler_logp: np.ndarray | None = None) -> UpdateResult:
    """num_iterations optimiser steps on one rollout; iteration 0's log-probs are the 'old' policy's.
    `sampler_logp` [N, T]: the rollout's log-probs of the same tokens, compared with iteration 0's.

    Each step sums the micro-batches' gradients (each already divided by the whole update's sizes),
    sums them over ranks (`reduce`), clips, and applies them unless the loss or gradient is not finite."""
    start = time.perf_counter()
    reduce = reduce or LocalReduce()
    totals = reduce.loss_totals(batch)
    stride = entropy_stride(config.max_generation_steps)
    model.train()
    old_logp = None
    totals_by_stat: dict[str, float] = {}
    skipped = 0
    loss_sum = norm_sum = 0.0
    token_stats: dict[str, np.ndarray] = {}
    sampling: dict[str, float] = {}
    for index in range(config.num_iterations):
        loss, grads, logp, entropy, per_token = _micro_batch_pass(model, loss_and_grad, batch, advantages, old_logp,
                                                                  ref_logp, totals, config.micro_batch_size, stride)
        loss, grads = reduce.sum_update(loss, grads)
        stats = grpo.policy_stats(logp, old_logp, ref_logp, advantages, batch.mask, loss_options(config), totals)
        stats["entropy"] = entropy
        grads, grad_norm = clip_by_global_norm(grads, config.max_grad_norm)
        mx.eval(loss, grad_norm, stats, logp)
        if old_logp is None:
            old_logp = logp
            token_stats = {k: np.concatenate([np.array(part[k]) for part in per_token]) for k in per_token[0]}
            if sampler_logp is not None:
                sampling = sampling_mismatch(np.array(logp), sampler_logp, np.array(batch.mask))
        loss_value, norm_value = loss.item(), grad_norm.item()
        # The step's loss and gradient norm are the mean over its passes, like every other statistic of
        # the update (the last pass alone made the loss differ from the sum of its parts).
        loss_sum += loss_value
        norm_sum += norm_value
        if not (math.isfinite(loss_value) and math.isfinite(norm_value)):
            skipped += 1  # a NaN or Inf must never reach the weights
        elif norm_value > 0.0:
            # A zero gradient (every group flat, no KL term) takes no step: Adam would still move the weights on
            # its momentum and average a zero into its second moment, so that the next gradient took an outsized
            # step (the tool recipe's entropy kept falling over flat steps, then its policy broke).
            optimizer.update(model, grads)
            mx.eval(model.parameters(), optimizer.state)
        for name, value in stats.items():
            kept = pass_statistic(name, totals_by_stat.get(name), value.item(), config.num_iterations, index)
            if kept is not None:
                totals_by_stat[name] = kept
    model.eval()
    passes = config.num_iterations
    return UpdateResult(loss_sum / passes, norm_sum / passes, totals_by_stat, skipped, time.perf_counter() - start,
                        token_stats, sampling)


def _micro_batch_pass(model: nn.Module, loss_and_grad, batch: TrainBatch, advantages: mx.array,
                      old_logp: mx.array | None, ref_logp: mx.array | None, totals: grpo.LossTotals,
                      micro_batch_size: int, stride: int) -> tuple:
    """One pass over the batch, a micro-batch at a time: (loss, gradients, log-probs [N, T], mean sampled
    entropy, per-token statistics of each micro-batch), summed over the micro-batches of this rank."""
    width = batch.mask.shape[1]
    loss, grads = mx.array(0.0), None
    logps, per_token = [], []
    entropy_sum = entropy_count = mx.array(0.0)
    for rows, micro in batch.micro_batches(micro_batch_size):
        (part_loss, (logp, entropy, part_tokens)), part_grads = loss_and_grad(
            model, micro, advantages[rows], None if old_logp is None else old_logp[rows, :micro.mask.shape[1]],
            None if ref_logp is None else ref_logp[rows, :micro.mask.shape[1]], totals)
        loss = loss + part_loss
        grads = part_grads if grads is None else tree_map(mx.add, grads, part_grads)
        # Evaluating here frees the micro-batch's activations before the next one is built.
        mx.eval(loss, grads, logp, entropy, part_tokens)
        logps.append(_pad_to(logp, width))
        sampled = micro.mask[:, ::stride]  # the positions the entropy was measured at
        entropy_sum = entropy_sum + mx.where(sampled > 0, entropy, 0.0).sum()
        entropy_count = entropy_count + sampled.sum()
        per_token.append({k: _pad_to(v, width) for k, v in part_tokens.items()})
    return loss, grads, mx.concatenate(logps), entropy_sum / mx.maximum(entropy_count, 1.0), per_token


def reference_logprobs(reference, batch: TrainBatch, config: TrainConfig) -> mx.array | None:
    """Log-probs of the completion tokens under the reference policy, [N, T], through the same
    micro-batches and chunks as the update; None without one (beta = 0).

    Where the rollout kept no frozen-block output (S-GRPO's exits: forced tags the rollout never fed) and
    the reference is the policy with its adapters off, this pass's is kept on
    `batch.prefix`: the blocks below the first adapter are the same in both, so every update pass then
    starts at the first adapted block (frozen_prefix.py)."""
    if reference is None:
        return None
    width = batch.mask.shape[1]
    parts, kept = [], []
    with reference.active() as ref_model:
        keep = batch.prefix is None and reference.uses_adapters_off and frozen_prefix.first_block(ref_model) > 0
        for _, micro in batch.micro_batches(config.micro_batch_size):
            with frozen_prefix.recording(ref_model) if keep else nullcontext([]) as recorded:
                logp = mx.stop_gradient(completion_logprobs(ref_model, micro, config.temperature,
                                                            config.logits_chunk_size, gradient=False))
                mx.eval(logp)
            parts.append(_pad_to(logp, width))
            if keep:
                kept.append(_recorded_states(recorded, micro, shares_prompts(ref_model, micro)))
    if keep:
        batch.prefix = Captured.concat(kept)
    return mx.concatenate(parts)


def _recorded_states(recorded: list[mx.array], batch: TrainBatch, shared: bool) -> Captured:
    """Per row, the frozen blocks' output recorded over one `completion_states` pass of `batch`: with shared
    prompts, the prompts' left-padded prefill ([prompts, longest, H]) then the completion tokens fed on its
    cache ([N, T - 1, H], absent when T is 1); else every row's whole sequence ([N, S - 1, H])."""
    lengths = batch.sequence_lengths.tolist()
    if not shared:
        prompt_lengths = (np.array(batch.positions[:, 0]) + 1).tolist()  # token 0 is predicted at len(prompt) - 1
        return Captured([recorded[0][row, :p] for row, p in enumerate(prompt_lengths)],
                        [recorded[0][row, p:n - 1] for row, (p, n) in enumerate(zip(prompt_lengths, lengths))])
    prefill, longest = recorded[0], recorded[0].shape[1]
    prompt_lengths = [len(batch.prompts[g]) for g in batch.prompt_of_row.tolist()]
    prompts = [prefill[g, longest - p:] for g, p in zip(batch.prompt_of_row.tolist(), prompt_lengths)]
    fed = recorded[1] if len(recorded) > 1 else mx.zeros((len(lengths), 0, prefill.shape[2]), prefill.dtype)
    return Captured(prompts, [fed[row, :n - 1 - p] for row, (p, n) in enumerate(zip(prompt_lengths, lengths))])
