"""A trained model out of a run directory: loaded from a checkpoint, written as a Hugging Face directory.

`load_trained(run_dir, step)` rebuilds the policy of a checkpoint (the run's base model, its adapters, the
checkpoint's weights) for `mlx-grpo eval`; `export_model(run_dir, out, step, fuse)` writes it where
`mlx_lm.generate` and `mlx_lm.server` load it: config.json, tokenizer files and safetensors weights. A LoRA
run's adapters are fused into the weights with `fuse`; without it the directory holds the base weights
plus `adapters.safetensors` and `adapter_config.json` (load with `--adapter-path` set to the same
directory). `write_fused(out, model, tokenizer, model_id, base_dir)` writes an in-memory policy (the
trainer's final model for W&B).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

from ..checkpoint import ADAPTER_CONFIG, ADAPTERS, list_checkpoints, weights_name
from ..common.errors import UserError
from ..config.train_config import TrainConfig
from ..models.policy import (
    apply_adapters,
    dequantize_base,
    is_quantized,
    load_policy,
    model_config,
    resolve_dtype,
    resolve_model_path,
)
from ..telemetry.rundir.layout import RunPaths, checkpoint_step
from .resume import config_for_resume

ADAPTER_FILES = (ADAPTERS, ADAPTER_CONFIG)


@dataclass
class Trained:
    """A checkpoint's policy, ready to generate with."""

    model: nn.Module
    tokenizer: Any
    config: TrainConfig  # the run's config
    base_dir: Path  # where the run resolved relative paths from
    checkpoint: Path


def find_checkpoint(run_dir: Path, step: int | None) -> Path:
    """The checkpoint of `step`, or the run's latest; a UserError names the steps there are."""
    found = list_checkpoints(RunPaths(run_dir).checkpoints)
    if not found:
        raise UserError(f"{run_dir}: no checkpoint yet (checkpoints/step_<N>); train until the first one is saved")
    if step is None:
        return found[-1]
    for path in found:
        if checkpoint_step(path) == step:
            return path
    steps = ", ".join(str(checkpoint_step(p)) for p in found)
    raise UserError(f"{run_dir}: no checkpoint of step {step}; there are checkpoints of steps {steps}")


def _load_weights(model: nn.Module, checkpoint: Path) -> None:
    name = weights_name(checkpoint)
    try:
        model.load_weights(str(checkpoint / name), strict=False)
    except (OSError, ValueError, RuntimeError) as err:  # RuntimeError: mlx reading a damaged file
        detail = (str(err).splitlines() or [""])[0]
        raise UserError(f"{checkpoint / name}: cannot be read ({type(err).__name__}: {detail})") from err


def load_trained(run_dir: Path, step: int | None = None) -> Trained:
    """The policy of a run's checkpoint: base model, the run's adapters, the checkpoint's weights."""
    config, base_dir = config_for_resume(run_dir, {})
    checkpoint = find_checkpoint(run_dir, step)
    model, tokenizer = load_policy(config, base_dir)
    dequantize_base(model, config)  # the policy as the run trained it
    apply_adapters(model, config)
    _load_weights(model, checkpoint)
    model.eval()
    return Trained(model, tokenizer, config, base_dir, checkpoint)


def _source(model_id: str, base_dir: Path) -> Path:
    """The base model's directory (a hub model's local copy) or GGUF file."""
    from mlx_lm.utils import hf_repo_to_path

    source = resolve_model_path(model_id, base_dir)
    return Path(source) if Path(source).exists() else hf_repo_to_path(source)


def fuse_adapters(model: nn.Module) -> None:
    """Fold every LoRA/DoRA layer into the linear layer it wraps (mlx-lm's fuse), in place."""
    fused = [(name, module.fuse()) for name, module in model.named_modules() if hasattr(module, "fuse")]
    if fused:
        model.update_modules(tree_unflatten(fused))


FLOAT_DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}


def export_dtype(source: Path, config: dict[str, Any], run_dtype: str, float32: bool) -> str:
    """The dtype written: float32 when asked; else the source's own float dtype (config.json's `torch_dtype`;
    a GGUF file's quantized or half-precision weights: bfloat16), so an export is the size of its source, not
    twice it because the run computed in float32 on the CPU; else the run's."""
    if float32:
        return "float32"
    stated = config.get("torch_dtype") or config.get("dtype")
    if stated in FLOAT_DTYPES:
        return stated
    return "bfloat16" if source.suffix.lower() == ".gguf" else run_dtype


def _write(out: Path, model: nn.Module, tokenizer: Any, source: Path, dtype: str | None = None) -> None:
    """Weights (floating ones in `dtype`, when given), the base model's config (architecture, vocabulary,
    rope... describe the written weights too), the tokenizer files, and a source directory's
    generation_config.json and model code."""
    from mlx_lm.utils import save_config, save_model

    config = model_config(str(source))
    ends = sorted(getattr(tokenizer, "eos_token_ids", None) or [])
    if len(ends) > 1:  # every id that ends a reply (a GGUF's end of turn and end of text), so mlx-lm stops there too
        config["eos_token_id"] = ends
    if not is_quantized(model):  # a base dequantized at load (quantized_base) is written plain
        config.pop("quantization", None)
        config.pop("quantization_config", None)
    if dtype is not None:
        model.set_dtype(FLOAT_DTYPES[dtype])  # floating weights only: packed quantized ones stay as they are
        config["torch_dtype"] = dtype
    save_model(out, model, donate_model=False)
    save_config(config, out / "config.json")
    tokenizer.save_pretrained(out)
    if source.is_dir():
        for name in [*source.glob("*.py"), source / "generation_config.json"]:
            if name.is_file():
                shutil.copy2(name, out / name.name)


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out {out}: exists and is not an empty directory; choose a new one (nothing is overwritten)")


@contextlib.contextmanager
def _whole_or_nothing(out: Path) -> Iterator[Path]:
    """A directory to write into that appears at `out` only once complete: it is built as a hidden sibling
    (`.NAME.partial-PID`) and renamed into place, so a full disk, an error or Ctrl-C never leaves a
    half-written model where eval, mlx-lm or a second export would take it for a whole one."""
    _check_out(out)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    try:
        tmp.mkdir(parents=True)
        yield tmp
        if out.is_dir():
            out.rmdir()  # an empty directory given as --out
        os.rename(tmp, out)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(err, OSError) or (isinstance(err, RuntimeError) and "[write]" in str(err)):
            reason = getattr(err, "strerror", None) or " ".join(str(err).split())[:200]
            raise UserError(f"--out {out}: cannot write the model there ({reason}); nothing was left behind") from None
        raise


def write_fused(out: Path, model: nn.Module, tokenizer: Any, model_id: str, base_dir: Path) -> Path:
    """Write an in-memory policy as a complete model directory, adapters fused (the model is changed in place)."""
    fuse_adapters(model)
    with _whole_or_nothing(out) as tmp:
        _write(tmp, model, tokenizer, _source(model_id, base_dir))
    return out


def export_model(run_dir: Path, out: Path, step: int | None = None, fuse: bool = False,
                 float32: bool = False) -> dict[str, Any]:
    """Write a run's checkpoint as a Hugging Face directory, in the source's dtype (`export_dtype`; float32
    with `float32`); returns what was written (also export.json)."""
    _check_out(out)
    config, base_dir = config_for_resume(run_dir, {})
    checkpoint = find_checkpoint(run_dir, step)
    source = _source(config.model_id, base_dir)
    model, tokenizer = load_policy(config, base_dir)
    dequantize_base(model, config)  # written as the run trained it: plain if the run dequantized its base
    unfused_lora = config.use_lora and not fuse
    if not unfused_lora:
        apply_adapters(model, config)
        _load_weights(model, checkpoint)
        fuse_adapters(model)
    summary = {"run_dir": str(run_dir), "checkpoint": checkpoint.name,
               "step": checkpoint_step(checkpoint), "model_id": config.model_id,
               "use_lora": config.use_lora, "fused": config.use_lora and fuse, "out": str(out),
               "dtype": export_dtype(source, model_config(str(source)), resolve_dtype(config), float32),
               "system_prompt": config.system_prompt, "use_chat_template": config.use_chat_template}
    with _whole_or_nothing(out) as tmp:
        _write(tmp, model, tokenizer, source, summary["dtype"])  # an unfused LoRA export writes the base weights
        if unfused_lora:
            for name in ADAPTER_FILES:
                shutil.copy2(checkpoint / name, tmp / name)
        (tmp / "export.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
