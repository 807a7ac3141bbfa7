"""The floating-point work of each phase of a GRPO step, counted from the model's shape, and how close a
measured time comes to what the machine allows.

Counted as model FLOPs (2 per multiply-add), the convention of "model FLOPs utilisation": the matmuls of
the transformer blocks, of attention (causal: each position attends to the positions before it), and of
the LM head, at the positions each phase really computes; not elementwise work (norms, the softmax's
exponentials), not block recompute under `grad_checkpoint`. The shapes are the trainer's own:

- rollout: one prefill per prompt (LM head at its last position), then one forward pass per new token for
  every row, each attending to the prompt and the tokens before it;
- reference: one pass per prompt, then every row's completion on its keys and values (update.shares_prompts;
  else every row's whole sequence), the LM head at the completion positions; with frozen-prefix reuse
  (frozen_prefix.py) this pass and the update's forward run only the blocks from the first adapted one on;
- update, per pass (`num_iterations` of them): that forward pass, policy/entropy's head at its sampled
  positions, and the backward pass: through the head to the hidden states (and into the head's weight when
  it trains), through every trained block (input gradients, and weight gradients of what trains: the whole
  block, or LoRA's adapters), never below the first adapted block (nothing there trains).

Decode reads every weight and each row's KV cache once per token, so it is also bound by memory bandwidth:
`Work.bytes` counts those reads, and `attainable` takes the lower of the two ceilings (the roofline).
This module imports no mlx.
"""

from __future__ import annotations

from dataclasses import dataclass

from .plan import ModelShape


@dataclass(frozen=True)
class Work:
    """Floating-point operations of a phase and the bytes it must read from memory (0: not counted)."""

    flops: float
    bytes: float = 0.0

    def __add__(self, other: "Work") -> "Work":
        return Work(self.flops + other.flops, self.bytes + other.bytes)

    def __mul__(self, times: float) -> "Work":
        return Work(self.flops * times, self.bytes * times)


@dataclass(frozen=True)
class Training:
    """What the update trains: LoRA of `rank` on the last `lora_layers` blocks (-1: all), or everything."""

    use_lora: bool
    lora_rank: int = 8
    lora_layers: int = -1
    # the reference pass and the update start at the first adapted block with the rollout's kept states
    # (frozen_prefix.py), so their forward runs the trained blocks only
    frozen_prefix: bool = False

    def trained_layers(self, shape: ModelShape) -> int:
        if not self.use_lora or self.lora_layers < 0:
            return shape.layers
        return min(self.lora_layers, shape.layers)

    def scored_layers(self, shape: ModelShape) -> int:
        """The blocks the reference pass and the update's forward run."""
        return self.trained_layers(shape) if self.frozen_prefix and self.use_lora else shape.layers


def block_linear_flops(shape: ModelShape) -> float:
    """One position through one block's linear layers (norms left out), forward."""
    return 2.0 * (shape.block_parameters() - 2 * shape.hidden)


def attention_flops(shape: ModelShape, context: float) -> float:
    """One query position of one block against `context` keys: scores and the weighted sum of values."""
    return 4.0 * shape.heads * shape.head_dim * context


def head_flops(shape: ModelShape) -> float:
    return 2.0 * shape.hidden * shape.vocab


def causal_context(start: int, count: int) -> float:
    """Keys seen by `count` consecutive positions after `start` earlier ones, summed: start+1, ..., start+count."""
    return count * start + count * (count + 1) / 2


def forward(shape: ModelShape, positions: float, context: float, head_positions: float,
            layers: int | None = None) -> float:
    """Forward FLOPs of `positions` through `layers` blocks (all by default) whose queries see `context` keys
    in all, plus the head at `head_positions`."""
    layers = shape.layers if layers is None else layers
    return (layers * (positions * block_linear_flops(shape) + attention_flops(shape, context))
            + head_positions * head_flops(shape))


def kv_bytes_per_token(shape: ModelShape, dtype_bytes: int) -> int:
    return shape.layers * 2 * shape.kv_heads * shape.head_dim * dtype_bytes


def rollout_prefill(shape: ModelShape, prompts: int, prompt_length: int) -> Work:
    return Work(prompts * forward(shape, prompt_length, causal_context(0, prompt_length), 1))


def rollout_decode(shape: ModelShape, rows: int, prompt_length: int, completion_length: int,
                   dtype_bytes: int) -> Work:
    """Every decode pass: completion_length - 1 of them (the prefill's logits give the first token). Each
    reads all the weights and every row's cache up to its length."""
    steps = max(0, completion_length - 1)
    context = causal_context(prompt_length, steps)  # per row, over every step
    flops = rows * forward(shape, steps, context, steps)
    weights = shape.weight_bytes(dtype_bytes)
    # the embedding's rows are gathered, not read whole, unless it is also the (tied) head
    if not shape.tied:
        weights -= shape.vocab * shape.hidden * dtype_bytes
    read = steps * weights + rows * context * kv_bytes_per_token(shape, dtype_bytes)
    return Work(flops, read)


def scoring_forward(shape: ModelShape, prompts: int, rows: int, prompt_length: int, completion_length: int,
                    shared: bool, layers: int | None = None) -> float:
    """The forward pass of the reference or the update over the batch (blocks and the completion positions'
    head): each prompt once and the rows' completions on its cache (`shared`), else every whole sequence."""
    p, t = prompt_length, completion_length
    if shared:
        blocks = (prompts * forward(shape, p, causal_context(0, p), 0, layers)
                  + rows * forward(shape, t - 1, causal_context(p, t - 1), 0, layers))
    else:
        length = p + t - 1
        blocks = rows * forward(shape, length, causal_context(0, length), 0, layers)
    return blocks + rows * t * head_flops(shape)


def reference(shape: ModelShape, prompts: int, rows: int, prompt_length: int, completion_length: int,
              shared: bool = True, layers: int | None = None) -> Work:
    return Work(scoring_forward(shape, prompts, rows, prompt_length, completion_length, shared, layers))


def lora_flops_per_position(shape: ModelShape, rank: int) -> float:
    """LoRA's two small matmuls on every linear of one block, forward: rank x (inputs + outputs) each."""
    return 2.0 * shape.lora_parameters(rank, 1)


def update(shape: ModelShape, training: Training, prompts: int, rows: int, prompt_length: int,
           completion_length: int, entropy_positions: int, passes: int, shared: bool = True) -> Work:
    """`passes` forward + backward passes over the batch."""
    p, t = prompt_length, completion_length
    trained = training.trained_layers(shape)
    if shared:
        positions = prompts * p + rows * (t - 1)
        context = prompts * causal_context(0, p) + rows * causal_context(p, t - 1)
    else:
        positions = rows * (p + t - 1)
        context = rows * causal_context(0, p + t - 1)
    fwd = (scoring_forward(shape, prompts, rows, p, t, shared, training.scored_layers(shape))
           + rows * entropy_positions * head_flops(shape))
    head_backward = rows * t * head_flops(shape) * (1 if training.use_lora else 2)  # input grads (+ weight's)
    linear = positions * block_linear_flops(shape)
    if training.use_lora:
        lora = positions * lora_flops_per_position(shape, training.lora_rank)
        # input gradients through the frozen weights; the adapters' forward, input and weight gradients
        blocks_backward = trained * (linear + 3 * lora + 2 * attention_flops(shape, context))
        fwd += trained * lora
    else:
        blocks_backward = trained * (2 * linear + 2 * attention_flops(shape, context))
    return Work((fwd + head_backward + blocks_backward) * passes)


@dataclass(frozen=True)
class Limits:
    """What the machine can do: measured matmul FLOP/s, and memory bandwidth (bytes/s; 0: unknown)."""

    flops_per_s: float
    bytes_per_s: float = 0.0

    def attainable(self, work: Work) -> float:
        """The roofline: FLOP/s at most the matmul peak, and at most what the bandwidth feeds at this
        work's arithmetic intensity (when its bytes and the bandwidth are known)."""
        if work.bytes <= 0 or self.bytes_per_s <= 0:
            return self.flops_per_s
        return min(self.flops_per_s, work.flops / work.bytes * self.bytes_per_s)

    def bound(self, work: Work) -> str:
        return "memory" if self.attainable(work) < self.flops_per_s else "compute"


def floor_seconds(phases: dict[str, Work], limits: Limits) -> dict[str, float]:
    """The least time each phase can take on this machine: its FLOPs at the roofline's attainable rate (its
    bytes at the bandwidth when memory binds), and their sum, the step-time floor."""
    floors = {name: work.flops / limits.attainable(work) for name, work in phases.items()
              if limits.attainable(work) > 0}
    return {**floors, "step": sum(floors.values())}


def share(work: Work, seconds: float, limits: Limits) -> dict:
    """A measured phase against the machine: achieved FLOP/s, its share of the matmul peak, and of the
    roofline's attainable FLOP/s (the same unless memory bandwidth binds first)."""
    achieved = work.flops / seconds if seconds > 0 else 0.0
    attainable = limits.attainable(work)
    return {"flops": work.flops, "bytes": work.bytes, "seconds": seconds, "achieved_flops_per_s": achieved,
            "share_of_peak": achieved / limits.flops_per_s if limits.flops_per_s > 0 else 0.0,
            "attainable_flops_per_s": attainable, "share_of_attainable": achieved / attainable if attainable else 0.0,
            "bound": limits.bound(work)}


def step_work(shape: ModelShape, training: Training, prompts: int, rows: int, prompt_length: int,
              completion_length: int, entropy_positions: int, passes: int, with_reference: bool,
              shared: bool = True, dtype_bytes: int = 4) -> dict[str, Work]:
    """Each phase of one step at these (padded) lengths: what the trainer computes, `perf/mfu`'s numerator.
    `entropy_positions`: policy/entropy's sampled positions per completion (update.entropy_stride)."""
    t = completion_length
    phases = {
        "rollout": rollout_prefill(shape, prompts, prompt_length)
        + rollout_decode(shape, rows, prompt_length, t, dtype_bytes),
        "update": update(shape, training, prompts, rows, prompt_length, t, entropy_positions, passes, shared),
    }
    if with_reference:
        phases["reference"] = reference(shape, prompts, rows, prompt_length, t, shared, training.scored_layers(shape))
    return phases
