"""The run directory's layout (docs/RUN_DIRECTORY.md): the one module that spells its file names.

`RunPaths(run_dir)` names every file and folder of a run directory; writers, readers, the run, resume,
export and the report all go through it. The plain names (`METRICS`...) are for what keys by file name:
the resume's log positions, a reader's count of unreadable lines. Imports nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

RUN_JSON = "run.json"
METRICS = "metrics.jsonl"
SAMPLES = "samples.jsonl"
ALERTS = "alerts.jsonl"
FINAL_METRICS = "final_metrics.json"
RESERVE = ".reserve"  # space set aside for the last records once the disk is full (rundir/writer.py)
LOCK = ".lock"  # one process per run directory (run_lock.py)


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

    def is_run(self) -> bool:
        """Whether the directory holds a run (its run.json, or at least its metrics)."""
        return self.run_json.exists() or self.metrics.exists()
