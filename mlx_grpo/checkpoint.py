"""Checkpoints that let a run continue exactly: weights or adapters, optimiser, step, RNG, data order.

Layout of `<run dir>/checkpoints/step_<N>/`:
- `adapters.safetensors` + `adapter_config.json` (LoRA/DoRA; loadable by mlx-lm's `--adapter-path`)
  or `model.safetensors` (full fine-tuning: every weight)
- `optimizer.safetensors`: the optimiser state (AdamW moments and its step counter)
- `state.json`: step, data order position, MLX's global random key, the run id, the config (no
  secrets), the run's recorder state (`run_state`, see telemetry/recorder.py) and the byte length of each
  run-directory JSONL log at the moment of the checkpoint (resume cuts the logs back to it)

A checkpoint is written into a temporary directory and renamed into place, so a
crash mid-write never leaves a half checkpoint that looks complete.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_unflatten

from .common.errors import UserError

STEP_DIR = re.compile(r"^step_(\d+)$")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class PendingCheckpoint:
    """A checkpoint written to its temporary directory, not yet in place (see `prepare_checkpoint`)."""

    tmp: Path
    final: Path
    keep: int
    seconds: float  # time spent writing it

    def commit(self, extra_state: dict[str, Any]) -> Path:
        """Add `extra_state` to its state.json and move it into place; prune old checkpoints."""
        state_path = self.tmp / "state.json"
        with _written_or_removed(self.tmp, self.final):
            state = {**json.loads(state_path.read_text()), **extra_state}
            _write_synced(state_path, json.dumps(state))
            _fsync_dir(self.tmp)
        shutil.rmtree(self.final, ignore_errors=True)
        os.replace(self.tmp, self.final)
        _fsync_dir(self.final.parent)
        for old in list_checkpoints(self.final.parent)[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return self.final


@contextmanager
def _written_or_removed(tmp: Path, final: Path) -> Iterator[None]:
    """A checkpoint that cannot be written (a full or read-only disk) is removed whole, and the run stops
    with one line: the last complete checkpoint is untouched and the run resumes from it."""
    try:
        yield
    except (OSError, RuntimeError) as err:  # RuntimeError: mlx's safetensors writer
        shutil.rmtree(tmp, ignore_errors=True)
        detail = (str(err).splitlines() or [""])[0]
        run_dir = final.parent.parent
        raise UserError(f"writing checkpoint {final.name} failed ({detail}); the last complete checkpoint is "
                        f"untouched: free some space, then continue with mlx-grpo train --resume "
                        f"{shlex.quote(str(run_dir))}") from None


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def prepare_checkpoint(
    checkpoints_dir: Path,
    step: int,
    model: nn.Module,
    optimizer: optim.Optimizer,
    state: dict[str, Any],
    adapter_config: dict | None,
    keep: int,
) -> PendingCheckpoint:
    """Write weights (or adapters), optimiser and `state` into `.step_<N>.tmp`; `commit` puts it in place.

    Two phases so the loop can time the checkpoint in the step's own record and store the logs'
    lengths after that record: a crash before the commit leaves only the previous checkpoint.
    """
    start = time.perf_counter()
    tmp = checkpoints_dir / f".step_{step}.tmp"
    with _written_or_removed(tmp, checkpoints_dir / f"step_{step}"):
        checkpoints_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        if adapter_config is not None:
            mx.save_safetensors(str(tmp / "adapters.safetensors"), dict(tree_flatten(model.trainable_parameters())))
            (tmp / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2))
        else:
            mx.save_safetensors(str(tmp / "model.safetensors"), dict(tree_flatten(model.parameters())))
        mx.save_safetensors(str(tmp / "optimizer.safetensors"), dict(tree_flatten(optimizer.state)))
        full_state = {**state, "step": step, "rng": [int(x) for x in mx.random.state[0].tolist()]}
        (tmp / "state.json").write_text(json.dumps(full_state))
        for name in os.listdir(tmp):
            with open(tmp / name, "rb") as fh:
                os.fsync(fh.fileno())
    return PendingCheckpoint(tmp, checkpoints_dir / f"step_{step}", keep, time.perf_counter() - start)


def list_checkpoints(checkpoints_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    if not checkpoints_dir.is_dir():
        return []
    found = []
    for entry in checkpoints_dir.iterdir():
        match = STEP_DIR.match(entry.name)
        if match and (entry / "state.json").is_file():
            found.append((int(match.group(1)), entry))
    return [path for _, path in sorted(found)]


def latest_checkpoint(checkpoints_dir: Path) -> Path | None:
    found = list_checkpoints(checkpoints_dir)
    return found[-1] if found else None


def restore_rng(key: list[int]) -> None:
    """Put MLX's global random key back. `mx.random.state` cannot be assigned to, but `seed(s)` sets the
    key to (s >> 32, s & 0xFFFFFFFF), so seeding with the saved pair restores it exactly."""
    high, low = (int(k) for k in key)
    mx.random.seed((high << 32) | low)


def _check_weights_fit(path: Path, weights: dict[str, mx.array], model: nn.Module) -> None:
    """Every saved array must be a parameter of this model with the same shape, and every trainable
    parameter must be saved: a checkpoint never half-loads into another model."""
    params = dict(tree_flatten(model.parameters()))
    for name, value in weights.items():
        if name not in params:
            raise UserError(f"{path}: the checkpoint holds '{name}', which this model does not have: it was "
                            "saved from another model or adapter layout")
        if tuple(value.shape) != tuple(params[name].shape):
            raise UserError(f"{path}: '{name}' has shape {tuple(value.shape)} in the checkpoint and "
                            f"{tuple(params[name].shape)} in this model: it was saved from another model or "
                            "adapter layout")
    missing = [name for name, _ in tree_flatten(model.trainable_parameters()) if name not in weights]
    if missing:
        raise UserError(f"{path}: the checkpoint has no '{missing[0]}' ({len(missing)} trained arrays missing): it "
                        "was saved from another model or adapter layout")


def read_state(path: Path) -> dict[str, Any]:
    """The trainer state a checkpoint saved (its state.json)."""
    return json.loads((path / "state.json").read_text())


def load_checkpoint(path: Path, model: nn.Module, optimizer: optim.Optimizer) -> dict[str, Any]:
    """Restore weights, optimiser state and the global RNG; return the saved trainer state."""
    try:
        state = read_state(path)
        weights_file = path / ("adapters.safetensors" if (path / "adapters.safetensors").exists()
                               else "model.safetensors")
        weights = mx.load(str(weights_file))
        _check_weights_fit(path, weights, model)
        model.load_weights(list(weights.items()), strict=False)
        optimizer.state = tree_unflatten(list(mx.load(str(path / "optimizer.safetensors")).items()))
        restore_rng(state["rng"])
    except (OSError, ValueError, RuntimeError, KeyError, TypeError) as err:  # RuntimeError: a damaged file;
        # KeyError/TypeError: a state.json that parses but is not ours (no rng, a list...)
        detail = (str(err).splitlines() or [""])[0]
        raise UserError(f"{path}: checkpoint cannot be read ({type(err).__name__}: {detail}); move it aside to "
                        "resume from the one before") from err
    mx.eval(model.parameters(), optimizer.state)
    return state
