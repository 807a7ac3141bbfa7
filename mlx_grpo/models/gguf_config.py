"""A GGUF file read as a model config, before any tensor data: the file a model path names, its header (kept
for the next call), every check a load needs (family, metadata, tensor types and names, tokenizer) with one
line naming every reason it cannot load, the Hugging Face config.json it amounts to, and the quantization a
kept-quantized base gets (gguf.py loads the model). Imports no mlx.
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..common.errors import UserError
from .families import GGUF_ARCHITECTURES, TOP_TENSORS, GGUFLayout
from .gguf_blocks import GROUP_SIZE, mlx_bits
from .gguf_header import Header, TensorInfo, read_header, type_name

FLOAT_TYPES = {"F32", "F16", "BF16"}
QUANT_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
SUPPORTED_TYPES = (*sorted(FLOAT_TYPES), *QUANT_TYPES)

# tokenizer.ggml.pre values split digit by digit, then as GPT-2 does (transformers' converter has no entry)
DIGITS_PRE = ("smollm", "starcoder", "refact")
GPT2_PRE = ("default", "gpt-2", "gpt2")
CONTROL = 3  # tokenizer.ggml.token_type of a control token


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


def read_gguf(path: Path) -> Header:
    """The file's header (metadata and tensor table; no tensor data), kept for the next call: the plan
    reads the shape and tokenizer, then the run loads the model."""
    stat = path.stat()
    return _read(path, stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=2)
def _read(path: Path, mtime_ns: int, size: int) -> Header:
    return read_header(path)


# ----------------------------------------------------------------------------- checks and the config


class _Reasons(list):
    """Every reason a file cannot load, gathered so one line names them all."""

    def metadata(self, md: dict[str, Any], key: str, kind: type, default: Any = None, positive: bool = True) -> Any:
        value = md.get(key, default)
        if value is None:
            self.append(f"no '{key}' in its metadata")
            return None
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or isinstance(value, bool) or (positive and not value > 0):
            self.append(f"'{key}' is {value!r}; expected a positive {'whole ' if kind is int else ''}number")
            return None
        return value


def gguf_config(path: Path, header: Header) -> dict[str, Any]:
    """The Hugging Face config.json (mlx-lm's model) of the file; one UserError naming every reason it
    cannot load (unknown family, tensor types, tensor names, bad metadata, tokenizer)."""
    md, tensors = header.metadata, header.tensors
    reasons = _Reasons()
    arch = md.get("general.architecture")
    family = GGUF_ARCHITECTURES.get(arch) if isinstance(arch, str) else None
    if arch is None:
        reasons.append("no 'general.architecture' in its metadata: not a model's GGUF file")
    elif family is None:
        reasons.append(f"architecture '{arch}' (these load: {', '.join(GGUF_ARCHITECTURES)})")
    refused = Counter(type_name(t.type_id) for t in tensors.values() if type_name(t.type_id) not in SUPPORTED_TYPES)
    if refused:
        reasons.append(f"tensor types {', '.join(f'{n} ({c} tensors)' for n, c in sorted(refused.items()))} "
                       f"(these load: {', '.join(SUPPORTED_TYPES)})")
    config: dict[str, Any] = {}
    if family is not None:
        unknown = sorted(name for name in tensors if _mlx_name(name, family) is None and name != "rope_freqs.weight")
        if unknown:
            reasons.append(f"tensors this loader does not know for {arch} ({', '.join(unknown[:3])}"
                           f"{', ...' if len(unknown) > 3 else ''})")
        if "token_embd.weight" not in tensors:
            reasons.append("no token_embd.weight tensor")
        config = _family_config(md, tensors, arch, family, reasons)
    _check_tokenizer(md, reasons)
    if reasons:
        raise UserError(f"{path}: cannot load: {'; '.join(reasons)}")
    return config


def _family_config(md: dict[str, Any], tensors: dict[str, TensorInfo], arch: str, family: GGUFLayout,
                   reasons: _Reasons) -> dict[str, Any]:
    def key(name: str, kind: type = int, default: Any = None) -> Any:
        return reasons.metadata(md, f"{arch}.{name}", kind, default)

    hidden, heads = key("embedding_length"), key("attention.head_count")
    kv_heads = key("attention.head_count_kv", default=heads)
    head_dim = key("attention.key_length", default=hidden // heads if hidden and heads else None)
    embedding = tensors.get("token_embd.weight")
    config = {
        "model_type": family.model_type,
        "hidden_size": hidden,
        "num_hidden_layers": key("block_count"),
        "intermediate_size": key("feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon", float),
        "rope_theta": key("rope.freq_base", float, 10000.0),
        "max_position_embeddings": key("context_length", int, 4096),
        "vocab_size": embedding.shape[0] if embedding is not None else None,
        "tie_word_embeddings": "output.weight" not in tensors,
        **family.extra,
    }
    for name in ("bos", "eos"):
        index = md.get(f"tokenizer.ggml.{name}_token_id")
        config[f"{name}_token_id"] = index if isinstance(index, int) else None
    if heads and kv_heads and heads % kv_heads:
        reasons.append(f"{heads} attention heads do not share evenly among {kv_heads} key/value heads")
    if arch == "gemma3":
        config["query_pre_attn_scalar"] = head_dim
        config["sliding_window"] = key("attention.sliding_window", int, 512)
    scaling = md.get(f"{arch}.rope.scaling.type", "none")
    if scaling == "linear":
        factor = key("rope.scaling.factor", float)
        if factor:
            config["rope_scaling"] = {"type": "linear", "rope_type": "linear", "factor": factor}
    elif scaling != "none":
        reasons.append(f"rope scaling '{scaling}' (none, linear and Llama 3's load)")
    if "rope_freqs.weight" in tensors:
        if arch not in ("llama", "mistral"):
            reasons.append(f"a rope_freqs tensor in a {arch} file")
        else:
            config["rope_scaling"] = None  # filled in from the tensor's values at load (`llama3_rope_scaling`)
    return config


def _check_tokenizer(md: dict[str, Any], reasons: _Reasons) -> None:
    kind = md.get("tokenizer.ggml.model")
    tokens = md.get("tokenizer.ggml.tokens")
    if kind not in ("gpt2", "llama"):
        reasons.append(f"tokenizer '{kind}' (byte-level BPE 'gpt2' and SentencePiece 'llama' load)")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        reasons.append("no 'tokenizer.ggml.tokens' list of strings in its metadata")
        return
    pre = md.get("tokenizer.ggml.pre", "default")
    if kind == "gpt2" and pre not in GPT2_PRE + DIGITS_PRE + tuple(_transformers_splits()):
        reasons.append(f"pre-tokenizer '{pre}' is not one this loader knows")
    merges = md.get("tokenizer.ggml.merges", [])
    if kind == "gpt2" and not (isinstance(merges, list) and all(isinstance(m, str) and len(m.split(" ")) == 2
                                                                 for m in merges)):
        reasons.append("'tokenizer.ggml.merges' is not a list of 'left right' pairs")
    for name in ("bos", "eos", "eot", "unknown", "padding"):
        index = md.get(f"tokenizer.ggml.{name}_token_id")
        if index is not None and (not isinstance(index, int) or isinstance(index, bool)
                                  or not 0 <= index < len(tokens)):
            reasons.append(f"'tokenizer.ggml.{name}_token_id' is {index!r}; expected a token id below {len(tokens)}")
    types = md.get("tokenizer.ggml.token_type")
    if types is not None and (not isinstance(types, list) or len(types) != len(tokens)):
        reasons.append("'tokenizer.ggml.token_type' does not list one type per token")
    template = md.get("tokenizer.chat_template")
    if template is not None:
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        try:
            ImmutableSandboxedEnvironment().parse(template) if isinstance(template, str) else None
        except TemplateError as err:
            reasons.append(f"'tokenizer.chat_template' is not a valid Jinja template ({err.message})")
        if not isinstance(template, str):
            reasons.append("'tokenizer.chat_template' is not a string")


def _transformers_splits() -> dict[str, str]:
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS

    return GGUF_PRE_TOKENIZER_SPLITS


def _mlx_name(name: str, family: GGUFLayout) -> str | None:
    parts = name.split(".")
    if parts[-1] not in ("weight", "bias"):
        return None
    if parts[0] == "blk" and len(parts) == 4 and parts[1].isdigit() and parts[2] in family.block:
        return f"model.layers.{int(parts[1])}.{family.block[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in TOP_TENSORS:
        return f"{TOP_TENSORS[parts[0]]}.{parts[1]}"
    return None


def _kept_bits(header: Header, family: GGUFLayout) -> dict[str, int]:
    """Module path -> MLX bits of every matrix the file holds quantized (gguf_blocks.mlx_bits)."""
    return {_mlx_name(name, family).removesuffix(".weight"): mlx_bits(type_name(t.type_id))
            for name, t in header.tensors.items() if type_name(t.type_id) in QUANT_TYPES}


def quantization(header: Header) -> dict[str, Any] | None:
    """config.json's `quantization` for the base kept quantized: each matrix at the bits it keeps in MLX's
    format (its type's own bits where the conversion is exact, else 8)."""
    family = GGUF_ARCHITECTURES.get(header.metadata.get("general.architecture"))
    bits = _kept_bits(header, family)
    if not bits:
        return None
    common = Counter(bits.values()).most_common(1)[0][0]
    return {"group_size": GROUP_SIZE, "bits": common, "mode": "affine",
            **{p: {"group_size": GROUP_SIZE, "bits": b, "mode": "affine"} for p, b in sorted(bits.items())
               if b != common}}
