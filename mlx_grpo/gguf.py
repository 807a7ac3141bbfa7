"""GGUF files (llama.cpp, Ollama, LM Studio) as a model source: a llama-family .gguf as an mlx-lm model and
its tokenizer.

MLX reads GGUF's Q4_0, Q4_1 and Q8_0 tensors as its own affine quantization (packed weights, scales and
biases; groups of 32), F16/F32/BF16 ones as plain arrays. Quantized matrices stay quantized, each at its own
bits (a file often keeps the token embedding at 8 bits and the rest at 4). llama.cpp's converter
interleaves the two rotary halves of every q/k head's rows; they are put back, so mlx-lm's usual RoPE
applies. The tokenizer is rebuilt with the `tokenizers` library from `tokenizer.ggml.*` (byte-level BPE:
vocabulary, merges, special tokens, bos/eos) with the file's chat template.

`gguf_config` is the Hugging Face config.json of the file (what `mlx-grpo plan` and `export` read);
`load_gguf` returns (model, tokenizer, config).
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from .common.errors import UserError

GROUP_SIZE = 32  # every GGUF block type MLX reads holds 32 weights per scale

# GGUF tensor names -> mlx-lm's llama names
BLOCK_TENSORS = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}
TOP_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}

# tokenizer.ggml.pre -> how text is split before BPE (llama.cpp's names; the regexes are the models' own)
GPT2_PRE = ("default", "gpt-2", "gpt2")
DIGITS_PRE = ("smollm", "starcoder", "refact")  # every digit alone, then GPT-2's split
LLAMA3_PRE = ("llama-bpe", "llama3")
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CONTROL, USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values of special tokens


def find_gguf(path: Path) -> Path | None:
    """The GGUF file `path` names: the file itself, or the one .gguf in a directory without a config.json.
    None: not a GGUF source."""
    if path.is_file():
        return path if path.suffix.lower() == ".gguf" else None
    if not path.is_dir() or (path / "config.json").is_file():
        return None
    files = sorted(path.glob("*.gguf"))
    if len(files) > 1:
        raise UserError(f"model '{path}': holds {len(files)} .gguf files ({', '.join(f.name for f in files)}); "
                        "give the path of the one to load")
    return files[0] if files else None


def read_gguf(path: Path) -> tuple[dict[str, mx.array], dict[str, Any]]:
    """The file's tensors and metadata (mx.array scalars made Python values). Kept for the next call (the
    plan reads the shape and tokenizer, then the run loads the model) until `load_gguf` has built the model."""
    stat = path.stat()
    return _read(path, stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=1)
def _read(path: Path, mtime_ns: int, size: int) -> tuple[dict[str, mx.array], dict[str, Any]]:
    try:
        weights, metadata = mx.load(str(path), return_metadata=True)
    except (RuntimeError, ValueError, OSError) as err:
        detail = (str(err).splitlines() or [""])[0]
        raise UserError(f"{path}: cannot be read as GGUF ({detail}); MLX reads the F32, F16, BF16, Q4_0, Q4_1 and "
                        "Q8_0 tensor types, not K-quants such as Q4_K_M (convert to one of those with llama.cpp's "
                        "llama-quantize, or use an MLX model directory)") from None
    if any(name.endswith(".scales") for name in weights) and _mlx_version() < QUANTIZED_GGUF_MLX:
        raise UserError(f"{path}: its quantized tensors need MLX >= {'.'.join(map(str, QUANTIZED_GGUF_MLX))} "
                        f"(this is {'.'.join(map(str, _mlx_version()))}): MLX 0.30.4 read SmolLM2's Q4_1 blocks into "
                        "other weights than llama.cpp's, which only shows as wrong answers; pip install -U mlx")
    return weights, {k: _plain(v) for k, v in metadata.items()}


# The oldest MLX whose Q4_0/Q4_1/Q8_0 GGUF reading was checked against an independent conversion
# (tests/test_gguf.py); 0.30.4, the package's floor, gives different q-projection weights.
QUANTIZED_GGUF_MLX = (0, 32, 4)


def _mlx_version() -> tuple[int, ...]:
    from importlib.metadata import version

    return tuple(int(part) for part in version("mlx").split(".")[:3] if part.isdigit())


def _plain(value: Any) -> Any:
    if isinstance(value, mx.array):
        return value.item() if value.ndim == 0 else value.tolist()
    return value


def gguf_config(path: Path, metadata: dict[str, Any], weights: dict[str, mx.array]) -> dict[str, Any]:
    """The Hugging Face config.json (mlx-lm's llama) describing the file's model."""
    arch = metadata.get("general.architecture")
    if arch is None:
        raise UserError(f"{path}: no 'general.architecture' in its metadata: not a model's GGUF file")
    if arch != "llama":
        raise UserError(f"{path}: architecture '{arch}': only llama-family GGUF files load (Llama, Mistral, "
                        "SmolLM, TinyLlama...); for other models use an MLX model directory")
    unknown = sorted({name for name in weights if _mlx_name(name) is None})
    if unknown:
        raise UserError(f"{path}: tensors this loader does not know ({', '.join(unknown[:3])}); only plain "
                        "llama blocks load (no rope_freqs: Llama 3.1+ rope scaling)")

    def key(name: str) -> Any:
        try:
            return metadata[f"llama.{name}"]
        except KeyError:
            raise UserError(f"{path}: no 'llama.{name}' in its metadata") from None

    heads = key("attention.head_count")
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": key("embedding_length"),
        "num_hidden_layers": key("block_count"),
        "intermediate_size": key("feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": metadata.get("llama.attention.head_count_kv", heads),
        "head_dim": metadata.get("llama.attention.key_length", key("embedding_length") // heads),
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon"),
        "rope_theta": metadata.get("llama.rope.freq_base", 10000.0),
        "max_position_embeddings": metadata.get("llama.context_length", 4096),
        "vocab_size": metadata.get("llama.vocab_size", len(metadata.get("tokenizer.ggml.tokens", []))),
        "tie_word_embeddings": "output.weight" not in weights,
        "bos_token_id": metadata.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": metadata.get("tokenizer.ggml.eos_token_id"),
    }
    scaling = metadata.get("llama.rope.scaling.type", "none")
    if scaling == "linear":
        config["rope_scaling"] = {"type": "linear", "factor": metadata["llama.rope.scaling.factor"]}
    elif scaling != "none":
        raise UserError(f"{path}: rope scaling '{scaling}' is not supported by this loader")
    bits = {_mlx_name(name).removesuffix(".scales"): _bits(weights, name.removesuffix(".scales"))
            for name in weights if name.endswith(".scales")}
    if bits:
        common = Counter(bits.values()).most_common(1)[0][0]
        config["quantization"] = {"group_size": GROUP_SIZE, "bits": common, "mode": "affine",
                                  **{p: {"group_size": GROUP_SIZE, "bits": b, "mode": "affine"}
                                     for p, b in sorted(bits.items()) if b != common}}
    return config


def _bits(weights: dict[str, mx.array], name: str) -> int:
    packed, scales = weights[f"{name}.weight"], weights[f"{name}.scales"]
    return packed.shape[-1] * 32 // (scales.shape[-1] * GROUP_SIZE)


def _mlx_name(name: str) -> str | None:
    parts = name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in BLOCK_TENSORS:
        return f"model.layers.{parts[1]}.{BLOCK_TENSORS[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in TOP_TENSORS:
        return f"{TOP_TENSORS[parts[0]]}.{parts[1]}"
    return None


def unpermute_rows(rows: mx.array, heads: int) -> mx.array:
    """Undo llama.cpp's rotary permutation of a q/k projection (weight, scales or biases: rows first).
    Within each head llama.cpp stores row pairs interleaved (0, d/2, 1, d/2+1, ...); mlx-lm's RoPE, like
    Hugging Face's, wants the halves one after the other."""
    shape = rows.shape
    return rows.reshape(heads, shape[0] // heads // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def mlx_weights(weights: dict[str, mx.array], config: dict[str, Any]) -> dict[str, mx.array]:
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    out = {}
    for name, value in weights.items():
        kind = name.split(".")[2] if name.startswith("blk.") else None
        out[_mlx_name(name)] = unpermute_rows(value, heads[kind]) if kind in heads else value
    return out


def build_model(config: dict[str, Any], weights: dict[str, mx.array]) -> nn.Module:
    """mlx-lm's llama with the file's weights; quantized matrices at their own bits."""
    from mlx_lm.models import llama

    model = llama.Model(llama.ModelArgs.from_dict(config))
    quantization = config.get("quantization")
    if quantization:
        def per_tensor(path: str, module: nn.Module) -> dict | bool:
            if f"{path}.scales" not in weights:
                return False
            return quantization.get(path, {k: quantization[k] for k in ("group_size", "bits", "mode")})

        nn.quantize(model, group_size=GROUP_SIZE, bits=quantization["bits"], class_predicate=per_tensor)
    model.load_weights(list(weights.items()), strict=True)
    model.eval()
    mx.eval(model.parameters())
    return model


def build_tokenizer(path: Path, metadata: dict[str, Any]) -> Any:
    """The file's tokenizer as a Hugging Face fast tokenizer in mlx-lm's TokenizerWrapper."""
    from mlx_lm.tokenizer_utils import TokenizerWrapper
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    kind = metadata.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise UserError(f"{path}: tokenizer '{kind}': only byte-level BPE vocabularies ('gpt2') load; SentencePiece "
                        "ones ('llama') do not yet")
    pre = metadata.get("tokenizer.ggml.pre", "default")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in GPT2_PRE:
        split = byte_level
    elif pre in DIGITS_PRE:
        split = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre in LLAMA3_PRE:
        split = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
                                         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        raise UserError(f"{path}: pre-tokenizer '{pre}' is not one this loader knows "
                        f"({', '.join(GPT2_PRE + DIGITS_PRE + LLAMA3_PRE)})")
    tokens = metadata["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in metadata.get("tokenizer.ggml.merges", [])]
    tokenizer = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges,
                                     ignore_merges=pre in LLAMA3_PRE))
    tokenizer.pre_tokenizer = split
    tokenizer.decoder = decoders.ByteLevel()
    types = metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    special = [AddedToken(t, special=kind_ == CONTROL, normalized=False)
               for t, kind_ in zip(tokens, types) if kind_ in (CONTROL, USER_DEFINED)]
    tokenizer.add_tokens(special)

    def token_id(key: str) -> int | None:
        index = metadata.get(f"tokenizer.ggml.{key}_token_id")
        return index if index is not None and 0 <= index < len(tokens) else None

    def token(key: str) -> str | None:
        return None if token_id(key) is None else tokens[token_id(key)]

    bos = token("bos")
    if metadata.get("tokenizer.ggml.add_bos_token") and bos is not None:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, token_id("bos"))])
    hf = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=bos, eos_token=token("eos"),
                                 unk_token=token("unknown"), pad_token=token("padding"),
                                 chat_template=metadata.get("tokenizer.chat_template"),
                                 clean_up_tokenization_spaces=False)
    # a chat model's end of turn (Llama 3's <|eot_id|>) ends a completion like its end of text
    return TokenizerWrapper(hf, eos_token_ids=[i for i in (token_id("eos"), token_id("eot")) if i is not None])


def read_config(path: Path) -> dict[str, Any]:
    weights, metadata = read_gguf(path)
    return gguf_config(path, metadata, weights)


def read_tokenizer(path: Path) -> Any:
    return build_tokenizer(path, read_gguf(path)[1])


def load_gguf(path: Path) -> tuple[nn.Module, Any, dict[str, Any]]:
    """A llama-family GGUF file as (mlx-lm model, tokenizer, its Hugging Face config)."""
    weights, metadata = read_gguf(path)
    _read.cache_clear()  # the model holds what it needs; nothing else keeps the file's arrays alive
    config = gguf_config(path, metadata, weights)
    tokenizer = build_tokenizer(path, metadata)
    return build_model(config, mlx_weights(weights, config)), tokenizer, config
