"""Recent completions: a list (newest at the bottom, like a log) and the selected one with its reward breakdown."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import DataTable, Static

from textual.widget import Widget

from .board import Board
from .board_widget import BoardView
from .fmt import fmt_count, fmt_value
from .palette import BAD, GOOD, MUTED, TEXT_BRIGHT

MAX_ROWS = 300
PREVIEW = 48


def _sample_text(name: str, color: str, s: dict) -> Table:
    """The detail pane: texts first, then one row per reward function."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style=f"bold {MUTED}", no_wrap=True)
    grid.add_column(overflow="fold")
    correct = s.get("correct")
    verdict = Text("correct", style=f"bold {GOOD}") if correct else Text("wrong", style=f"bold {BAD}") \
        if correct is not None else Text("–")
    grid.add_row("run", Text(name, style=color))
    grid.add_row("step", fmt_count(s.get("step", 0)))
    grid.add_row("verdict", verdict)
    grid.add_row("prompt", Text(str(s.get("prompt", ""))))
    grid.add_row("completion", Text(str(s.get("completion", "")), style=TEXT_BRIGHT))
    grid.add_row("answer", Text(str(s.get("answer", ""))))
    grid.add_row("total", fmt_value(s.get("total")))
    grid.add_row("advantage", fmt_value(s.get("advantage")))
    truncated = " (truncated)" if s.get("truncated") else ""
    grid.add_row("length", f"{s.get('length', '–')}{truncated}")
    rewards = s.get("rewards") or {}
    if isinstance(rewards, dict) and rewards:
        table = Table(box=None, show_header=True, header_style=f"bold {MUTED}", padding=(0, 1))
        table.add_column("reward function")
        table.add_column("value", justify="right")
        table.add_column("")
        for fn, value in rewards.items():
            number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
            bar = "█" * max(0, min(20, int(round(abs(number) * 10)))) if number is not None else ""
            table.add_row(str(fn), fmt_value(number), Text(bar, style=GOOD if (number or 0) > 0 else BAD))
        grid.add_row("rewards", table)
    return grid


class SamplesView(BoardView, Horizontal):
    """Recent completions with their rewards; the highlighted one in full beside the table."""

    def __init__(self, board: Board, *, id: str | None = None):
        super().__init__(board, id=id)
        self._filter: str | None = None
        self._runs_version = -1
        self._seen: list[tuple[int, int]] = []  # per run: (resets, received) already listed
        self._rows: dict[str, tuple[int, dict]] = {}
        self._order: list[str] = []
        self._next_key = 0

    @property
    def focus_target(self) -> Widget:
        """The widget that takes the keyboard when the view is shown."""
        return self.query_one("#samples-table", DataTable)

    def compose(self) -> ComposeResult:
        """The samples table and the detail box."""
        yield DataTable(id="samples-table", cursor_type="row", zebra_stripes=True)
        with VerticalScroll(id="sample-detail-box"):
            yield Static("no samples yet", id="sample-detail")

    def on_mount(self) -> None:
        """Add the table's columns."""
        self.query_one(DataTable).add_columns("run", "step", "total", "ok", "len", "completion")

    def update_data(self) -> None:
        """Add the samples the runs wrote since the last refresh."""
        board = self.board
        runs = board.runs
        table = self.query_one(DataTable)
        rebuild = self._filter != self.filter or self._runs_version != board.runs_version or any(
            seen[0] != run.samples_resets for seen, run in zip(self._seen, runs))
        if rebuild:
            table.clear()
            self._rows.clear()
            self._order.clear()
            self._seen = [(run.samples_resets, run.samples_received - len(run.samples)) for run in runs]
            self._filter = self.filter
            self._runs_version = board.runs_version
        following = table.row_count == 0 or table.cursor_row >= table.row_count - 1
        added = False
        for i, run in enumerate(runs):
            resets, seen = self._seen[i]
            fresh = min(run.samples_received - seen, len(run.samples))
            self._seen[i] = (resets, run.samples_received)
            for s in list(run.samples)[len(run.samples) - fresh :]:
                if self.matches(str(s.get("prompt", "")), str(s.get("completion", "")), run.name):
                    self._add_row(table, i, s)
                    added = True
        while len(self._order) > MAX_ROWS:
            oldest = self._order.pop(0)
            table.remove_row(oldest)
            del self._rows[oldest]
        if added and following and table.row_count:
            table.move_cursor(row=table.row_count - 1)
            self._show(table.cursor_row)

    def _add_row(self, table: DataTable, run_index: int, s: dict) -> None:
        board = self.board
        key = str(self._next_key)
        self._next_key += 1
        correct = s.get("correct")
        completion = " ".join(str(s.get("completion", "")).split())
        table.add_row(
            Text(board.runs[run_index].name, style=board.color(run_index)),
            Text(fmt_count(s.get("step", 0)), justify="right"),
            Text(fmt_value(s.get("total")), justify="right"),
            Text("✓", style=GOOD) if correct else Text("✗", style=BAD) if correct is not None else "",
            Text(str(s.get("length", "")), justify="right"),
            completion[:PREVIEW] + ("…" if len(completion) > PREVIEW else ""),
            key=key,
        )
        self._rows[key] = (run_index, s)
        self._order.append(key)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        """Show the highlighted sample in full."""
        self._show(event.cursor_row)

    def _show(self, index: int) -> None:
        if 0 <= index < len(self._order):
            i, s = self._rows[self._order[index]]
            self.query_one("#sample-detail", Static).update(_sample_text(self.board.runs[i].name, self.board.color(i), s))
