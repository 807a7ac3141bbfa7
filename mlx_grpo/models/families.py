"""What mlx-grpo knows of each model family, by mlx-lm's `model_type`, in one place and without mlx.

mlx-lm builds every family from its config.json; what mlx-grpo adds on top is here: whether the family's
head can run at chosen positions (a plain head), where its sliding windows are when the config does not
say, which of its caches are plain, and how llama.cpp names its tensors in a GGUF file. The memory plan
(planning/plan.py) reads these before any model loads, so this module imports nothing of mlx.

A new family is one entry in FAMILIES (and one in GGUF_ARCHITECTURES when its GGUF files should load), plus
a test file of its own (tests/models/test_model_families.py shows one). A `model_type` without an entry still loads
through mlx-lm: it runs its own head over every position, and the rollout checks its caches when it loads
(rollout.has_plain_kv_cache, models/policy.py:refuse_unbatchable).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Family:
    """One mlx-lm `model_type`, as mlx-grpo uses it."""

    # The output step is exactly "backbone (`model.model`), then the LM head or the tied embedding" (read in
    # mlx-lm 0.30.4 to 0.32): callers that need logits at a few positions only run the head there (a
    # [positions, V] matrix instead of [all positions, V]; at a 152k vocabulary that is most of a pass's
    # memory), and only these can run it `logits_chunk_size` positions at a time. gemma3_text scales its
    # embedding on the way in only; its head is the plain tied embedding (gemma-3-270m's 262k vocabulary made
    # the whole-sequence logits 70% of its update). Others (gemma2's logit soft-capping, granite's logit
    # scaling, ...) run their own head over every position; the memory plan counts them so
    # (plan.ModelShape.plain_head). tests/models/test_model_families.py checks each family's head against its forward.
    plain_head: bool = True
    # Every this-many-th layer attends globally and the others over a sliding window, when config.json names
    # no `sliding_window_pattern` (mlx-lm's default for the family); 1: no sliding layers by default.
    sliding_pattern: int = 1


FAMILIES = {
    "llama": Family(),
    "mistral": Family(),
    "mixtral": Family(),
    "qwen2": Family(),
    "qwen3": Family(),
    "qwen3_moe": Family(),
    "phi3": Family(),
    "olmo2": Family(),
    "gemma3_text": Family(sliding_pattern=6),
    # a state-space hybrid (convolution and attention layers): its own head, caches mlx-lm merges
    "lfm2": Family(plain_head=False),
}


def plain_head(model_type: str | None) -> bool:
    """Whether the family's head is a plain matrix mlx-grpo can run at chosen positions."""
    family = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    return family is not None and family.plain_head


def sliding(config: dict) -> bool:
    """Whether some layers attend over a sliding window (mlx-lm gives them a RotatingKVCache): named in
    `layer_types`, or every `sliding_window_pattern`-th layer global (the family's default when unsaid)."""
    pattern = config.get("sliding_window_pattern")
    if pattern is None:
        model_type = config.get("model_type")
        family = FAMILIES.get(model_type) if isinstance(model_type, str) else None
        pattern = family.sliding_pattern if family else 1
    return "sliding_attention" in (config.get("layer_types") or []) or (type(pattern) is int and pattern > 1)


def sliding_window(config: dict) -> int:
    """The window of a plain-head family's sliding layers (0: none, or not a whole number)."""
    window = config.get("sliding_window")
    plain = plain_head(config.get("model_type", "llama"))
    return window if plain and sliding(config) and type(window) is int and window > 0 else 0


def plain_cache(config: dict) -> bool:
    """Every block caches plain keys and values (a plain-head family without sliding windows)."""
    return plain_head(config.get("model_type", "llama")) and not sliding(config)


def tied_embeddings(config: dict) -> bool:
    """The head is the input embedding (no `lm_head` of its own) when config.json says so."""
    return bool(config.get("tie_word_embeddings", False))


# ----------------------------------------------------------------------------- GGUF files

# llama.cpp's block tensor names -> mlx-lm's, shared by the families
COMMON_BLOCK = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}
QK_NORMS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
TOP_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


@dataclass(frozen=True)
class GGUFLayout:
    """One llama.cpp architecture (`general.architecture`) read into an mlx-lm family."""

    model_type: str  # mlx-lm's
    block: dict[str, str]
    permuted_qk: bool = False  # llama.cpp interleaves the rotary halves of llama q/k rows
    norm_offset: float = 0.0  # gemma's norms are stored as 1 + weight; mlx-lm adds the 1 itself
    extra: dict[str, Any] = field(default_factory=dict)


LLAMA_LAYOUT = GGUFLayout("llama", COMMON_BLOCK, permuted_qk=True)
GGUF_ARCHITECTURES = {
    "llama": LLAMA_LAYOUT,
    "mistral": LLAMA_LAYOUT,
    "qwen2": GGUFLayout("qwen2", COMMON_BLOCK),
    "qwen3": GGUFLayout("qwen3", {**COMMON_BLOCK, **QK_NORMS}),
    "gemma3": GGUFLayout("gemma3_text", {**COMMON_BLOCK, **QK_NORMS, "ffn_norm": "pre_feedforward_layernorm",
                                         "post_attention_norm": "post_attention_layernorm",
                                         "post_ffw_norm": "post_feedforward_layernorm"},
                         norm_offset=1.0, extra={"sliding_window_pattern": FAMILIES["gemma3_text"].sliding_pattern,
                                                 "rope_local_base_freq": 10000.0}),
    "phi3": GGUFLayout("phi3", {**{k: v for k, v in COMMON_BLOCK.items() if k not in ("attn_q", "attn_k", "attn_v",
                                                                                      "ffn_gate", "ffn_up")},
                                "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}),
}


# ----------------------------------------------------------------------------- the head's sizes, every family

# The streamed head computes about this many logits at once: a block of the vocabulary for every position
# of the micro-batch (4 MB in float32), and reads at most 4x as many weights per block (a block of the head's
# rows is copied by a quantized head's dequantization, and was measured to be by the matmul too). Blocks of
# fewer than MIN_VOCAB_BLOCK rows make matmuls too thin. Measured at Qwen2.5-0.5B width (256 positions,
# 152k vocabulary): 1.49 s for the log-probs and their gradient against 1.89 s with the whole logits, at a
# 30 MB peak against 779 MB.
STREAM_LOGITS = 2**20
MIN_VOCAB_BLOCK = 1024


def vocab_block(positions: int, hidden: int) -> int:
    """Rows of the head per block of the streamed head (head_scores.py streams it, plan.py sizes it)."""
    return max(MIN_VOCAB_BLOCK, min(STREAM_LOGITS // max(1, positions), 4 * STREAM_LOGITS // hidden))


# policy/entropy (monitoring only) is measured at evenly spaced completion positions, at most this many per
# completion: a full-vocabulary entropy at every position cost as much as the log-probs themselves.
ENTROPY_POSITIONS = 32


def entropy_stride(max_completion_length: int) -> int:
    """Every how many completion positions policy/entropy is measured: 1 (every one) for completions
    of at most ENTROPY_POSITIONS tokens."""
    return max(1, -(-max_completion_length // ENTROPY_POSITIONS))
