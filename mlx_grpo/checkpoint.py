"""Checkpoints that let a run continue exactly: weights or adapters, optimiser, step, RNG, data order.

Layout of `<run dir>/checkpoints/step_<N>/`:
- `adapters.safetensors` + `adapter_config.json` (LoRA/DoRA; loadable by mlx-lm's `--adapter-path`)
  or `model.safetensors` (full fine-tuning: every weight)
- `optimizer.safetensors`: the optimiser state (AdamW moments and its step counter)
- `state.json`: step, data order position, MLX's global random key, the run id, the config (no
  secrets), the run's recorder state (`run_state`, see telemetry/recorder.py) and the byte length of each
  run-directory JSONL log at the moment of the checkpoint (resume cuts the logs back to it)
- `checksums.json`, written last: the size and SHA-256 of every other file

A checkpoint is written into a temporary directory and renamed into place, so a
crash mid-write never leaves a half checkpoint that looks complete. A checkpoint verifies itself on
load: every file against its checksum (opened as a regular file only: a FIFO would block), state.json
against its schema (`read_state`), every weight and optimiser value finite. Any failure is one line,
`DamagedCheckpoint`, naming the checkpoint to move aside.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shlex
import shutil
import stat
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
from .common.user_files import open_regular
from .telemetry.alerts.remedy import Remedy
from .telemetry.rundir.layout import checkpoint_name, checkpoint_step
from .telemetry.rundir.writer import loads_object

STATE = "state.json"
ADAPTERS = "adapters.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
FULL_WEIGHTS = "model.safetensors"
OPTIMIZER = "optimizer.safetensors"
CHECKSUMS = "checksums.json"
STATE_LIMIT = 64 << 20  # state.json holds the config and the recorder's trackers: a few hundred KB
CHECKSUM_FORMAT = 1  # state.json's `checksums`: the checksums.json format (informative: every checkpoint is verified)


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
    spare: str | None = None  # a checkpoint never pruned: the run's best held-out evaluation

    def commit(self, extra_state: dict[str, Any]) -> Path:
        """Add `extra_state` to its state.json and move it into place; prune old checkpoints."""
        state_path = self.tmp / STATE
        with _written_or_removed(self.tmp, self.final):
            state = {**json.loads(state_path.read_text()), **extra_state}
            _write_synced(state_path, json.dumps(state))
            _write_synced(self.tmp / CHECKSUMS, json.dumps(file_checksums(self.tmp)))
            _fsync_dir(self.tmp)
            if self.final.is_symlink() or (self.final.exists() and not self.final.is_dir()):
                # not a checkpoint of ours (nothing we write): kept beside it, never overwritten
                os.replace(self.final, self.final.with_name(self.final.name + ".not-a-checkpoint"))
            shutil.rmtree(self.final, ignore_errors=True)
            os.replace(self.tmp, self.final)
        _fsync_dir(self.final.parent)
        for old in list_checkpoints(self.final.parent)[:-self.keep]:
            if old.name != self.spare:
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
        kept = ("the last complete checkpoint is untouched" if list_checkpoints(final.parent)
                else "there is no earlier checkpoint, so a resume starts over")
        raise UserError(f"writing checkpoint {final.name} failed ({detail}); {kept}: free some space, then continue "
                        f"with mlx-grpo train --resume {shlex.quote(str(run_dir))}") from None


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
    spare: str | None = None,
) -> PendingCheckpoint:
    """Write weights (or adapters), optimiser and `state` into `.step_<N>.tmp`; `commit` puts it in place.

    Two phases so the loop can time the checkpoint in the step's own record and store the logs'
    lengths after that record: a crash before the commit leaves only the previous checkpoint.
    """
    start = time.perf_counter()
    tmp = checkpoints_dir / _unfinished(step)
    with _written_or_removed(tmp, checkpoints_dir / checkpoint_name(step)):
        checkpoints_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        if adapter_config is not None:
            mx.save_safetensors(str(tmp / ADAPTERS), dict(tree_flatten(model.trainable_parameters())))
            (tmp / ADAPTER_CONFIG).write_text(json.dumps(adapter_config, indent=2))
        else:
            mx.save_safetensors(str(tmp / FULL_WEIGHTS), dict(tree_flatten(model.parameters())))
        mx.save_safetensors(str(tmp / OPTIMIZER), dict(tree_flatten(optimizer.state)))
        full_state = {**state, "step": step, "rng": [int(x) for x in mx.random.state[0].tolist()],
                      "checksums": CHECKSUM_FORMAT}
        (tmp / STATE).write_text(json.dumps(full_state))
        for name in os.listdir(tmp):
            with open(tmp / name, "rb") as fh:
                os.fsync(fh.fileno())
    return PendingCheckpoint(tmp, checkpoints_dir / checkpoint_name(step), keep, time.perf_counter() - start, spare)


def _unfinished(step: int | str) -> str:
    """The folder a checkpoint is written into before its commit ("*": every one's glob pattern)."""
    return f".{checkpoint_name(step)}.tmp"


def remove_unfinished(checkpoints_dir: Path) -> None:
    """Remove the checkpoints a crash cut short (never committed)."""
    for tmp in checkpoints_dir.glob(_unfinished("*")):
        shutil.rmtree(tmp, ignore_errors=True)


def list_checkpoints(checkpoints_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    if not checkpoints_dir.is_dir():
        return []
    found = []
    for entry in checkpoints_dir.iterdir():
        step = checkpoint_step(entry)
        if step is not None and (entry / STATE).is_file():
            found.append((step, entry))
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


class DamagedCheckpoint(UserError):
    """A checkpoint that fails its own checks: one line naming it and how to move it aside."""

    def __init__(self, path: Path, detail: str):
        aside = path.with_name(f"damaged_{path.name}")
        super().__init__(f"{path}: checkpoint is damaged ({detail}); move it aside to resume from the one before: "
                         f"mv {shlex.quote(str(path))} {shlex.quote(str(aside))}")


def file_checksums(directory: Path) -> dict[str, Any]:
    """{name: {"bytes", "sha256"}} of every file of a checkpoint directory but checksums.json itself."""
    return {"files": {name: {"bytes": (directory / name).stat().st_size, "sha256": _sha256(directory / name)}
                      for name in sorted(os.listdir(directory)) if name != CHECKSUMS}}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open_regular(path) as fh:
        while chunk := fh.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _read_json(path: Path, what: str) -> dict[str, Any]:
    """A checkpoint's JSON file as an object: a regular file, bounded, UTF-8, an object; else DamagedCheckpoint."""
    try:
        with open_regular(path / what) as fh:
            data = fh.read(STATE_LIMIT + 1)
    except OSError as err:
        raise DamagedCheckpoint(path, f"{what}: {err.strerror or err}") from None
    obj = loads_object(data) if len(data) <= STATE_LIMIT else None
    if obj is None:
        raise DamagedCheckpoint(path, f"{what} is not a JSON object" +
                                (f" of at most {STATE_LIMIT >> 20} MB" if len(data) > STATE_LIMIT else ""))
    return obj


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _number(value: Any) -> bool:
    try:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    except OverflowError:  # an int beyond float's range
        return False


# run_state keys the recorder restores, and the type each must have (telemetry/recorder.py state_dict)
RUN_STATE_KEYS = {"rewards": dict, "throughput": dict, "alerts": dict, "reward_errors_reported": list,
                  "reward_functions": dict, "nonfinite_in_a_row": int, "elapsed_s": (int, float)}


def _schema_problem(state: dict[str, Any], step: int, run_dir: Path | None) -> str | None:
    """What is wrong with a state.json (None: nothing): its step is its directory's, every field the
    resume reads is there with its type, the log positions lie within the logs."""
    if state.get("step") != step or not _whole(state.get("step")):
        return f"state.json says step {str(state.get('step'))[:40]} in the directory of step {step}"
    rng = state.get("rng")
    if not (isinstance(rng, list) and len(rng) == 2 and all(_whole(k) and k < 2**32 for k in rng)):
        return "state.json 'rng' is not two 32-bit numbers"
    order = state.get("order")
    if not (isinstance(order, dict) and _whole(order.get("epoch")) and _whole(order.get("position"))):
        return "state.json 'order' is not {epoch, position} as whole numbers"
    run_state = state.get("run_state", {})
    if not isinstance(run_state, dict):
        return "state.json 'run_state' is not an object"
    if run_state:
        for key, kind in RUN_STATE_KEYS.items():
            value = run_state.get(key)
            valid = isinstance(value, kind) and not isinstance(value, bool)
            if not valid or (kind not in (dict, list) and not _number(value)):
                return f"state.json 'run_state' has no valid '{key}'"
    try:
        Remedy.from_state(state.get("remedy", {}))
    except ValueError as err:
        return f"state.json 'remedy' is {err}"
    for key in ("rollbacks", "world_size"):
        if key in state and not _whole(state[key]):
            return f"state.json '{key}' is not a whole number"
    positions = state.get("log_positions")
    if positions is not None:
        if not isinstance(positions, dict) or not all(_whole(v) for v in positions.values()):
            return "state.json 'log_positions' is not an object of byte counts"
        for name, position in positions.items():
            log = run_dir / name if run_dir is not None else None
            if log is not None and log.is_file() and position > log.stat().st_size:
                return f"state.json puts the end of {name} at byte {position}, beyond its {log.stat().st_size} bytes"
    return None


def read_state(path: Path, run_dir: Path | None = None) -> dict[str, Any]:
    """A checkpoint's state.json, verified: its checksum (checksums.json missing or unreadable: damaged), then its
    schema (`run_dir`: where its log positions point, checked against the logs). DamagedCheckpoint otherwise."""
    step = checkpoint_step(path)
    if step is None or path.is_symlink() or not path.is_dir():
        raise DamagedCheckpoint(path, "a symbolic link: a checkpoint is read only where it was written"
                                if path.is_symlink() else "not a checkpoint directory")
    # always verified: nothing inside the checkpoint (a state.json key, a missing checksums.json) can turn
    # the check off, since damage or an edit could then pass unseen
    _verify_file(path, STATE, _read_checksums(path))
    state = _read_json(path, STATE)
    problem = _schema_problem(state, step, run_dir)
    if problem is not None:
        raise DamagedCheckpoint(path, problem)
    return state


def _read_checksums(path: Path) -> dict[str, Any]:
    files = _read_json(path, CHECKSUMS).get("files")
    if not isinstance(files, dict) or not all(isinstance(v, dict) for v in files.values()):
        raise DamagedCheckpoint(path, f"{CHECKSUMS} has no 'files'")
    return files


def _verify_file(path: Path, name: str, checksums: dict[str, Any]) -> None:
    """One file against its recorded size and SHA-256 (a regular file only: a FIFO would block)."""
    expected = checksums.get(name)
    if expected is None:
        raise DamagedCheckpoint(path, f"{name} is not in {CHECKSUMS}")
    try:
        info = os.lstat(path / name)
        if not stat.S_ISREG(info.st_mode):
            raise DamagedCheckpoint(path, f"{name} is not a regular file")
        if info.st_size != expected.get("bytes"):
            raise DamagedCheckpoint(path, f"{name} has {info.st_size} bytes, {expected.get('bytes')} were written")
        if _sha256(path / name) != expected.get("sha256"):
            raise DamagedCheckpoint(path, f"{name} does not match its checksum "
                                          "(its bytes changed after it was written)")
    except OSError as err:
        raise DamagedCheckpoint(path, f"{name}: {err.strerror or err}") from None


def _load_arrays(path: Path, name: str, checksums: dict[str, Any]) -> dict[str, mx.array]:
    """A checkpoint's safetensors file, verified against its checksum, every floating value finite."""
    _verify_file(path, name, checksums)
    arrays = mx.load(str(path / name))
    for key, value in arrays.items():
        if mx.issubdtype(value.dtype, mx.floating) and not bool(mx.all(mx.isfinite(value))):
            raise DamagedCheckpoint(path, f"{name}: '{key}' holds NaN or Inf, which training never saves")
    return arrays


def weights_name(path: Path) -> str:
    """The checkpoint's weights file: its adapters (LoRA, DoRA) or every weight (full fine-tuning)."""
    return ADAPTERS if (path / ADAPTERS).exists() else FULL_WEIGHTS


def load_checkpoint(path: Path, model: nn.Module, optimizer: optim.Optimizer) -> dict[str, Any]:
    """Restore weights, optimiser state and the global RNG from a verified checkpoint; return the saved
    trainer state."""
    state = read_state(path)
    checksums = _read_checksums(path)
    try:
        weights = _load_arrays(path, weights_name(path), checksums)
        _check_weights_fit(path, weights, model)
        model.load_weights(list(weights.items()), strict=False)
        optimizer.state = tree_unflatten(list(_load_arrays(path, OPTIMIZER, checksums).items()))
        restore_rng(state["rng"])
    except (OSError, ValueError, RuntimeError, KeyError, TypeError) as err:  # RuntimeError: a damaged file
        detail = (str(err).splitlines() or [""])[0]
        raise DamagedCheckpoint(path, f"cannot be read: {type(err).__name__}: {detail}") from err
    mx.eval(model.parameters(), optimizer.state)
    return state
