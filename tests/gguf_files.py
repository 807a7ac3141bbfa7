"""GGUF files for tests, written and read without mlx_grpo.models.gguf.

`write_llama_gguf` writes an mlx-lm llama the way llama.cpp's converter does (its tensor names, q/k rows
permuted for its rotary layout, a byte-level BPE tokenizer in `tokenizer.ggml.*`), so a loader that gets
the names, the permutation or the tokenizer wrong fails against the source model.

`read_gguf_numpy` is an independent reference reader: it parses the file's bytes itself and dequantizes
Q4_0, Q4_1 and Q8_0 blocks with numpy, following the GGUF specification (ggml's block layouts), and keeps
llama.cpp's row order. `reference_llama` builds from it an fp32 mlx-lm llama with *traditional* (interleaved)
RoPE, llama.cpp's own layout, so nothing is un-permuted on that side.
"""

from __future__ import annotations

import struct
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from tokenizers import pre_tokenizers

GGUF_NAMES = {  # mlx-lm's llama names -> llama.cpp's
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
}
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def llama_cpp_permute(rows: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (its `permute`)."""
    return rows.reshape(heads, 2, rows.shape[0] // heads // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def gguf_name(name: str) -> str:
    if name.startswith("model.layers."):
        _, _, index, rest = name.split(".", 3)
        module, leaf = rest.rsplit(".", 1)
        return f"blk.{index}.{GGUF_NAMES[module]}.{leaf}"
    return {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
            "lm_head.weight": "output.weight"}[name]


def byte_level_vocab(words: list[str]) -> tuple[list[str], list[str]]:
    """A small byte-level BPE vocabulary: every byte, the merges that build `words`, ChatML's tokens."""
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *pre_tokenizers.ByteLevel.alphabet()]
    merges: list[str] = []
    for word in words:
        pieces = list(word)
        while len(pieces) > 1:
            merged = pieces[0] + pieces[1]
            if merged not in tokens:
                tokens.append(merged)
                merges.append(f"{pieces[0]} {pieces[1]}")
            pieces = [merged, *pieces[2:]]
    return tokens, merges


def write_llama_gguf(path: Path, model, config: dict, tokens: list[str], merges: list[str],
                     extra_metadata: dict | None = None) -> Path:
    """`model` (mlx-lm llama, float) as a float32 GGUF file in llama.cpp's layout."""
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    tensors = {}
    for name, value in tree_flatten(model.parameters()):
        target = gguf_name(name)
        array = np.array(value.astype(mx.float32))
        kind = target.split(".")[2] if target.startswith("blk.") else None
        tensors[target] = mx.array(llama_cpp_permute(array, heads[kind]) if kind in heads else array)
    u32 = lambda v: mx.array(v, dtype=mx.uint32)  # noqa: E731
    metadata = {
        "general.architecture": "llama", "general.file_type": u32(0),
        "llama.embedding_length": u32(config["hidden_size"]), "llama.block_count": u32(config["num_hidden_layers"]),
        "llama.feed_forward_length": u32(config["intermediate_size"]),
        "llama.attention.head_count": u32(config["num_attention_heads"]),
        "llama.attention.head_count_kv": u32(config["num_key_value_heads"]),
        "llama.attention.layer_norm_rms_epsilon": mx.array(config["rms_norm_eps"], dtype=mx.float32),
        "llama.rope.freq_base": mx.array(config["rope_theta"], dtype=mx.float32),
        "llama.context_length": u32(config["max_position_embeddings"]),
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.token_type": mx.array([3, 3, 3] + [1] * (len(tokens) - 3), dtype=mx.int32),
        "tokenizer.ggml.bos_token_id": u32(1), "tokenizer.ggml.eos_token_id": u32(2),
        "tokenizer.ggml.padding_token_id": u32(2), "tokenizer.chat_template": CHATML,
        **(extra_metadata or {}),
    }
    mx.save_gguf(str(path), tensors, metadata)
    return path


# ----------------------------------------------------------------------------- the reference reader

GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
F32, F16, Q4_0, Q4_1, Q8_0 = 0, 1, 2, 3, 8


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def take(self, fmt: str):
        value = struct.unpack_from("<" + fmt, self.data, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        size = self.take("Q")
        self.pos += size
        return self.data[self.pos - size:self.pos].decode("utf-8")

    def value(self, kind: int):
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            item, count = self.take("I"), self.take("Q")
            return [self.value(item) for _ in range(count)]
        return self.take(GGUF_SCALARS[kind])


def _dequantize(raw: np.ndarray, kind: int, count: int) -> np.ndarray:
    if kind == F32:
        return raw.view(np.float32)[:count]
    if kind == F16:
        return raw.view(np.float16)[:count].astype(np.float32)
    block = {Q4_0: 18, Q4_1: 20, Q8_0: 34}[kind]
    blocks = raw[: count // 32 * block].reshape(-1, block)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    if kind == Q8_0:
        return (d * blocks[:, 2:].copy().view(np.int8).astype(np.float32)).reshape(-1)
    packed = blocks[:, 4:] if kind == Q4_1 else blocks[:, 2:]
    q = np.concatenate([packed & 0x0F, packed >> 4], axis=1).astype(np.float32)  # low nibbles are weights 0-15
    if kind == Q4_1:
        return (d * q + blocks[:, 2:4].copy().view(np.float16).astype(np.float32)).reshape(-1)
    return (d * (q - 8)).reshape(-1)


def read_gguf_numpy(path: Path) -> tuple[dict[str, np.ndarray], dict]:
    """Every tensor as float32 numpy (llama.cpp's row order) and the metadata, from the file's bytes."""
    data = Path(path).read_bytes()
    reader = _Reader(data)
    assert data[:4] == b"GGUF", "not a GGUF file"
    reader.pos = 4
    version, tensor_count, kv_count = reader.take("I"), reader.take("Q"), reader.take("Q")
    assert version >= 2
    metadata = {}
    for _ in range(kv_count):
        key = reader.string()
        metadata[key] = reader.value(reader.take("I"))
    infos = []
    for _ in range(tensor_count):
        name = reader.string()
        dims = [reader.take("Q") for _ in range(reader.take("I"))]
        infos.append((name, dims, reader.take("I"), reader.take("Q")))
    alignment = metadata.get("general.alignment", 32)
    start = (reader.pos + alignment - 1) // alignment * alignment
    tensors = {}
    for name, dims, kind, offset in infos:
        count = int(np.prod(dims))
        raw = np.frombuffer(data, dtype=np.uint8, offset=start + offset, count=min(len(data) - start - offset,
                                                                                  count * 4))
        tensors[name] = _dequantize(raw, kind, count).reshape(dims[::-1])  # ne[0] is the innermost
    return tensors, metadata


def reference_llama(path: Path):
    """An fp32 mlx-lm llama from `read_gguf_numpy`: rows in llama.cpp's order, traditional RoPE."""
    from mlx_lm.models import llama

    tensors, md = read_gguf_numpy(path)
    args = llama.ModelArgs(
        model_type="llama", hidden_size=md["llama.embedding_length"], num_hidden_layers=md["llama.block_count"],
        intermediate_size=md["llama.feed_forward_length"], num_attention_heads=md["llama.attention.head_count"],
        num_key_value_heads=md["llama.attention.head_count_kv"],
        rms_norm_eps=md["llama.attention.layer_norm_rms_epsilon"], vocab_size=len(md["tokenizer.ggml.tokens"]),
        rope_theta=md["llama.rope.freq_base"], rope_traditional=True,
        tie_word_embeddings="output.weight" not in tensors)
    model = llama.Model(args)
    back = {gguf_name(name): name for name, _ in tree_flatten(model.parameters())}
    model.load_weights([(back[name], mx.array(value)) for name, value in tensors.items()], strict=True)
    mx.eval(model.parameters())
    return model


# ----------------------------------------------------------------------------- every family, every type

# mlx-lm's module names -> llama.cpp's, per family (llama.cpp's tensor mapping, written out here on their own)
FAMILY_NAMES = {
    "llama": GGUF_NAMES,
    "qwen2": GGUF_NAMES,
    "qwen3": {**GGUF_NAMES, "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"},
    "gemma3": {**GGUF_NAMES, "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
               "pre_feedforward_layernorm": "ffn_norm", "post_attention_layernorm": "post_attention_norm",
               "post_feedforward_layernorm": "post_ffw_norm"},
}
# where the f16 scales of a K-quant block sit (ggml's block_q*_K structs), so random blocks decode to finite values
K_SCALE_OFFSETS = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def family_gguf_name(family: str, name: str) -> str:
    if name.startswith("model.layers."):
        _, _, index, rest = name.split(".", 3)
        module, leaf = rest.rsplit(".", 1)
        return f"blk.{index}.{FAMILY_NAMES[family][module]}.{leaf}"
    return {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
            "lm_head.weight": "output.weight"}[name]


def encode_tensor(values: np.ndarray, type_name: str, rng: np.random.Generator) -> tuple[np.ndarray, object]:
    """`values` in ggml type `type_name`: float types and the legacy quants by the gguf package's own
    quantizer; K-quants (which it cannot write) as random blocks with sane scales, the values then being
    whatever those blocks decode to."""
    import gguf

    kind = gguf.GGMLQuantizationType[type_name]
    if type_name == "F32":
        return values.astype(np.float32), kind
    if type_name in K_SCALE_OFFSETS:
        block, size = gguf.GGML_QUANT_SIZES[kind]
        blocks = rng.integers(0, 256, size=(values.size // block, size), dtype=np.uint8)
        for offset in K_SCALE_OFFSETS[type_name]:
            scales = rng.uniform(0.002, 0.02, size=len(blocks)).astype(np.float16)
            blocks[:, offset:offset + 2] = scales.view(np.uint8).reshape(-1, 2)
        return blocks.reshape(values.shape[0], -1), kind
    return gguf.quants.quantize(values.astype(np.float32), kind), kind


def llama3_rope_factors(dims: int, base: float, scaling: dict) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf `rope_freqs` for Llama 3.1+'s rope scaling."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    factors = []
    for freq in 1.0 / (base ** (np.arange(0, dims, 2, dtype=np.float64) / dims)):
        wavelength = 2 * np.pi / freq
        if wavelength < original / high:
            factors.append(1.0)
        elif wavelength > original / low:
            factors.append(factor)
        else:
            smooth = (original / wavelength - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def write_family_gguf(path: Path, family: str, model, config: dict, tokenizer: dict, types=("F32",),
                      seed: int = 0) -> Path:
    """`model` (an mlx-lm model of `family`) as llama.cpp writes it, with the gguf package's writer: its
    names, llama's q/k rows permuted, gemma's norms stored as 1 + weight, Llama 3's rope scaling as a
    `rope_freqs` tensor. Matrices take the tensor types of `types` in turn (norms and biases stay F32, as
    llama.cpp keeps them); `tokenizer`: the tokenizer.ggml.* values."""
    import gguf

    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), family)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config.get("max_position_embeddings", 2048))
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config["rope_theta"])
    if family == "gemma3":
        writer.add_sliding_window(config["sliding_window"])
    writer.add_tokenizer_model(tokenizer["model"])
    if "pre" in tokenizer:
        writer.add_tokenizer_pre(tokenizer["pre"])
    writer.add_token_list(tokenizer["tokens"])
    writer.add_token_types(tokenizer["types"])
    if "scores" in tokenizer:
        writer.add_token_scores(tokenizer["scores"])
    if "merges" in tokenizer:
        writer.add_token_merges(tokenizer["merges"])
    writer.add_bos_token_id(tokenizer["bos"])
    writer.add_eos_token_id(tokenizer["eos"])
    writer.add_add_bos_token(tokenizer.get("add_bos", False))
    if "chat_template" in tokenizer:
        writer.add_chat_template(tokenizer["chat_template"])
    if config.get("rope_scaling"):
        writer.add_tensor("rope_freqs.weight", llama3_rope_factors(config["head_dim"], config["rope_theta"],
                                                                    config["rope_scaling"]))
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    matrices = 0
    for name, value in tree_flatten(model.parameters()):
        target = family_gguf_name(family, name)
        array = np.array(value.astype(mx.float32))
        kind = target.split(".")[2] if target.startswith("blk.") else None
        if family == "llama" and kind in heads:
            array = llama_cpp_permute(array, heads[kind])
        if family == "gemma3" and target.endswith("norm.weight"):
            array = array + 1
        if array.ndim == 2:
            data, raw_dtype = encode_tensor(array, types[matrices % len(types)], rng)
            matrices += 1
            writer.add_tensor(target, data, raw_dtype=raw_dtype)
        else:
            writer.add_tensor(target, array.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def sentencepiece_vocab(words: list[str]) -> dict:
    """A small SentencePiece (BPE, byte fallback) vocabulary as llama.cpp stores gemma's: control tokens,
    the 256 byte tokens, then pieces (spaces as U+2581) scored in merge order."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    types = [3, 3, 3, 2, 3, 3]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    pieces: list[str] = []
    for word in words:
        word = "\u2581" + word if not word.startswith("\u2581") else word
        for end in range(1, len(word) + 1):
            for start in range(end):
                piece = word[start:end]
                if piece not in pieces and piece not in tokens:
                    pieces.append(piece)
    pieces.sort(key=len)
    tokens += pieces
    types += [1] * len(pieces)
    scores = [0.0] * (len(tokens) - len(pieces)) + [-float(i) for i in range(len(pieces))]
    return {"model": "llama", "pre": "default", "tokens": tokens, "types": types, "scores": scores, "bos": 2,
            "eos": 1, "add_bos": True}


def byte_level_tokenizer(words: list[str]) -> dict:
    tokens, merges = byte_level_vocab(words)
    return {"model": "gpt2", "pre": "qwen2", "tokens": tokens, "merges": merges,
            "types": [3, 3, 3] + [1] * (len(tokens) - 3), "bos": 0, "eos": 2, "chat_template": CHATML}
