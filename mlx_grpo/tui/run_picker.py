"""The run browser (`r`): the run directories under the watched runs' folders, to pick which to overlay.

A run directory is one with run.json or metrics.jsonl (as `mlx-grpo watch`
takes it); a folder that is not one is looked into once more (a sweep's
trials). The list is newest first, with what run.json says of each run.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import SelectionList, Static
from textual.widgets.selection_list import Selection

from ..common.user_files import open_regular
from ..telemetry.rundir.layout import RunPaths
from ..telemetry.rundir.reader import is_run_dir
from ..telemetry.rundir.writer import RunInfo, read_run_info
from .fmt import fmt_step
from .palette import MUTED

# Bytes read from the end of metrics.jsonl for a run's last step.
LAST_LINE_BYTES = 8192


@dataclass(frozen=True)
class RunEntry:
    """A run directory as the run browser lists it."""

    path: Path
    name: str
    status: str
    started: float | None
    step: int | None
    total_steps: int | None


def _last_step(path: Path) -> int | None:
    """The step of the last complete record in metrics.jsonl, read from its end."""
    try:
        with open_regular(RunPaths(path).metrics) as f:
            start = max(0, f.seek(0, os.SEEK_END) - LAST_LINE_BYTES)
            f.seek(start)
            lines = f.read().split(b"\n")
    except OSError:
        return None
    for line in reversed(lines[1:] if start else lines):  # a read from the middle starts inside a line
        try:
            step = json.loads(line).get("step")
        except (ValueError, AttributeError, RecursionError):
            continue
        if isinstance(step, int):
            return step
    return None


def read_entry(path: Path) -> RunEntry:
    """The browser's entry for one run directory (a partial run.json gives what it can)."""
    info = read_run_info(path, display=True) or RunInfo()
    return RunEntry(
        path=path,
        name=info.name or path.name,
        status=info.status or "unknown",
        started=None if info.start_time is None else float(info.start_time),
        step=_last_step(path),
        total_steps=info.total_steps,
    )


def _subdirs(folder: Path) -> list[Path]:
    try:
        return sorted(p for p in folder.iterdir() if p.is_dir())
    except OSError:
        return []


def find_runs(roots: list[Path]) -> list[RunEntry]:
    """Run directories directly under each root, or one folder deeper; newest start first."""
    found: dict[Path, Path] = {}
    for root in roots:
        for child in _subdirs(root):
            for path in [child] if is_run_dir(child) else [p for p in _subdirs(child) if is_run_dir(p)]:
                found.setdefault(path.resolve(), path)
    entries = [read_entry(path) for path in found.values()]
    return sorted(entries, key=lambda e: -(e.started or 0.0))


def entry_text(entry: RunEntry) -> Text:
    """One line of the browser: name, state, step, start time and path."""
    started = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.started)) if entry.started else "–"
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(f"{entry.name[:32]:<33}", style="bold")
    text.append(f"{entry.status:<12}{fmt_step(entry.step, entry.total_steps):<28}{started:<18}")
    text.append(str(entry.path), style=MUTED)
    return text


class RunPicker(ModalScreen[list[Path] | None]):
    """Dismissed with the selected run directories, or None when cancelled."""

    BINDINGS = [
        Binding("enter", "apply", "overlay the selected", priority=True),
        Binding("escape", "cancel", "cancel"),
    ]

    def __init__(self, watched: list[Path], roots: list[Path]):
        super().__init__()
        self.roots = roots
        self.entries = find_runs(roots)
        listed = {e.path.resolve() for e in self.entries}
        # A watched run outside the roots, or not written yet, is listed too, so applying keeps it.
        self.entries += [read_entry(p) for p in watched if p.resolve() not in listed]
        chosen = {p.resolve() for p in watched}
        self._selections = [Selection(entry_text(e), i, e.path.resolve() in chosen) for i, e in enumerate(self.entries)]

    def compose(self) -> ComposeResult:
        """A title saying where runs were looked for, and the list of runs to tick."""
        where = ", ".join(f"{root}/" for root in self.roots) or "the watched folders"
        with Vertical(id="picker-box"):
            yield Static(f"Runs under {where}: space selects, enter overlays the selected runs, escape cancels",
                         id="picker-title")
            if self.entries:
                yield SelectionList[int](*self._selections, id="picker-list")
            else:
                yield Static("no run directories found", id="picker-empty")

    def action_apply(self) -> None:
        """Close with the runs ticked."""
        lists = self.query(SelectionList)
        chosen = [self.entries[i].path for i in sorted(lists.first().selected)] if lists else []
        if not chosen:
            self.notify("select at least one run (space)", severity="warning")
            return
        self.dismiss(chosen)

    def action_cancel(self) -> None:
        """Close without changing the watched runs."""
        self.dismiss(None)
