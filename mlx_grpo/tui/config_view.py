"""The runs' resolved config, versions and device, as run.json records them.

With several runs, the config keys whose values differ between them come first,
one column per run (the same keys `mlx-grpo compare` lists).
"""

from __future__ import annotations

import time

import yaml
from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from ..telemetry.analysis.compare import differing_keys, run_config, value_text
from .board import Board
from .board_widget import BoardView
from .palette import ACCENT, LABEL, MUTED, TEXT_SOFT


def readable_times(fields: dict) -> dict:
    """run.json's top-level fields with `*_time` Unix timestamps as local date, time and zone."""
    return {key: time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(value))
            if key.endswith("_time") and isinstance(value, (int, float)) and not isinstance(value, bool) else value
            for key, value in fields.items()}


class ConfigView(BoardView, VerticalScroll):
    """Each run's run.json (config, versions, device); with several runs, the keys that differ first."""

    def __init__(self, board: Board, *, id: str | None = None):
        super().__init__(board, id=id)
        self._key: tuple | None = None

    def compose(self):
        """One text block, filled by update_data."""
        yield Static("", id="config-text")

    def update_data(self) -> None:
        """Rebuild the text when the runs or the filter change."""
        board = self.board
        key = (tuple(id(run.info) for run in board.runs), self.filter)
        if key == self._key:
            return
        self._key = key
        parts = [self._differences()] if len(board.runs) > 1 else []
        parts.append(self._dumps())
        self.query_one("#config-text", Static).update(Group(*parts))

    def _differences(self) -> Group:
        """The config keys whose values differ between the runs (that have a run.json), a column per run."""
        board = self.board
        with_info = [(i, run) for i, run in enumerate(board.runs) if run.info is not None]
        configs = [run_config(run.info) for _, run in with_info]
        keys = [k for k in differing_keys(configs) if self.matches(k)] if len(configs) > 1 else []
        title = Text("differences between the runs", style=f"bold {ACCENT}")
        if len(configs) < 2:
            return Group(title, Text("  fewer than two runs have a run.json yet\n", style=MUTED))
        if not keys:
            return Group(title, Text("  none: the runs have the same config\n", style=MUTED))
        table = Table(box=None, header_style=f"bold {LABEL}", padding=(0, 2, 0, 2), expand=False)
        table.add_column("key")
        for i, run in with_info:
            table.add_column(Text(run.name, style=f"bold {board.color(i)}"))
        for k in keys:
            table.add_row(k, *(Text(value_text(c.get(k)), style=board.color(i))
                               for (i, _), c in zip(with_info, configs)))
        return Group(title, table, Text(""))

    def _dumps(self) -> Text:
        """Each run's run.json as YAML, a section per block; lines that do not match the filter are left out."""
        board = self.board
        text = Text()
        for i, run in enumerate(board.runs):
            text.append(f"{run.name}  ", style=f"bold {board.color(i)}")
            text.append(str(run.run_dir) + "\n", style=MUTED)
            info = run.info
            if info is None:
                text.append("  run.json not written yet\n\n")
                continue
            # Its top-level fields (run id, status, times...), then its sections.
            sections = (("run", readable_times(info.run_fields())), ("config", info.config),
                        ("versions", info.versions), ("device", info.device))
            for section, body in sections:
                dumped = yaml.safe_dump({section: body}, sort_keys=False, default_flow_style=False, width=100)
                lines = [ln for ln in dumped.splitlines() if self.matches(ln) or not ln.startswith(" ")]
                for line in lines:
                    key_part, sep, rest = line.partition(":")
                    text.append("  " + key_part, style=ACCENT if not line.startswith(" ") else TEXT_SOFT)
                    text.append(sep + rest + "\n")
            text.append("\n")
        return text
