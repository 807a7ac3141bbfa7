"""The runs' resolved config, versions and device, as run.json records them."""

from __future__ import annotations

import yaml
from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from .board import Board
from .board_widget import BoardView
from .palette import ACCENT, MUTED, TEXT_SOFT

# run.json sections shown after its top-level fields (run id, status, times...).
SECTIONS = ("config", "versions", "device")


class ConfigView(BoardView, VerticalScroll):
    def __init__(self, board: Board, *, id: str | None = None):
        super().__init__(board, id=id)
        self._key: tuple | None = None

    def compose(self):
        yield Static("", id="config-text")

    def update_data(self) -> None:
        board = self.board
        key = (tuple(id(run.info) for run in board.runs), self.filter)
        if key == self._key:
            return
        self._key = key
        text = Text()
        for i, run in enumerate(board.runs):
            text.append(f"{run.name}  ", style=f"bold {board.color(i)}")
            text.append(str(run.run_dir) + "\n", style=MUTED)
            if run.info is None:
                text.append("  run.json not written yet\n\n")
                continue
            top = {k: v for k, v in run.info.items() if k not in SECTIONS}
            for section, body in (("run", top), *((name, run.info.get(name)) for name in SECTIONS)):
                if body is None:
                    continue
                dumped = yaml.safe_dump({section: body}, sort_keys=False, default_flow_style=False, width=100)
                lines = [ln for ln in dumped.splitlines() if self.matches(ln) or not ln.startswith(" ")]
                for line in lines:
                    key_part, sep, rest = line.partition(":")
                    text.append("  " + key_part, style=ACCENT if not line.startswith(" ") else TEXT_SOFT)
                    text.append(sep + rest + "\n")
            text.append("\n")
        self.query_one("#config-text", Static).update(text)
