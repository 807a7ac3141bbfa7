"""Where a relative path in a config points: a path typed on the command line is relative to where it was
typed (the current directory); a path written in a YAML file is relative to that file's folder.

`resolve_input_paths(mapping, base)` makes the input paths of one source absolute against its base,
before the sources are merged, so the trainer never has to guess which source a path came from. Input
paths are `model_id`, `dataset`, `eval_dataset`, reward files (`file.py:function`), `rubric_file` and
`alerts_file`. Names that are not paths stay as written: `default`, `smollm2`, `gemma3-270m`, `arithmetic`,
`preset:NAME`, `reasoning-gym:TASK`, `hf:NAME`, built-in reward names, and hub ids (`owner/name`,
`owner/name:config`) unless a local file or folder of that name exists. Output locations (`monitoring_dir`,
`tensorboard_dir`, a sweep's `output_dir`) always follow the current directory, wherever they are written.
Imports no mlx.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv", ".tsv", ".txt", ".yaml", ".yml", ".py")
# smollm2.py, gemma3.py, qwen_coder.py
BUILTIN_NAMES = {"model_id": {"default", "smollm2", "gemma3-270m", "qwen2.5-coder-0.5b"}, "dataset": {"arithmetic"}}
PRESET_PREFIX = "preset:"  # a published model shape for `mlx-grpo plan` (presets.py), not a path
DATASET_PREFIXES = ("reasoning-gym:", "hf:")  # a generated task and a Hugging Face datasets name (data.py)


def _absolute(value: str, base: Path) -> str:
    path = Path(value).expanduser()
    # realpath, not Path.resolve: a symlink loop stays a path (the reader then names it) instead of a RuntimeError
    return str(path if path.is_absolute() else os.path.realpath(base / path))


def _looks_like_path(value: str, base: Path) -> bool:
    """A model or dataset value that names a local file or folder rather than a hub id."""
    path = Path(value).expanduser()
    if value.startswith((".", "/", "~")) or (base / path).exists() or path.suffix.lower() in FILE_SUFFIXES:
        return True
    # owner/name is a hub id, unless `owner` is a local folder (a mistyped file under it)
    first, _, rest = value.partition("/")
    return value.count("/") != 1 if not (base / first).is_dir() else bool(rest)


def _model_or_dataset(value: Any, key: str, base: Path) -> Any:
    if not isinstance(value, str) or value in BUILTIN_NAMES.get(key, ()) or value.startswith(PRESET_PREFIX):
        return value
    if key != "model_id" and value.startswith(DATASET_PREFIXES):
        return value
    name = value if key == "model_id" else value.split(":", 1)[0]  # a hub dataset may carry :config
    if (base / Path(value).expanduser()).exists() or _looks_like_path(name, base):
        return _absolute(value, base)
    return value


def _reward(value: Any, base: Path) -> Any:
    name = value.get("name") if isinstance(value, dict) else value
    if not isinstance(name, str) or ":" not in name:
        return value  # a built-in name
    file_part, _, function = name.rpartition(":")
    resolved = f"{_absolute(file_part, base)}:{function}" if file_part else name
    return {**value, "name": resolved} if isinstance(value, dict) else resolved


def resolve_input_paths(mapping: dict, base: Path) -> dict:
    """`mapping` (our key names, top level) with its input paths made absolute against `base`."""
    out = dict(mapping)
    for key in ("model_id", "dataset", "eval_dataset"):
        if key in out:
            out[key] = _model_or_dataset(out[key], key, base)
    for key in ("rubric_file", "alerts_file"):
        if isinstance(out.get(key), str) and out[key]:
            out[key] = _absolute(out[key], base)
    if isinstance(out.get("rewards"), list):
        out["rewards"] = [_reward(item, base) for item in out["rewards"]]
    return out
