"""Continuing a run directory: `mlx-grpo train --resume RUN_DIR`.

The checkpoint itself (weights, optimiser, RNG, data order, the loop's trackers) is loaded by
checkpoint.py and run_state.py; this module decides whether and how a run directory can continue:

- `config_for_resume(run_dir, overrides)`: the run's config from run.json with command-line
  overrides on top (`--num-steps 500` extends a finished run), and the folder relative paths in it
  were resolved against.
- `resumable_checkpoint(run_dir, num_steps)`: the latest complete checkpoint (None: start over),
  after refusing a run that another live process is still writing, a run that already did all its
  steps, and a checkpoint beyond `num_steps`; removes half-written checkpoint directories.
- `log_positions(run_dir)` / `truncate_logs(run_dir, positions)`: the byte length of every JSONL
  log at a checkpoint, and cutting the logs back to it on resume. A log the checkpoint does not
  know (it appeared later) is emptied. The cut removes every record written after the checkpoint,
  so no step appears twice, and with them a torn last line.
- `last_record(run_dir)`: the last metrics.jsonl record (after the cut).
- `resume_command(run_dir)`: the exact command to continue a run.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from pathlib import Path
from typing import Any

import psutil

from ..checkpoint import DamagedCheckpoint, latest_checkpoint, read_state, remove_unfinished
from ..common.errors import UserError
from ..config.train_config import TrainConfig, config_from_mapping, top_level_fields
from ..config.typed_yaml import nest
from ..telemetry.rundir.layout import ALERTS, METRICS, SAMPLES, RunPaths, checkpoint_step
from ..telemetry.rundir.writer import RunInfo, loads_object, read_run_info


def resume_command(run_dir: Path) -> str:
    return f"mlx-grpo train --resume {shlex.quote(str(run_dir))}"


def saved_run_info(run_dir: Path) -> RunInfo:
    """run.json of a run to resume; UserError unless it is readable and has the run's config."""
    info = read_run_info(run_dir)
    if info is None:
        raise UserError(f"{run_dir}: not a run directory (no readable run.json)")
    if not info.config:
        raise UserError(f"{run_dir}/run.json: no 'config' mapping; is this a run directory?")
    return info


def _flatten(config: dict) -> dict[str, Any]:
    """Config sections (`adaptive_window: {...}`) as `section.key` entries, so an override of one
    key of a section keeps the section's other saved keys."""
    sections = {f.name for f in dataclasses.fields(TrainConfig)} - set(top_level_fields())
    out: dict[str, Any] = {}
    for key, value in config.items():
        if key in sections and isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            out[key] = value
    return out


# Keys that decide which weights a checkpoint holds: a resume cannot change them.
MODEL_KEYS = ("model_id", "dtype", "use_lora", "use_dora")


def _changes_the_model(key: str) -> bool:
    return key in MODEL_KEYS or key.startswith("lora_")


def config_for_resume(run_dir: Path, overrides: dict[str, Any]) -> tuple[TrainConfig, Path]:
    """(config, base_dir) of a run directory: run.json's config, then `overrides`. An override that would
    change the model the checkpoints belong to is refused."""
    saved = dict(saved_run_info(run_dir).config)
    for key, value in overrides.items():
        if key in ("run_name", "monitoring_dir") and saved.get(key) != value:
            raise UserError(f"--resume {run_dir}: '{key}' cannot change on resume: the run stays in {run_dir}")
        if _changes_the_model(key) and saved.get(key) != value:
            raise UserError(f"--resume {run_dir}: '{key}' cannot change on resume ({saved.get(key)!r} -> {value!r}): "
                            f"the checkpoints hold that model's weights. To start a new run from them: mlx-grpo "
                            f"export {run_dir} --out DIR, then train with model_id: DIR")
    # The trainer stores where relative paths (model, dataset, reward files) were resolved from.
    base_dir = Path(saved.pop("base_dir", None) or Path.cwd())
    return config_from_mapping(nest(_flatten(saved)), str(RunPaths(run_dir).run_json), overrides), base_dir


def _still_running(info: RunInfo) -> int | None:
    """The pid of a live process that is still writing this run, else None.

    A pid alone can be reused after a crash; the process must also have started before the
    session that wrote run.json did.
    """
    pid = info.pid
    if info.status != "running" or pid is None or pid == psutil.Process().pid:
        return None
    try:
        created = psutil.Process(pid).create_time()
    except psutil.Error:
        return None
    started = info.last_session_start
    return pid if started is not None and created <= started + 1.0 else None


def resumable_checkpoint(run_dir: Path, num_steps: int) -> Path | None:
    info = saved_run_info(run_dir)
    pid = _still_running(info)
    if pid is not None:
        raise UserError(f"{run_dir}: this run is still being trained by process {pid}; stop it first")
    checkpoints = RunPaths(run_dir).checkpoints
    if checkpoints.is_dir():
        remove_unfinished(checkpoints)
        for entry in checkpoints.iterdir():  # a file in place of step_N would end the run when it saves N
            if checkpoint_step(entry) is not None and (entry.is_symlink() or not entry.is_dir()):
                raise DamagedCheckpoint(entry, "a symbolic link: a checkpoint is read only where it was written"
                                        if entry.is_symlink() else "not a directory")
    latest = latest_checkpoint(checkpoints)
    if latest is None:
        return None
    read_state(latest, run_dir)  # verified before anything loads: the resume reads its fields as they are
    step = checkpoint_step(latest)
    if step > num_steps:
        raise UserError(f"{run_dir}: its last checkpoint is at step {step}, beyond num_steps {num_steps}; "
                        f"resume with --num-steps {step} or more")
    if step == num_steps and info.status == "finished":
        raise UserError(f"{run_dir}: the run already finished its {num_steps} steps; to train further, "
                        f"{resume_command(run_dir)} --num-steps <more than {num_steps}>")
    return latest


# The run-directory logs the trainer appends to: a resume cuts these back, and never any other file.
TRAINER_LOGS = (METRICS, SAMPLES, ALERTS)


def log_positions(run_dir: Path) -> dict[str, int]:
    """Where each of the trainer's logs ends, saved with a checkpoint."""
    return {name: (run_dir / name).stat().st_size for name in TRAINER_LOGS if (run_dir / name).is_file()}


def truncate_logs(run_dir: Path, positions: dict[str, int] | None, step: int) -> None:
    """Cut the trainer's logs back to the checkpoint of `step`: at the positions it saved (a log it did
    not list did not exist yet), or, for a checkpoint saved without them, before the first record of a
    later step. Files the trainer does not write are never touched."""
    for name in TRAINER_LOGS:
        path = run_dir / name
        if not path.is_file():
            continue
        keep = positions.get(name, 0) if positions is not None else _end_of_step(path, step)
        if path.stat().st_size > keep:
            with open(path, "r+b") as fh:
                fh.truncate(keep)


def _end_of_step(path: Path, step: int) -> int:
    """Byte offset of the first line that is not a whole record of `step` or earlier."""
    offset = 0
    with open(path, "rb") as fh:
        for line in fh:
            record = loads_object(line) if line.endswith(b"\n") else None
            record_step = record.get("step") if record is not None else None
            if not isinstance(record_step, int) or record_step > step:
                break
            offset += len(line)
    return offset


LAST_RECORD_BYTES = 16 << 20


def last_record(run_dir: Path) -> dict[str, Any]:
    """The last whole line of metrics.jsonl as a dict ({} when there is none)."""
    path = RunPaths(run_dir).metrics
    if not path.is_file():
        return {}
    with open(path, "rb") as fh:  # only its end: a file of one endless line must not fill the memory
        start = max(0, fh.seek(0, os.SEEK_END) - LAST_RECORD_BYTES)
        fh.seek(start)
        lines = fh.read().split(b"\n")[1 if start else 0:-1]  # whole lines only
    last = next((line for line in reversed(lines) if line.strip()), b"")
    return (loads_object(last) if last else None) or {}
