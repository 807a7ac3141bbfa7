"""Frozen-prefix reuse: the reference pass and the update start at the first adapted block.

With LoRA on the last k blocks, the blocks below the first adapted one never change, and the reference
pass and every update pass feed them exactly the tokens the rollout fed them. Their output, the hidden
state entering the first adapted block ([positions, hidden] per row), is therefore kept from the rollout
(`recording`), and the later passes hand it to the model in place of the frozen blocks' work
(`injecting`): every frozen block returns it unchanged, so the model's own forward (its masks, sliding
windows, embedding scale, cache handling) runs untouched from the first adapted block on. Family-general:
it needs only that `model.layers` are the blocks, called in order on the residual stream; `install`
checks that on a few tokens and leaves the model as it was (with a one-line reason) where it does not hold.

The blocks keep their weights and names: only their class changes, to a subclass whose call can return
the kept state (the way update.checkpoint_blocks makes blocks recompute).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Sequence

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

# The probe's full forward and the forward started at the first adapted block must agree this closely
# (max |difference| of the logits over their max |value|): the same arithmetic, so they agree to rounding.
PROBE_TOLERANCE = 1e-3
PROBE_TOKENS = 7


class PrefixTap:
    """Shared by a model's frozen blocks: what they record, or the state they hand on instead of computing."""

    def __init__(self, first_trained: int):
        self.first_trained = first_trained
        self.recorded: list[mx.array] | None = None  # outputs of the last frozen block, while recording
        self.injected: mx.array | None = None  # the state entering the first adapted block, while injecting


def _tapped_class(block_class: type) -> type:
    def __call__(self, x, *args, **kwargs):
        tap = self.prefix_tap
        if tap.injected is not None:
            return tap.injected
        out = block_class.__call__(self, x, *args, **kwargs)
        if tap.recorded is not None and self.records_prefix:
            tap.recorded.append(out)
        return out

    return type(block_class.__name__, (block_class,), {"__call__": __call__, "prefix_tapped": True})


def first_trained_block(model: nn.Module) -> int | None:
    """The index of the first block with trainable weights, when everything trained sits in that block or
    after it (blocks, final norm, LM head); None when something before it trains (an embedding) or the
    model has no blocks."""
    blocks = getattr(model, "layers", None)
    if not blocks:
        return None
    per_block = [len(tree_flatten(block.trainable_parameters())) for block in blocks]
    first = next((i for i, n in enumerate(per_block) if n), None)
    if first is None:
        return None
    outside = len(tree_flatten(model.trainable_parameters())) - sum(per_block)
    after = sum(len(tree_flatten(m.trainable_parameters())) for name, m in
                (("lm_head", model.get("lm_head")), ("norm", getattr(getattr(model, "model", None), "norm", None)))
                if isinstance(m, nn.Module))
    return first if outside == after else None


def tap_of(model: nn.Module) -> PrefixTap | None:
    blocks = getattr(model, "layers", None) or []
    return getattr(blocks[0], "prefix_tap", None) if blocks else None


def _set_classes(model: nn.Module, tap: PrefixTap | None) -> None:
    for i, block in enumerate(model.layers[:tap.first_trained] if tap else model.layers):
        if tap is not None:
            block.__class__ = _tapped_class(type(block))
            block.prefix_tap = tap
            block.records_prefix = i == tap.first_trained - 1
        elif getattr(block, "prefix_tapped", False):
            block.__class__ = type(block).__mro__[1]
            del block.prefix_tap, block.records_prefix


def install(model: nn.Module) -> str | None:
    """Make the model's frozen blocks able to record and hand on their output. Returns None when done,
    else why the reference pass and the update run the whole forward (one line for the run's start)."""
    first = first_trained_block(model)
    if first is None or first == 0:
        return None if first == 0 else "frozen-prefix reuse off: no frozen blocks before the trained ones"
    if tap_of(model) is not None:
        return None
    tap = PrefixTap(first)
    _set_classes(model, tap)
    problem = _probe(model, tap)
    if problem:
        _set_classes(model, None)
        return (f"frozen-prefix reuse off: {getattr(model, 'model_type', type(model).__name__)}'s forward could "
                f"not start at block {first} ({problem}); the reference pass and the update run every block")
    return None


def _probe(model: nn.Module, tap: PrefixTap) -> str | None:
    """Whether the forward started at the first adapted block with the recorded state gives the full
    forward's logits, on a few tokens."""
    was_training = model.training
    model.eval()
    try:
        vocab = getattr(getattr(model, "args", None), "vocab_size", None) or 16
        tokens = mx.array([[(7 * i + 3) % min(vocab, 100) for i in range(PROBE_TOKENS)]])
        with recording(model) as recorded:
            full = model(tokens)
        if len(recorded) != 1 or recorded[0].shape[:2] != tokens.shape:
            return "the block before the first adapted one did not run once over every position"
        with injecting(model, recorded[0]):
            started = model(tokens)
        mx.eval(full, started)
        scale = max(float(mx.abs(full).max().item()), 1e-6)
        error = float(mx.abs(full.astype(mx.float32) - started.astype(mx.float32)).max().item()) / scale
        tolerance = PROBE_TOLERANCE if full.dtype == mx.float32 else 3e-2
        return None if error <= tolerance else f"logits differ by {error:.2g} of their largest"
    except Exception as err:  # noqa: BLE001 - any failure means the structure is not what this assumes
        return f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}"
    finally:
        model.train(was_training)


@contextmanager
def recording(model: nn.Module) -> Iterator[list[mx.array]]:
    """Collect every output of the last frozen block while inside (a list, one entry per forward call)."""
    tap = tap_of(model)
    recorded: list[mx.array] = []
    if tap is None:
        yield recorded
        return
    tap.recorded = recorded
    try:
        yield recorded
    finally:
        tap.recorded = None


@contextmanager
def injecting(model: nn.Module, hidden: mx.array | None) -> Iterator[None]:
    """Inside, the frozen blocks hand on `hidden` ([rows, positions, hidden], the inputs' shape) instead of
    computing (None: the whole forward, as usual)."""
    tap = tap_of(model)
    if hidden is None or tap is None:
        yield
        return
    tap.injected = mx.stop_gradient(hidden)
    try:
        yield
    finally:
        tap.injected = None


def first_block(model: nn.Module) -> int:
    """Where a forward with a kept state starts (0: no frozen prefix)."""
    tap = tap_of(model)
    return tap.first_trained if tap is not None else 0


@dataclass
class Captured:
    """Per rollout row: the state entering the first adapted block at its prompt's positions ([P, H]; a
    group's rows share one array) and at each completion token fed back during decoding ([steps, H]: the
    token sampled at step t is fed at step t + 1, so every completion token but the last has one)."""

    prompt: list[mx.array]
    completion: list[mx.array]

    def take(self, rows: Sequence[int]) -> "Captured":
        return Captured([self.prompt[i] for i in rows], [self.completion[i] for i in rows])

    @staticmethod
    def concat(parts: Sequence["Captured | None"]) -> "Captured | None":
        if any(p is None for p in parts):
            return None
        return Captured([x for p in parts for x in p.prompt], [x for p in parts for x in p.completion])

    def nbytes(self) -> int:
        shared = {id(a): a.nbytes for a in self.prompt}
        return sum(shared.values()) + sum(a.nbytes for a in self.completion)


def capture_from_prefill(recorded: list[mx.array], prompts: list[list[int]],
                         batches: list[list[int]]) -> list[mx.array]:
    """Each prompt's states, [P, H], from the prefill's recorded outputs: recorded[j] holds the prompts
    batches[j] names, left-padded to its longest (one batch of all the prompts, or one per prompt length)."""
    states: list[mx.array] = [mx.array(0)] * len(prompts)
    for out, indices in zip(recorded, batches, strict=True):
        longest = out.shape[1]
        for row, index in enumerate(indices):
            states[index] = out[row, longest - len(prompts[index]):]
    return states


def left_padded(states: Sequence[mx.array]) -> mx.array:
    """[B, longest, H]: each prompt's states after zeros (the left padding is masked out of attention)."""
    longest = max(s.shape[0] for s in states)
    return mx.stack([mx.pad(s, [(longest - s.shape[0], 0), (0, 0)]) for s in states])


def right_padded(states: Sequence[mx.array], width: int) -> mx.array:
    """[N, width, H]: each row's states cut or padded with zeros on the right to `width` positions."""
    return mx.stack([mx.pad(s[:width], [(0, width - min(width, s.shape[0])), (0, 0)]) for s in states])
