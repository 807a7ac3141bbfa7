"""Predict the peak memory of each phase of a GRPO step before any weights load (budget.py finds settings
that fit).

The model's shape comes from its config.json alone. Each phase's peak is what stays resident
(weights, trainable state: LoRA or full weights' gradients and AdamW moments, a frozen reference copy)
plus what the phase builds on top:

- rollout: the KV cache of every completion at full length, the prompts' prefill (block activations;
  logits at the last position only) and one decode step's sampling arrays;
- reference: one micro-batch's forward pass (transient, one block at a time), then its LM-head logits;
- with frozen-prefix reuse (LoRA on the last blocks), the rollout's kept states of the frozen blocks' output
  in every phase from the rollout on, and the keys and values of the trained blocks only;
- update: one micro-batch's activations kept for the backward pass in every trained block (with LoRA,
  the adapted ones only; only the block inputs with `grad_checkpoint`), then the larger of the LM head's
  buffers (logits with their softmax and gradient, whole or one chunk at a time, and policy/entropy's
  sampled logits) and one block's backward (its attention scores, and its recomputed activations with
  `grad_checkpoint`).

A micro-batch's rows that share a prompt run it once and only their completions on its keys and values
(update.shares_prompts), so its positions are its prompts once plus every row's completion.

The constants are measured, not guessed: `benchmarks/memory_probe.py` measures each phase's peak
on random-weight models (MLX's peak counter is exact), and docs/SCALE.md compares this formula with
those measurements on the published shapes of Qwen2.5, Qwen3 and Llama-3.2 models; benchmarks/plan_check.py
compares it with the trainer's own step for a run config (SmolLM2's recipe, preset cuts).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..common.errors import UserError
from ..common.units import GB
from ..config.train_config import TrainConfig
from ..lookup_decoding import LOOKUP_ROWS, LOOKUP_TOKENS
from ..models.families import entropy_stride, plain_cache, plain_head, sliding_window, tied_embeddings, vocab_block

# ----------------------------------------------------------------------------- measured constants
# Fitted to benchmarks/memory_probe.py measurements (LoRA, CPU backend; docs/SCALE.md).
# Activation values kept per token and per transformer block for the backward pass, per unit of
# (hidden + MLP) width: norm inputs and outputs, q/k/v/o and gate/up/down inputs, LoRA inputs.
A_KEPT = 5.6
# With grad_checkpoint, what each block keeps per token, in hidden-size units (its input and the
# residual stream around it).
A_CHECKPOINTED = 2.8
# One block at a time holds [heads, S, S] score-sized buffers, this many of them in the backward pass and in
# a forward pass.
A_ATTENTION_BACKWARD = 7.7
A_ATTENTION_FORWARD = 3.8
# ... and each block that is not recomputed keeps its attention probabilities for the backward pass (MLX's
# attention on the CPU is composed of ops the gradient goes through): measured 1.07 score buffers per block
# for whole sequences, 1.26 with a shared 512-token prompt (hidden 128, 16 heads).
A_ATTENTION_KEPT = 1.3
# Kept values per position and block that do not grow with the width: small models keep more per unit of
# width than A_KEPT (hidden 128: 7.9 units; SmolLM2's 576: 5.2-7.5; Qwen2.5-1.5B's 1536: 3.9); fitted, the
# cause not traced.
A_KEPT_PER_POSITION = 2048
# A forward-only block (reference pass, prefill) holds about this many activation values per unit: the
# MLP's gate and up projections and their product exist at once.
A_FORWARD = 2.0
# The LM head: peak bytes per fp32 logit of the part of the batch whose logits exist at once: the logits,
# their shifted copy and exponentials (reused by the hand-written backward), the gradient. A chunked head
# pays more per logit, on far fewer logits. Measured with the head alone (hidden 256, 152k vocabulary):
# reference 3.03, update 3.06 when policy/entropy samples at most half the completion positions; at
# Qwen2.5-1.5B width 3.31-3.35 for the reference pass, SmolLM2 3.25-3.8 (blocks' leftovers included).
# Chunked, per logit of one chunk: reference 6.1 with 2 chunks, 9.0-9.05 with 4-8 (about three chunks'
# buffers at once); update 6.5-9.6 with policy/entropy's part (more rows, fewer per logit), and a single
# Qwen2.5-1.5B block in bf16 (4 rows, 128-position chunks) needed 10.2 + the half-precision buffer.
HEAD_UPDATE = 3.1
HEAD_UPDATE_CHUNKED = 10.2
HEAD_REFERENCE = 3.8
HEAD_REFERENCE_CHUNKED = 9.5
# policy/entropy's logits at its sampled positions (families.entropy_stride: every position of completions up
# to 32 tokens) add their own softmax: 4.3 per logit in all when it samples every position (measured 4.30-4.33).
HEAD_ENTROPY = 1.25
# A half-precision head first writes its logits in bf16, then casts them to float32: one more buffer.
HEAD_HALF_PRECISION = 1.0
# The streamed head (update.streamed_head_scores: a frozen head's log-probs a block of the vocabulary at a
# time, the default under LoRA and for every reference pass) holds about this many fp32 values per logit of
# one block (the logits, their shifted copy and exponentials, the next block's queued; measured 6.2 with the
# head alone at hidden 64 and 16k vocabulary), plus a few [positions, hidden] fp32 buffers (the hidden
# states, the targets' rows of the head, the softmax-weighted mean row and its block's part, the gradient).
HEAD_STREAMED = 6.5
HEAD_STREAMED_ROWS = 5.0
# ... and a copy of one block of the head's rows, [block, hidden] (fitted: the reference pass at Qwen2.5-0.5B
# width, 256 positions, measured 46.2 MB above what stays resident; the formula without it said 31.9)
HEAD_STREAMED_WEIGHT = 1.1
# When one block holds the whole vocabulary, the update's streamed head holds its logits about this many
# times (fitted: tests/planning/test_plan.py's measured step, 4,096-token vocabulary; 1.0 before the polynomial
# exponential, whose compiled intermediates stay alive: 10.9 MB measured against 8.1 planned with 1.0)
HEAD_STREAMED_ONE_BLOCK = 5.5
# ... and the reference pass's, whose one block of logits goes through the compiled polynomial exponential
# (head_scores.shifted_exp) with its intermediates alive (fitted: the same measured step, 6.67 MB since that
# exponential runs as two loops instead of six; 8.24 MB before, planned with 7.0; 5.5 keeps the plan above
# by 12%)
HEAD_STREAMED_REFERENCE_ONE_BLOCK = 5.5
# A decode step's sampling: bytes per fp32 logit of the step's [rows, vocabulary] logits (the logits, their
# shifted exponentials and cumulative sum, the comparisons that draw the id; the next step's logits are
# queued while this step's are used). Measured 5.5-5.6 with the prefill's share (SmolLM2's 49k vocabulary,
# a 152k one; 4.8-6.0 with the earlier Gumbel draw).
SAMPLING = 6.5


def activation_bytes(dtype: str, use_lora: bool) -> float:
    """Bytes per kept activation value. bf16 LoRA keeps ~0.8x float32's, not half: mlx-lm's adapters are
    float32, so every adapted layer's input is also kept as a float32 copy (measured, Qwen2.5-0.5B shape)."""
    if dtype == "float32":
        return 4.0
    return 3.2 if use_lora else 2.0


def _own_bits(quant: dict, path: str) -> int | None:
    """The bits a quantization config gives one module where it differs from the base's."""
    own = quant.get(path)
    return int(own["bits"]) if isinstance(own, dict) and isinstance(own.get("bits"), int) else None


@dataclass(frozen=True)
class ModelShape:
    """What memory depends on, read from a model's config.json."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied: bool
    bits: int | None = None  # quantized base weights
    group_size: int = 64
    embedding_bits: int | None = None  # the embedding's, where the quantization gives it its own (a GGUF's Q8_0)
    # Mixture of experts: every block's MLP is `experts` MLPs of `expert_intermediate` (all resident),
    # plus a router and an always-on shared MLP of `shared_intermediate`
    experts: int = 0
    expert_intermediate: int = 0
    shared_intermediate: int = 0
    # The LM head can run at chosen positions and in chunks (families.Family.plain_head); else the model's
    # own head makes logits at every position of the sequence at once and logits_chunk_size does nothing
    plain_head: bool = True
    # Every block caches plain keys and values (no sliding window): the G completions of a prompt then share
    # one pass over it in the reference pass and the update (update.shares_prompts); else whole sequences
    plain_cache: bool = True
    # A family of plain caches but for sliding windows of this many positions (0: none): its caches are
    # plain over sequences that fit in the window (rollout.has_plain_kv_cache), so those share prompts too
    window: int = 0

    @classmethod
    def from_config(cls, config: Any, source: str = "config.json") -> "ModelShape":
        if not isinstance(config, dict):
            raise UserError(f"{source}: expected a JSON object, got {type(config).__name__}")
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
        merged = {**text, **{k: v for k, v in config.items() if k != "text_config"}}
        if not isinstance(merged.get("quantization") or {}, dict):
            raise UserError(f"{source}: 'quantization' must be an object")
        for key in ("hidden_size", "num_attention_heads", "vocab_size", "num_hidden_layers", "intermediate_size",
                    "num_key_value_heads", "head_dim"):
            value = merged.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 1):
                raise UserError(f"{source}: '{key}' is {value!r}; expected a positive whole number")
        try:
            hidden = int(merged["hidden_size"])
            heads = int(merged["num_attention_heads"])
            quant = merged.get("quantization") or {}
            experts = int(merged.get("num_experts") or merged.get("num_local_experts")
                          or merged.get("n_routed_experts") or 0)
            expert_width = int(merged.get("moe_intermediate_size") or merged["intermediate_size"]) if experts else 0
            shared_width = int(merged.get("shared_expert_intermediate_size")
                               or int(merged.get("n_shared_experts") or 0) * expert_width)
            return cls(vocab=int(merged["vocab_size"]), hidden=hidden, layers=int(merged["num_hidden_layers"]),
                       heads=heads, kv_heads=int(merged.get("num_key_value_heads") or heads),
                       head_dim=int(merged.get("head_dim") or hidden // heads),
                       intermediate=int(merged["intermediate_size"]),
                       tied=tied_embeddings(merged),
                       bits=int(quant["bits"]) if quant.get("bits") else None,
                       group_size=int(quant.get("group_size", 64)), experts=experts,
                       embedding_bits=_own_bits(quant, "model.embed_tokens"),
                       expert_intermediate=expert_width, shared_intermediate=shared_width,
                       plain_head=plain_head(merged.get("model_type", "llama")), plain_cache=plain_cache(merged),
                       window=sliding_window(merged))
        except KeyError as err:
            raise UserError(f"{source}: no '{err.args[0]}': mlx-grpo plan reads the model's shape from it") from None

    def block_parameters(self) -> int:
        attention = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        if self.experts:  # every expert stays in memory, though each token runs only a few
            mlp = (3 * self.hidden * (self.experts * self.expert_intermediate + self.shared_intermediate)
                   + self.hidden * self.experts)
        else:
            mlp = 3 * self.hidden * self.intermediate
        return attention + mlp + 2 * self.hidden

    def parameters(self) -> int:
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return embeddings + self.layers * self.block_parameters() + self.hidden

    def bytes_per_weight(self, dtype_bytes: int, bits: int | None = None) -> float:
        """A matrix weight's bytes: `bits` (the base's) plus a scale and a bias (dtype) per group, or plain."""
        bits = bits or self.bits
        return bits / 8 + 2 * dtype_bytes / self.group_size if bits else dtype_bytes

    def weight_bytes(self, dtype_bytes: int) -> float:
        if self.bits is None:
            return self.parameters() * dtype_bytes
        embedding = self.vocab * self.hidden  # the input embedding; norms counted at the matrices' rate
        return ((self.parameters() - embedding) * self.bytes_per_weight(dtype_bytes)
                + embedding * self.bytes_per_weight(dtype_bytes, self.embedding_bits))

    def load_peak_bytes(self, dtype_bytes: int) -> float:
        """Memory while the model loads: its weights plus the largest tensor, the one being filled (a GGUF
        file is filled one tensor at a time, mlx-lm's safetensors are read lazily)."""
        rows = max(self.intermediate, self.experts * self.expert_intermediate)
        largest = max(self.vocab * self.hidden * self.bytes_per_weight(dtype_bytes, self.embedding_bits),
                      rows * self.hidden * self.bytes_per_weight(dtype_bytes))
        return self.weight_bytes(dtype_bytes) + largest

    def lora_parameters(self, rank: int, num_layers: int) -> int:
        """LoRA on every linear of `num_layers` blocks: rank x (inputs + outputs) each. In a mixture of experts
        mlx-lm gives every expert its own adapters (LoRASwitchLinear) and adapts the router too."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        linears = [(self.hidden, q), (self.hidden, kv), (self.hidden, kv), (q, self.hidden)]
        mlp = lambda width: [(self.hidden, width), (self.hidden, width), (width, self.hidden)]  # noqa: E731
        if self.experts:
            linears += self.experts * mlp(self.expert_intermediate) + [(self.hidden, self.experts)]
            linears += mlp(self.shared_intermediate) if self.shared_intermediate else []
        else:
            linears += mlp(self.intermediate)
        return num_layers * rank * sum(i + o for i, o in linears)


def dtype_bytes(dtype: str) -> int:
    return 4 if dtype == "float32" else 2


@dataclass(frozen=True)
class Shapes:
    """The batch: prompts x completions of at most these lengths."""

    prompts: int
    group_size: int
    prompt_length: int
    completion_length: int
    eval_rows: int = 0  # held-out completions decoded at once (0: as many as the step's, B x G)

    @property
    def sequences(self) -> int:
        return self.prompts * self.group_size

    @property
    def length(self) -> int:
        return self.prompt_length + self.completion_length


@dataclass(frozen=True)
class MemorySettings:
    """The keys that change memory, not results."""

    micro_batch_size: int = 0
    logits_chunk_size: int = 0
    grad_checkpoint: bool = False

    def describe(self, plain_head: bool = True, frozen_head: bool = True) -> str:
        """The settings as config keys, with what the LM head then does: `off` alone would read as "full
        logits" where a frozen plain head is streamed and they never exist."""
        if not plain_head:
            head = f"{self.logits_chunk_size or 'off'} (the model's own head: full logits)"
        elif self.logits_chunk_size:
            head = f"{self.logits_chunk_size}"
        else:
            head = "off (LM head streamed)" if frozen_head else "off (full logits in the update)"
        return (f"micro_batch_size: {self.micro_batch_size or 'all'}, logits_chunk_size: {head}, "
                f"grad_checkpoint: {str(self.grad_checkpoint).lower()}")


@dataclass(frozen=True)
class PhasePeaks:
    """Bytes: what stays resident, and each phase's peak (resident included)."""

    weights: float
    resident: float
    rollout: float
    reference: float
    update: float
    evaluation: float = 0.0  # the held-out evaluation's rollout (0 without one)
    load: float = 0.0  # while the model loads (ModelShape.load_peak_bytes): a run that cannot load does not fit

    @property
    def peak(self) -> float:
        return max(self.load, self.rollout, self.reference, self.update, self.evaluation)

    def as_gb(self) -> dict[str, float]:
        return {name: round(getattr(self, name) / GB, 2)
                for name in ("weights", "load", "resident", "rollout", "reference", "update", "evaluation", "peak")}


def micro_batches(shapes: Shapes, micro_batch_size: int) -> set[tuple[int, int]]:
    """(rows, distinct prompts) of each micro-batch: `micro_batch_size` consecutive rows, a prompt's G
    completions being one run of rows (a micro-batch can cut a group in two)."""
    n, g = shapes.sequences, shapes.group_size
    m = min(micro_batch_size or n, n)
    return {(min(m, n - start), (min(start + m, n) - 1) // g - start // g + 1) for start in range(0, n, m)}


def predict(shape: ModelShape, shapes: Shapes, config: TrainConfig, settings: MemorySettings,
            dtype: str) -> PhasePeaks:
    """Peak bytes of each phase of one step."""
    step = _StepSizes(shape, shapes, config, settings, dtype_bytes(dtype), activation_bytes(dtype, config.use_lora))
    rollout = step.rollout_of(shapes.prompts, step.captured)  # the held-out evaluation keeps no states
    # held-out evaluation decodes `eval_rows` rows at a time, one completion each: as many prompts prefilled
    eval_rows = shapes.eval_rows or step.n
    evaluation = step.rollout_of(eval_rows, rows=eval_rows) if config.eval_every > 0 else 0.0
    reference, update = (max(values) for values in zip(*(step.phases(rows, prompts) for rows, prompts
                                                         in micro_batches(shapes, settings.micro_batch_size))))
    resident = step.resident
    return PhasePeaks(step.weights, resident, rollout, resident + reference if config.beta > 0 else resident,
                      resident + update, evaluation, shape.load_peak_bytes(step.d))


def evaluation_rows(shape: ModelShape, shapes: Shapes, config: TrainConfig, settings: MemorySettings, dtype: str,
                    held_out: int) -> int:
    """How many held-out completions to decode at once: all `held_out` when that evaluation stays at or under
    the step's own peak (rollout, reference pass, update), else as few batches of even size as stay under it;
    never fewer than the step's B x G, whose rollout is the same work. One batch instead of several lets the
    longest reply of the whole set set the time once (the thinking recipe's 32 held-out sums: 85 s in one
    batch, 117 s in two of 16)."""
    step = predict(shape, shapes, config, settings, dtype)
    ceiling = max(step.rollout, step.reference, step.update)

    def fits(rows: int) -> bool:
        return predict(shape, replace(shapes, eval_rows=rows), config, settings, dtype).evaluation <= ceiling

    low, high = shapes.sequences, max(held_out, shapes.sequences)
    if fits(high):
        return high
    while high - low > 1:  # the evaluation's peak grows with its rows
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    # as few batches as that allows, of even sizes: 32 rows under a limit of 20 are two batches of 16, not 20
    # and 12 (the longest reply of each batch sets its time)
    return max(shapes.sequences, -(-held_out // -(-held_out // low)))


class _StepSizes:
    """The sizes one step's phases are made of, for `predict`: what stays resident, the KV cache, the kept
    states of frozen-prefix reuse, and how the LM head runs."""

    def __init__(self, shape: ModelShape, shapes: Shapes, config: TrainConfig, settings: MemorySettings,
                 d: int, act: float) -> None:
        self.shape, self.shapes, self.config, self.settings, self.d, self.act = shape, shapes, config, settings, d, act
        self.n, self.s, self.t, self.p = shapes.sequences, shapes.length, shapes.completion_length, shapes.prompt_length
        n, s, t, p = self.n, self.s, self.t, self.p
        self.weights = weights = shape.weight_bytes(d)
        if config.use_lora:
            lora_layers = shape.layers if config.lora_layers < 0 else min(config.lora_layers, shape.layers)
            trainable = shape.lora_parameters(config.lora_rank, lora_layers)
            # LoRA parameters are float32 whatever the base dtype: weights, AdamW's two moments
            self.resident = weights + trainable * 4 * 3
            self.gradients = trainable * 4 * 2  # the micro-batch's and the running sum
            # No gradient flows into the frozen blocks before the first adapted one: only the adapted blocks
            # keep activations for the backward pass (SmolLM2's recipe adapts 16 of 30)
            self.trained_layers = lora_layers
        else:
            trainable = shape.parameters()
            reference_copy = weights if config.beta > 0 else 0
            self.resident = weights + trainable * d * 2 + reference_copy
            self.gradients = trainable * d * 2
            self.trained_layers = shape.layers
        self.width = shape.hidden + shape.intermediate
        # Frozen-prefix reuse (frozen_prefix.py): the rollout keeps the frozen blocks' output at every position
        # it computed (each prompt once, every row's completion), held until the update ends; the reference pass
        # and the update start after the frozen blocks, which then get no keys and values of their own.
        self.prefix = config.use_lora and config.frozen_prefix_reuse and 0 < self.trained_layers < shape.layers
        self.captured = (shapes.prompts * p + n * t) * shape.hidden * d if self.prefix else 0.0
        self.cached_layers = self.trained_layers if self.prefix else shape.layers
        # rollout: KV cache of every sequence at full length (kv_cache_bits: a plain cache's values quantized,
        # with a scale and a bias in the model's dtype per group of 64)
        kv_value = config.kv_cache_bits / 8 + 2 * d / 64 if config.kv_cache_bits and shape.plain_cache else d
        self.kv_per_row = s * shape.layers * 2 * shape.kv_heads * shape.head_dim * kv_value
        # a decode step's logits: one position per row, or a lookup step's guessed positions (rollout.py)
        self.lookup = config.lookup_decoding and shape.plain_cache and not config.kv_cache_bits
        # reference and update, per micro-batch. The blocks run before the LM head in the forward pass and
        # after it in the backward pass, so their transient buffers and the head's never coincide: a phase's
        # peak is the larger of the two, on top of what the backward pass keeps.
        self.chunked = shape.plain_head and 0 < settings.logits_chunk_size < t
        # a frozen plain head is streamed when no chunk size is set: the reference pass always, the update under
        # LoRA
        self.streamed = shape.plain_head and settings.logits_chunk_size == 0
        # a model's own head runs over every position of the sequence, prompt included
        self.head_positions = settings.logits_chunk_size if self.chunked else t if shape.plain_head else s
        self.half = HEAD_HALF_PRECISION if d == 2 else 0.0
        # rows that share a prompt run it once and their completions on its keys and values
        # (update.shares_prompts: plain caches, blocks not recomputed); else every row runs its whole sequence
        self.shared = (shape.plain_cache or 0 < s <= shape.window) and not settings.grad_checkpoint

    def rollout_of(self, prompts: int, kept_states: float = 0.0, rows: int = 0) -> float:
        """The peak of decoding `rows` rows (0: the step's B x G): the KV cache, the prompts' prefill (one block at
        a time; logits at the last position only, or at every prompt position for a model's own head), then one
        decode step's logits and its sampling arrays."""
        shape, p, d = self.shape, self.p, self.d
        rows = rows or self.n
        logit_rows = max(rows, LOOKUP_ROWS * (LOOKUP_TOKENS + 1)) if self.lookup else rows
        prefill = (prompts * p * self.width * self.act * A_FORWARD
                   + A_ATTENTION_FORWARD * prompts * shape.heads * p * p * d
                   + (0 if shape.plain_head else prompts * p * shape.vocab * 4))
        return self.resident + rows * self.kv_per_row + prefill + SAMPLING * logit_rows * shape.vocab * 4 + kept_states

    def phases(self, rows: int, prompts: int) -> tuple[float, float]:
        """What one micro-batch's reference pass and update add to what is resident."""
        shape, s, t, p, d, act = self.shape, self.s, self.t, self.p, self.d, self.act
        if self.shared and prompts < rows:
            positions, scores = prompts * p + rows * t, prompts * p * p + rows * t * s
        else:
            positions, scores = rows * s, rows * s * s
        attention = shape.heads * scores * d  # one [heads, queries, keys] score buffer
        # the shared prompt's keys and values, copied to every row, exist for every block at once
        prompt_cache = self.cached_layers * rows * s * 2 * shape.kv_heads * shape.head_dim * d \
            if self.shared and prompts < rows else 0.0
        # the kept states, and this micro-batch's padded copy of its part (the prompts', then the completions')
        kept_states = self.captured + (positions * shape.hidden * d if self.prefix else 0.0)
        reference_head, head = self.heads(rows)
        reference = kept_states + max(reference_head, positions * self.width * act * A_FORWARD
                                      + A_ATTENTION_FORWARD * attention + prompt_cache)
        one_block = positions * (self.width * A_KEPT + A_KEPT_PER_POSITION) * act
        if self.settings.grad_checkpoint:  # block inputs are kept; each block is recomputed in its backward
            kept, recomputed = self.trained_layers * positions * shape.hidden * d * A_CHECKPOINTED, one_block
        else:
            kept, recomputed = self.trained_layers * (one_block + A_ATTENTION_KEPT * attention), 0.0
        update = self.gradients + kept + kept_states + max(head, A_ATTENTION_BACKWARD * attention + recomputed
                                                           + prompt_cache)
        return reference, update

    def heads(self, rows: int) -> tuple[float, float]:
        """The LM head's buffers for `rows` rows: in the reference pass, and in the update."""
        shape, t, half = self.shape, self.t, self.half
        logits = rows * self.head_positions * shape.vocab * 4
        entropy_logits = rows * -(-t // entropy_stride(t)) * shape.vocab * 4
        scored = rows * t  # completion positions whose log-probs the head gives
        block = min(shape.vocab, vocab_block(scored, shape.hidden))
        # one block for the whole vocabulary is the whole head's logits, once (no next block queued, no copy)
        blocks = block < shape.vocab

        def stream(one_block: float) -> float:
            return (scored * block * 4 * ((HEAD_STREAMED if blocks else one_block) + half)
                    + scored * shape.hidden * 4 * HEAD_STREAMED_ROWS
                    + blocks * block * shape.hidden * 4 * HEAD_STREAMED_WEIGHT)

        if self.streamed:
            reference_head = stream(HEAD_STREAMED_REFERENCE_ONE_BLOCK)
        else:
            reference_head = logits * ((HEAD_REFERENCE_CHUNKED if self.chunked else HEAD_REFERENCE) + half)
        if self.streamed and self.config.use_lora:  # policy/entropy comes with the streamed log-probs
            head = stream(HEAD_STREAMED_ONE_BLOCK)
        else:
            head = (logits * ((HEAD_UPDATE_CHUNKED if self.chunked else HEAD_UPDATE) + half)
                    + entropy_logits * HEAD_ENTROPY)
        return reference_head, head
