"""GGUF files (llama.cpp, Ollama, LM Studio) as a model source: an mlx-lm model and its tokenizer.

Families: llama (Mistral, SmolLM, TinyLlama; Llama 3.x with its rope scaling), qwen2, qwen3, gemma3, phi3.
Tensor types: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and Q2_K..Q6_K, mixed freely in one file.

- The header is read by gguf_header.py, bounds-checked; everything a load needs (family, metadata keys and
  their types, tensor names and types, tokenizer) is checked before any tensor data is read, and a file that
  cannot load is refused in one line naming every reason.
- Tensors are read by the `gguf` package (llama.cpp's own numpy code), so each equals llama.cpp's reading.
  What no library does is here: mlx-lm's names and layout (llama.cpp's rotary row permutation of llama q/k
  undone, gemma's stored `1 + weight` norms put back), and, when the base stays quantized (`quantized_base:
  keep`, a Mac's default), MLX's affine format, groups of 32: written from the blocks where the type has an
  exact form (gguf_blocks.py), else quantized at 8 bits, with the error said per matrix kind.
- The model is built first with no weight computed (MLX is lazy), then filled one tensor at a time, a chunk
  of rows at a time: the load's peak is about the loaded model plus one tensor, not a float32 copy of all.
- The tokenizer is transformers' GGUF converter (byte-level BPE and SentencePiece vocabularies), with the
  digit-by-digit split llama.cpp's `smollm`/`starcoder` pre-tokenizer does and the file's chat template.

`gguf_config` (gguf_config.py) is the Hugging Face config.json of the file (what `mlx-grpo plan` and `export` read);
`load_gguf` returns (model, tokenizer, config, note).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from ..common.errors import UserError
from .families import GGUF_ARCHITECTURES
from .gguf_blocks import EXACT_BITS, GROUP_SIZE, REQUANTIZED, affine_groups, pack
from .gguf_config import (
    DIGITS_PRE,
    FLOAT_TYPES,
    _kept_bits,
    _mlx_name,
    gguf_config,
    quantization,
    read_gguf,
)
from .gguf_header import Header, TensorInfo, type_name

# ----------------------------------------------------------------------------- tensors

# The special tokens that end a turn or a document in the chat formats we load (ChatML, Llama 3, gemma)
END_MARKERS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>")
ROW_CHUNK_WEIGHTS = 1 << 21  # weights converted at once: bounds the load's temporaries to a few tens of MB


def tensor_chunks(path: Path, info: TensorInfo, heads: int | None = None) -> Iterator[tuple[int, np.ndarray,
                                                                                              np.ndarray]]:
    """One tensor's rows a chunk at a time: (first row, the file's bytes of those rows, their float32 values
    by the gguf package's dequantization, i.e. llama.cpp's reading). Every tensor the loader reads passes
    here, so this is where a check on a tensor's values belongs. `heads`: a llama q/k projection, its rows
    put back in mlx-lm's order (`unpermute_rows`)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    rows = int(np.prod(info.shape[:-1]))
    row_bytes = info.nbytes // rows
    kind = GGMLQuantizationType(info.type_id)
    whole = None
    if heads:  # q/k are hidden x hidden at most: read whole to permute
        whole = unpermute_rows(np.fromfile(path, np.uint8, info.nbytes, offset=info.offset).reshape(rows, -1), heads)
    step = max(1, ROW_CHUNK_WEIGHTS // info.shape[-1])
    for start in range(0, rows, step):
        count = min(step, rows - start)
        raw = (whole[start:start + count] if whole is not None else
               np.fromfile(path, np.uint8, count * row_bytes,
                           offset=info.offset + start * row_bytes).reshape(count, -1))
        with np.errstate(invalid="ignore", over="ignore"):  # damaged scales: check_finite names the tensor instead
            values = dequantize(raw, kind).astype(np.float32, copy=False).reshape(count, -1)
        yield start, raw, check_finite(values, info.name, path)


def dequantized(path: Path, info: TensorInfo) -> np.ndarray:
    """One (small) tensor whole as float32 numpy (llama.cpp's row order)."""
    return np.concatenate([values for _, _, values in tensor_chunks(path, info)]).reshape(info.shape)


def check_finite(value: np.ndarray, name: str, path: Path) -> np.ndarray:
    """`value` when every number in it is finite; else one line naming the tensor (a base whose weights hold
    NaN or Inf trains to NaN, and the run would blame the learning rate)."""
    if not np.isfinite(value).all():
        bad = "NaN" if np.isnan(value).any() else "Inf"
        raise UserError(f"model '{path}': tensor {name} decodes to {bad}: a damaged file, or a wrong tensor type in "
                        "its header")
    return value


def unpermute_rows(rows: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's rotary permutation of a llama q/k projection (rows first). Within each head
    llama.cpp stores row pairs interleaved (0, d/2, 1, d/2+1, ...); mlx-lm's RoPE, like Hugging Face's,
    wants the halves one after the other."""
    shape = rows.shape
    return rows.reshape(heads, shape[0] // heads // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


@dataclass
class WeightError:
    """Kept-quantized weights against the file's values, summed over the matrices of one kind."""
    squared_error: float = 0.0
    squared_value: float = 0.0

    def add(self, ours: mx.array, file_values: np.ndarray) -> None:
        values = mx.array(file_values)
        self.squared_error += mx.sum(mx.square(ours.astype(mx.float32) - values)).item()
        self.squared_value += mx.sum(mx.square(values)).item()

    def relative(self) -> float:
        """RMS of the error over RMS of the weights."""
        return (self.squared_error / self.squared_value) ** 0.5 if self.squared_value else 0.0


def plain_tensor(chunks: Iterator, info: TensorInfo, dtype: mx.Dtype, offset: float = 0.0) -> mx.array:
    """A tensor as the file's values in `dtype`, filled chunk by chunk into its one array."""
    rows = int(np.prod(info.shape[:-1]))
    out = mx.zeros((rows, info.shape[-1]), dtype)
    for start, _, values in chunks:
        out[start:start + len(values)] = mx.array(values - np.float32(offset) if offset else values).astype(dtype)
        mx.eval(out)  # the previous buffer is reused: the tensor is never held twice
    return out.reshape(info.shape)


def quantized_tensor(chunks: Iterator, info: TensorInfo, bits: int, dtype: mx.Dtype,
                     error: WeightError) -> dict[str, mx.array]:
    """A matrix in MLX's affine format at `bits`, groups of 32: written from the blocks for the exact types,
    quantized by MLX from the file's values for the others; its error against the file's values added up."""
    kind = type_name(info.type_id)
    rows, cols = int(np.prod(info.shape[:-1])), info.shape[-1]
    weight = mx.zeros((rows, cols * bits // 32), mx.uint32)
    scales, biases = mx.zeros((rows, cols // GROUP_SIZE), dtype), mx.zeros((rows, cols // GROUP_SIZE), dtype)
    for start, raw, values in chunks:
        if kind in EXACT_BITS:
            codes, step, offset = affine_groups(raw, kind)
            w, s, b = mx.array(pack(codes, bits)), mx.array(step), mx.array(offset)
        else:
            w, s, b = mx.quantize(mx.array(values), GROUP_SIZE, bits)
        stop = start + len(values)
        weight[start:stop], scales[start:stop], biases[start:stop] = w, s.astype(dtype), b.astype(dtype)
        mx.eval(weight, scales, biases)
        error.add(mx.dequantize(weight[start:stop], scales[start:stop], biases[start:stop], GROUP_SIZE, bits),
                  values)
    return {"weight": weight, "scales": scales, "biases": biases}


# Llama 3.1-3.3's rope scaling: llama.cpp stores its result (a factor per frequency) as `rope_freqs`, not the
# parameters. They are found by matching the factors: transformers and mlx-lm take the parameters.
LLAMA3_CANDIDATES = [(low, high, original) for low in (1.0, 2.0) for high in (4.0, 8.0)
                     for original in (2048, 4096, 8192, 16384, 32768)]


def llama3_factors(dims: int, base: float, factor: float, low: float, high: float, original: int) -> np.ndarray:
    """The per-frequency divisors Llama 3's rope scaling applies (as llama.cpp's converter writes them)."""
    wavelengths = 2 * np.pi * base ** (np.arange(0, dims, 2, dtype=np.float64) / dims)
    smooth = np.clip((original / wavelengths - low) / (high - low), 0.0, 1.0)
    return 1.0 / ((1 - smooth) / factor + smooth)


def llama3_rope_scaling(path: Path, header: Header, config: dict[str, Any]) -> dict[str, Any]:
    freqs = dequantized(path, header.tensors["rope_freqs.weight"]).astype(np.float64)
    factor = float(freqs.max())
    for low, high, original in LLAMA3_CANDIDATES:
        expected = llama3_factors(config["head_dim"], config["rope_theta"], factor, low, high, original)
        if expected.shape == freqs.shape and np.allclose(expected, freqs, rtol=1e-4):
            return {"rope_type": "llama3", "factor": factor, "low_freq_factor": low, "high_freq_factor": high,
                    "original_max_position_embeddings": original}
    raise UserError(f"{path}: cannot load: its rope_freqs tensor is not Llama 3's rope scaling")


def empty_model(config: dict[str, Any], names: list[str], quantized: dict[str, int]) -> nn.Module:
    """mlx-lm's model of the family with no weight computed yet (MLX is lazy: the initial weights are never
    evaluated, so this holds no memory), the matrices at `quantized` (module path -> bits) already MLX's
    quantized modules, groups of 32."""
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    if hasattr(model, "sanitize"):
        model.sanitize(dict.fromkeys(names))  # gemma3: drops lm_head when the embedding is tied
    if quantized:
        nn.quantize(model, group_size=GROUP_SIZE, bits=Counter(quantized.values()).most_common(1)[0][0],
                    class_predicate=lambda path, _: path in quantized and
                    {"group_size": GROUP_SIZE, "bits": quantized[path], "mode": "affine"})
    return model


def fill_model(model: nn.Module, path: Path, header: Header, config: dict[str, Any], quantized: dict[str, int],
               dtype: mx.Dtype) -> dict[tuple[str, str, int], WeightError]:
    """Every tensor of the file into `model`, one at a time and the largest first (while it is converted the
    model holds little else), so the load's peak is about the loaded model plus one tensor. The matrices at
    `quantized` in MLX's format, the rest as the file's values; floats in `dtype`. Returns the error of the
    kept-quantized weights per (matrix kind, ggml type, bits)."""
    family = GGUF_ARCHITECTURES[header.metadata["general.architecture"]]
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    expected = dict(tree_flatten(model.parameters()))
    errors: dict[tuple[str, str, int], WeightError] = defaultdict(WeightError)
    filled = set()
    for name, info in sorted(header.tensors.items(), key=lambda item: -item[1].size):
        if name == "rope_freqs.weight":
            continue  # read into the config's rope scaling
        target = _mlx_name(name, family)
        module, leaf = target.rsplit(".", 1)
        kind = name.split(".")[2] if name.startswith("blk.") else None
        chunks = tensor_chunks(path, info, heads[kind] if family.permuted_qk and kind in heads else None)
        if module in quantized and leaf == "weight":
            error = errors[(module.rsplit(".", 1)[-1], type_name(info.type_id), quantized[module])]
            arrays = {f"{module}.{key}": value
                      for key, value in quantized_tensor(chunks, info, quantized[module], dtype, error).items()}
        else:
            offset = family.norm_offset if name.endswith("norm.weight") else 0.0
            arrays = {target: plain_tensor(chunks, info, dtype, offset)}
        for key, value in arrays.items():
            if key not in expected or expected[key].shape != value.shape:
                raise UserError(f"{path}: cannot load: tensor {name} has shape {list(info.shape)}, which the "
                                f"model its metadata describes does not take")
        model.load_weights(list(arrays.items()), strict=False)
        filled.update(arrays)
    if set(expected) - filled:
        raise UserError(f"{path}: cannot load: no tensor for {', '.join(sorted(set(expected) - filled)[:3])}")
    model.eval()
    return errors


# ----------------------------------------------------------------------------- tokenizer


def build_tokenizer(path: Path, header: Header) -> Any:
    """The file's tokenizer (transformers' GGUF converter) in mlx-lm's TokenizerWrapper."""
    from mlx_lm.tokenizer_utils import TokenizerWrapper
    from tokenizers import pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer

    md = header.metadata
    renames = GGUF_TOKENIZER_MAPPING["tokenizer"]
    tokenizer_dict = {renames[k[len("tokenizer."):]]: v for k, v in md.items()
                      if k.startswith("tokenizer.") and k[len("tokenizer."):] in renames}
    try:
        backend, _ = convert_gguf_tokenizer(md["general.architecture"], tokenizer_dict)
    except Exception as err:  # noqa: BLE001 - whatever the file's vocabulary makes the converter raise
        raise UserError(f"{path}: cannot load: its tokenizer cannot be built ({type(err).__name__}: "
                        f"{(str(err).splitlines() or [''])[0][:200]})") from None
    if md.get("tokenizer.ggml.pre") in DIGITS_PRE:
        backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                         pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tokens = md["tokenizer.ggml.tokens"]

    def token_id(key: str) -> int | None:
        return md.get(f"tokenizer.ggml.{key}_token_id")

    def token(key: str) -> str | None:
        return None if token_id(key) is None else tokens[token_id(key)]

    bos = token("bos")
    add_bos = md.get("tokenizer.ggml.add_bos_token", md.get("tokenizer.ggml.model") == "llama")
    if add_bos and bos is not None:
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, token_id("bos"))])
    else:
        backend.post_processor = None
    hf = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=bos, eos_token=token("eos"),
                                 unk_token=token("unknown"), pad_token=token("padding"),
                                 chat_template=md.get("tokenizer.chat_template"),
                                 clean_up_tokenization_spaces=False)
    # A chat model's end of turn (Llama 3's <|eot_id|>, gemma's <end_of_turn>) ends a completion too, and so
    # does the end of a document: Qwen2.5's files name <|im_end|> as EOS, but a tuned Qwen2.5-Coder-0.5B wrote
    # <|endoftext|> mid-reply and, not stopped, ran on to the length limit (llama.cpp stops at both).
    ends = [i for i in (token_id("eos"), token_id("eot")) if i is not None]
    vocab = hf.get_vocab()
    ends += [vocab[marker] for marker in END_MARKERS if marker in vocab]
    return TokenizerWrapper(hf, eos_token_ids=sorted(set(ends)))


# ----------------------------------------------------------------------------- the three entry points


def read_config(path: Path) -> dict[str, Any]:
    header = read_gguf(path)
    config = gguf_config(path, header)
    if config.get("rope_scaling", False) is None:
        config["rope_scaling"] = llama3_rope_scaling(path, header, config)
    quant = quantization(header)
    if quant:
        config["quantization"] = quant
    return config


def read_tokenizer(path: Path) -> Any:
    header = read_gguf(path)
    gguf_config(path, header)
    return build_tokenizer(path, header)


def load_gguf(path: Path, keep_quantized: bool = True,
              dtype: mx.Dtype = mx.float32) -> tuple[nn.Module, Any, dict[str, Any], str | None]:
    """A GGUF file as (mlx-lm model, tokenizer, its Hugging Face config, what loading did). With
    `keep_quantized`, the matrices the file holds quantized stay quantized in MLX's affine format (exactly the
    file's values where a conversion exists, gguf_blocks.py); otherwise every weight is the file's value.
    Floats (and the scales and biases) in `dtype`, the run's."""
    header = read_gguf(path)
    config = read_config(path)
    tokenizer = build_tokenizer(path, header)
    family = GGUF_ARCHITECTURES[header.metadata["general.architecture"]]
    plain = {k: v for k, v in config.items() if k != "quantization"}
    quantized = _kept_bits(header, family) if keep_quantized else {}
    names = [_mlx_name(name, family) for name in header.tensors if name != "rope_freqs.weight"]
    model = empty_model(plain, names, quantized)
    errors = fill_model(model, path, header, config, quantized, dtype)
    types = sorted({type_name(t.type_id) for t in header.tensors.values()} - FLOAT_TYPES)
    if not types:
        return model, tokenizer, config, None
    if not keep_quantized:
        return model, tokenizer, plain, (f"the file's {', '.join(types)} tensors dequantized to {_dtype_name(dtype)} "
                                         "at load (llama.cpp's values); quantized_base: keep keeps them quantized")
    return model, tokenizer, config, kept_note(types, errors, dtype)


def _dtype_name(dtype: mx.Dtype) -> str:
    return str(dtype).removeprefix("mlx.core.")


def kept_note(types: list[str], errors: dict[tuple[str, str, int], WeightError], dtype: mx.Dtype) -> str:
    """What keeping the base quantized did, with the error against the file's values relative to each
    matrix kind's RMS (0: the file's values exactly)."""
    exact = [t for t in types if t in EXACT_BITS]
    other = [t for t in types if t in REQUANTIZED]
    how = []
    if exact:
        how.append(f"{', '.join(exact)} converted block for block at their bits")
    if other:
        how.append(f"{', '.join(other)} quantized at 8 bits from the file's values (no exact form)")
    figures = ", ".join(f"{kind} {ggml} {bits}b {_percent(e.relative())}"
                        for (kind, ggml, bits), e in sorted(errors.items()))
    return (f"the file's quantized tensors kept in MLX's affine format, groups of {GROUP_SIZE}: {'; '.join(how)}; "
            f"weight error relative to each kind's RMS ({_dtype_name(dtype)} scales): {figures}")


def _percent(relative: float) -> str:
    return "0" if relative == 0 else f"{100 * relative:.2g}%"
