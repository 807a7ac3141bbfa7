"""Small Hugging Face-format model directories with random weights, for tests.

They are not shipped: they stand in for "a model the project did not make" and go
through the same `mlx_lm.load` path as a user's model.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.utils import save_config, save_model

from mlx_grpo.rollout import Rollout
from mlx_grpo.tools.build_default_model import BOS, EOS, PAD, build_tokenizer, save_tokenizer

ARCHITECTURES = {
    "llama": {"architectures": ["LlamaForCausalLM"], "rope_theta": 10000.0, "tie_word_embeddings": False},
    "qwen2": {"architectures": ["Qwen2ForCausalLM"], "rope_theta": 1000000.0, "tie_word_embeddings": True},
    # Sliding-window attention (RotatingKVCache) on every other layer, with a window shorter than a rollout.
    "gemma3_text": {"architectures": ["Gemma3ForCausalLM"], "head_dim": 16, "query_pre_attn_scalar": 16,
                    "sliding_window": 6, "sliding_window_pattern": 2, "rope_theta": 1000000.0},
    # A hybrid: short-convolution state layers (ArraysCache) and attention layers (KVCache).
    "lfm2": {"architectures": ["Lfm2ForCausalLM"], "norm_eps": 1e-5, "conv_bias": False, "conv_L_cache": 3,
             "block_dim": 64, "block_multiple_of": 16, "block_ffn_dim_multiplier": 1.0,
             "block_auto_adjust_ff_dim": False, "block_ff_dim": 128, "full_attn_idxs": [1], "rope_theta": 1000000.0},
}


def make_model_dir(out: Path, model_type: str = "llama", seed: int = 0, **shape) -> Path:
    """`shape`: config.json fields to change (a vocabulary larger than the tokenizer's is fine: ids it never
    produces)."""
    tokenizer = build_tokenizer()
    config = {
        **ARCHITECTURES[model_type],
        "model_type": model_type,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": tokenizer.get_vocab_size(),
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 128,
        "bos_token_id": tokenizer.token_to_id(BOS),
        "eos_token_id": tokenizer.token_to_id(EOS),
        "pad_token_id": tokenizer.token_to_id(PAD),
        **shape,
    }
    module = importlib.import_module(f"mlx_lm.models.{model_type}")
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(config))
    mx.eval(model.parameters())
    out.mkdir(parents=True, exist_ok=True)
    save_model(out, model)
    save_config(dict(config), out / "config.json")
    save_tokenizer(tokenizer, out)
    return out


IN_MEMORY = {  # random_model's architectures: one of each head layout
    "llama": {"rope_theta": 10000.0, "tie_word_embeddings": False},  # its own LM head
    "qwen2": {"rope_theta": 1000000.0, "tie_word_embeddings": True},  # the head is the embedding
    # the tied embedding as its head, scaled on the way in; sliding windows (shorter than most test sequences)
    "gemma3_text": {"head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 6,
                    "sliding_window_pattern": 2, "rope_theta": 1000000.0},
    # its own head: the tied embedding's logits soft-capped (tanh), so they exist at every position at once
    "gemma2": {"head_dim": 16, "query_pre_attn_scalar": 16, "final_logit_softcapping": 2.0},
    # mixture of experts, its own LM head (a plain head since mlx-grpo reads it as one)
    "qwen3_moe": {"rope_theta": 1000000.0, "tie_word_embeddings": False, "head_dim": 16, "num_experts": 4,
                  "num_experts_per_tok": 2, "moe_intermediate_size": 32, "decoder_sparse_step": 1,
                  "mlp_only_layers": [], "norm_topk_prob": True},
}


def random_model(model_type: str, vocab: int = 300, hidden: int = 64, layers: int = 2, seed: int = 0, **shape):
    """A random-weight mlx-lm model built in memory (no tokenizer): for shapes and memory, not text. `shape`:
    config fields to change (e.g. a gemma3_text's sliding_window)."""
    module = importlib.import_module(f"mlx_lm.models.{model_type}")
    args = {**IN_MEMORY[model_type], "model_type": model_type, "hidden_size": hidden, "num_hidden_layers": layers,
            "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 2 * hidden,
            "vocab_size": vocab, "rms_norm_eps": 1e-6, "max_position_embeddings": 512, **shape}
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(args))
    mx.eval(model.parameters())
    return model


def grouped_rollout(rng: np.random.Generator, num_prompts: int, group_size: int, ids: tuple[int, int],
                    prompt_lengths: tuple[int, int], completion_lengths: tuple[int, int]) -> Rollout:
    """Random token ids in [ids), `group_size` completions per prompt as a GRPO step lays them out;
    lengths drawn from the half-open ranges given."""
    prompts, completions = [], []
    for _ in range(num_prompts):
        prompt = rng.integers(*ids, size=int(rng.integers(*prompt_lengths))).tolist()
        for _ in range(group_size):
            prompts.append(prompt)
            completions.append(rng.integers(*ids, size=int(rng.integers(*completion_lengths))).tolist())
    return Rollout(prompts, completions, [[0.0] * len(c) for c in completions], [False] * len(completions), 0.0)
