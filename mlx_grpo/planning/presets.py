"""The shapes of the models people fine-tune on Macs, as published, to build random-weight stand-ins.

Each entry holds the memory- and compute-relevant fields of the model's published config.json
(source URL beside it). `preset_model` builds the model through mlx-lm's own class for that
`model_type` with random weights, optionally cut to its first `layers` blocks and 4-bit quantized, so
its memory and speed can be measured on any machine without a download. `mlx-grpo plan` and
benchmarks/memory_probe.py read the same shapes. `write_preset_model` saves one as a model directory
(the shipped model's tokenizer, whose few ids all lie inside every preset's vocabulary), so that
`mlx-grpo bench --preset`, `mlx-grpo train` and other trainers can load the very same weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..common.errors import UserError

_QWEN2 = {"model_type": "qwen2", "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 32768,
          "hidden_act": "silu"}
_QWEN3 = {"model_type": "qwen3", "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 40960,
          "head_dim": 128, "attention_bias": False, "vocab_size": 151936, "tie_word_embeddings": True}
_LLAMA32 = {"model_type": "llama", "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 131072,
            "vocab_size": 128256, "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False,
            "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                             "original_max_position_embeddings": 8192, "rope_type": "llama3"}}

PRESETS: dict[str, dict[str, Any]] = {
    # https://huggingface.co/Qwen/Qwen2.5-0.5B-Instruct/blob/main/config.json
    "qwen2.5-0.5b": {**_QWEN2, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                     "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
                     "tie_word_embeddings": True},
    # https://huggingface.co/Qwen/Qwen2.5-1.5B-Instruct/blob/main/config.json
    "qwen2.5-1.5b": {**_QWEN2, "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                     "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936,
                     "tie_word_embeddings": True},
    # https://huggingface.co/Qwen/Qwen2.5-3B-Instruct/blob/main/config.json
    "qwen2.5-3b": {**_QWEN2, "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
                   "num_attention_heads": 16, "num_key_value_heads": 2, "vocab_size": 151936,
                   "tie_word_embeddings": True},
    # https://huggingface.co/Qwen/Qwen2.5-7B-Instruct/blob/main/config.json
    "qwen2.5-7b": {**_QWEN2, "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                   "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
                   "tie_word_embeddings": False},
    # https://huggingface.co/Qwen/Qwen3-0.6B/blob/main/config.json
    "qwen3-0.6b": {**_QWEN3, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "num_key_value_heads": 8},
    # https://huggingface.co/Qwen/Qwen3-1.7B/blob/main/config.json
    "qwen3-1.7b": {**_QWEN3, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "num_key_value_heads": 8},
    # https://huggingface.co/Qwen/Qwen3-4B/blob/main/config.json
    "qwen3-4b": {**_QWEN3, "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "num_key_value_heads": 8},
    # https://huggingface.co/meta-llama/Llama-3.2-1B-Instruct/blob/main/config.json
    "llama-3.2-1b": {**_LLAMA32, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64},
    # https://huggingface.co/meta-llama/Llama-3.2-3B-Instruct/blob/main/config.json
    "llama-3.2-3b": {**_LLAMA32, "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28,
                     "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128},
}


def preset_config(name: str, layers: int | None = None) -> dict[str, Any]:
    """The preset's config.json fields, cut to its first `layers` blocks when given."""
    if name not in PRESETS:
        raise UserError(f"preset '{name}': unknown; one of {', '.join(PRESETS)}")
    config = dict(PRESETS[name])
    if layers is not None:
        if not 1 <= layers <= config["num_hidden_layers"]:
            raise UserError(f"preset '{name}': --layers {layers}: expected 1..{config['num_hidden_layers']}")
        config["num_hidden_layers"] = layers
    return config


def preset_model(name: str, layers: int | None = None, bits: int | None = None, dtype: str = "float32"):
    """A random-weight model of the preset's shape, through mlx-lm's own class for its model_type."""
    import importlib

    import mlx.core as mx
    import mlx.nn as nn

    config = preset_config(name, layers)
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    model = module.Model(module.ModelArgs.from_dict(config))
    model.set_dtype(getattr(mx, dtype))
    if bits is not None:
        nn.quantize(model, group_size=64, bits=bits)
    mx.eval(model.parameters())
    return model


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def write_preset_model(name: str, layers: int | None, out: Path, seed: int = 0) -> Path:
    """`out`: a model directory holding the preset's random-weight model (float32, seeded) and the shipped
    model's tokenizer. An existing directory written for the same preset and depth is reused."""
    import json
    import shutil

    import mlx.core as mx
    from mlx.utils import tree_flatten

    from ..models.policy import DEFAULT_MODEL_DIR

    shipped = json.loads((DEFAULT_MODEL_DIR / "config.json").read_text())
    config = {**preset_config(name, layers), "preset": name, "seed": seed,
              **{key: shipped[key] for key in ("bos_token_id", "eos_token_id", "pad_token_id")}}
    config_file = out / "config.json"
    if config_file.is_file() and (out / "model.safetensors").is_file():
        try:
            if json.loads(config_file.read_text()) == config:
                return out
        except ValueError:
            pass  # a half-written directory: write it again
    out.mkdir(parents=True, exist_ok=True)
    config_file.unlink(missing_ok=True)
    mx.random.seed(seed)
    model = preset_model(name, layers)
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())))
    for file in TOKENIZER_FILES:
        shutil.copyfile(DEFAULT_MODEL_DIR / file, out / file)
    config_file.write_text(json.dumps(config, indent=2) + "\n")  # last: its presence marks a whole directory
    return out


def cached_preset_model(name: str, layers: int | None) -> Path:
    """The model directory of preset `name` cut to `layers` blocks, written once under ~/.cache/mlx-grpo/presets
    (`mlx-grpo bench --preset`, benchmarks/plan_check.py --preset)."""
    import os

    preset_config(name, layers)  # an unknown name or depth: one line, before any work
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mlx-grpo" / "presets"
    return write_preset_model(name, layers, cache / f"{name}-L{layers or 'all'}")
