"""Recent completions: a list on the left, the selected one with its reward breakdown on the right."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import DataTable, Static

from .board import Board
from .fmt import fmt_value

MAX_ROWS = 300
PREVIEW = 48


def _sample_text(name: str, color: str, s: dict) -> Table:
    """The detail pane: texts first, then one row per reward function."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold #8a8a8a", no_wrap=True)
    grid.add_column(overflow="fold")
    correct = s.get("correct")
    verdict = Text("correct", style="bold #7bd88f") if correct else Text("wrong", style="bold #ff5555") \
        if correct is not None else Text("–")
    grid.add_row("run", Text(name, style=color))
    grid.add_row("step", f"{s.get('step', 0):,}")
    grid.add_row("verdict", verdict)
    grid.add_row("prompt", Text(str(s.get("prompt", ""))))
    grid.add_row("completion", Text(str(s.get("completion", "")), style="#e0e0e0"))
    grid.add_row("answer", Text(str(s.get("answer", ""))))
    grid.add_row("total", fmt_value(s.get("total")))
    grid.add_row("advantage", fmt_value(s.get("advantage")))
    truncated = " (truncated)" if s.get("truncated") else ""
    grid.add_row("length", f"{s.get('length', '–')}{truncated}")
    rewards = s.get("rewards") or {}
    if isinstance(rewards, dict) and rewards:
        table = Table(box=None, show_header=True, header_style="bold #8a8a8a", padding=(0, 1))
        table.add_column("reward function")
        table.add_column("value", justify="right")
        table.add_column("")
        for fn, value in rewards.items():
            bar = ""
            if isinstance(value, (int, float)):
                bar = "█" * max(0, min(20, int(round(abs(value) * 10))))
            table.add_row(str(fn), fmt_value(value if isinstance(value, (int, float)) else None),
                          Text(bar, style="#7bd88f" if isinstance(value, (int, float)) and value > 0 else "#ff5555"))
        grid.add_row("rewards", table)
    return grid


class SamplesView(Horizontal):
    def __init__(self, *, id: str | None = None):
        super().__init__(id=id)
        self._key: tuple | None = None
        self._rows: list[tuple[int, dict]] = []

    @property
    def board(self) -> Board:
        return self.app.board  # type: ignore[attr-defined]

    def compose(self) -> ComposeResult:
        yield DataTable(id="samples-table", cursor_type="row", zebra_stripes=True)
        with VerticalScroll(id="sample-detail-box"):
            yield Static("no samples yet", id="sample-detail")

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns("run", "step", "total", "ok", "len", "completion")

    def update_data(self) -> None:
        board = self.board
        key = (board.generation, board.filter)
        if key == self._key:
            return
        self._key = key
        rows = []
        for i, run in enumerate(board.runs):
            for s in run.samples:
                if board.matches_filter(str(s.get("prompt", "")), str(s.get("completion", "")), run.name):
                    rows.append((i, s))
        rows.sort(key=lambda r: (r[1].get("step", 0), r[1].get("time") or 0.0), reverse=True)
        rows = rows[:MAX_ROWS]
        table = self.query_one(DataTable)
        cursor = table.cursor_row
        self._rows = rows
        table.clear()
        for i, s in rows:
            correct = s.get("correct")
            completion = " ".join(str(s.get("completion", "")).split())
            table.add_row(
                Text(board.runs[i].name, style=board.color(i)),
                Text(f"{s.get('step', 0):,}", justify="right"),
                Text(fmt_value(s.get("total")), justify="right"),
                Text("✓", style="#7bd88f") if correct else Text("✗", style="#ff5555") if correct is not None else "",
                Text(str(s.get("length", "")), justify="right"),
                completion[:PREVIEW] + ("…" if len(completion) > PREVIEW else ""),
            )
        if rows:
            table.move_cursor(row=min(max(cursor, 0), len(rows) - 1))
            self._show(table.cursor_row)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show(event.cursor_row)

    def _show(self, index: int) -> None:
        if 0 <= index < len(self._rows):
            i, s = self._rows[index]
            self.query_one("#sample-detail", Static).update(_sample_text(self.board.runs[i].name, self.board.color(i), s))
