"""The run directory's layout (docs/RUN_DIRECTORY.md): the one module that spells its file names.

`RunPaths(run_dir)` names every file and folder of a run directory; writers, readers, the run, resume,
export and the report all go through it. The plain names (`METRICS`...) are for what keys by file name:
the resume's log positions, a reader's count of unreadable lines. Imports nothing.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

RUN_JSON = "run.json"
METRICS = "metrics.jsonl"
SAMPLES = "samples.jsonl"
ALERTS = "alerts.jsonl"
FINAL_METRICS = "final_metrics.json"
RESERVE = ".reserve"  # space set aside for the last records once the disk is full (rundir/writer.py)
LOCK = ".lock"  # one process per run directory (run_lock.py)
# The per-step names inside the run directory's folders (checkpoint.py writes and reads the checkpoints)
CHECKPOINT_DIR = re.compile(r"step_(\d+)\Z")
COMPLETIONS_FILE = re.compile(r"step_(\d{6,})\.jsonl\.gz\Z")
ENTROPY_FILE = re.compile(r"step_(\d+)\.npz\Z")


def checkpoint_name(step: int | str) -> str:
    """The folder name of the checkpoint of `step` (also its W&B alias); "*" gives every one's glob pattern."""
    return f"step_{step}"


def checkpoint_step(path: Path) -> int | None:
    """The step of a checkpoint folder by its name (None: not a checkpoint's name)."""
    match = CHECKPOINT_DIR.match(path.name)
    return int(match.group(1)) if match else None


def _by_step(folder: Path, name: re.Pattern) -> dict[int, Path]:
    if not folder.is_dir():
        return {}
    found = {int(match.group(1)): p for p in folder.iterdir() if (match := name.match(p.name))}
    return dict(sorted(found.items()))


@dataclass(frozen=True)
class RunPaths:
    """Where each file of one run directory is."""

    root: Path

    def __init__(self, root: str | os.PathLike) -> None:
        object.__setattr__(self, "root", Path(root))

    run_json = property(lambda self: self.root / RUN_JSON)
    metrics = property(lambda self: self.root / METRICS)
    samples = property(lambda self: self.root / SAMPLES)
    alerts = property(lambda self: self.root / ALERTS)
    final_metrics = property(lambda self: self.root / FINAL_METRICS)
    reserve = property(lambda self: self.root / RESERVE)
    lock = property(lambda self: self.root / LOCK)
    completions = property(lambda self: self.root / "completions")  # every completion: step_<NNNNNN>.jsonl.gz
    checkpoints = property(lambda self: self.root / "checkpoints")  # step_<N>/ (checkpoint.py)
    entropy = property(lambda self: self.root / "entropy")  # step_<N>.npz (extras/entropy_dump.py)
    tensorboard = property(lambda self: self.root / "tensorboard")
    report_json = property(lambda self: self.root / "report.json")
    report_md = property(lambda self: self.root / "report.md")
    final_model = property(lambda self: self.root / "final_model")  # with wandb_log_model: the fused policy
    rubric_summary_json = property(lambda self: self.root / "rubric_summary.json")  # with a rubric
    rubric_summary_md = property(lambda self: self.root / "rubric_summary.md")

    def completions_step(self, step: int) -> Path:
        """The file of one step's completions."""
        return self.completions / f"step_{step:06d}.jsonl.gz"

    def entropy_step(self, step: int) -> Path:
        """The entropy dump of one step."""
        return self.entropy / f"step_{step}.npz"

    def checkpoint(self, step: int) -> Path:
        """The checkpoint folder of one step."""
        return self.checkpoints / checkpoint_name(step)

    def completions_files(self) -> dict[int, Path]:
        """Each step's completions file, by step in order."""
        return _by_step(self.completions, COMPLETIONS_FILE)

    def entropy_files(self) -> dict[int, Path]:
        """Each step's entropy dump, by step in order."""
        return _by_step(self.entropy, ENTROPY_FILE)

    def is_run(self) -> bool:
        """Whether the directory holds a run (its run.json, or at least its metrics)."""
        return self.run_json.exists() or self.metrics.exists()
