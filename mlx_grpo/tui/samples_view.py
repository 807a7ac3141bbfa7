"""Recent completions: a list (newest at the bottom, like a log) and the selected one with its reward breakdown,
then its group (the G completions of the same prompt at that step side by side) and the run's reward heatmap
(step x example, the last steps), both from the run's completions/."""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.widget import Widget
from textual.widgets import DataTable, Static

from ..telemetry.metrics.charts import scale_colour
from ..telemetry.rundir.completions import completion_steps, groups, heatmap_matrix, ordered_totals, read_step
from .board import Board
from .board_widget import BoardView
from .fmt import fmt_count, fmt_value
from .palette import BAD, GOOD, MUTED, TEXT_BRIGHT

MAX_ROWS = 300
PREVIEW = 24  # the list fits beside the detail pane (which shows every text in full)
MIN_PREVIEW = 10  # the completion's end never narrower than this: it holds the answer
PROMPT_PREVIEW = 20
ANSWER_PREVIEW = 16  # the expected column is as wide as its widest answer, up to this
# step, total and ok: their widths in the list, to size the completion column to what is left
LEADING_WIDTHS = (5, 7, 2)


_CLOSING_TAGS = re.compile(r"(\s*</[\w-]+>)+\s*$")


def _end(completion: str, width: int) -> str:
    """The end of a completion, where its answer is, without the closing tags that would fill the column."""
    return _preview(_CLOSING_TAGS.sub("", " ".join(completion.split())), width, keep_end=True)


def _preview(text: str, width: int, keep_end: bool = False) -> str:
    """One line of at most `width` characters, cut at the end (or, `keep_end`, at the start)."""
    if len(text) <= width:
        return text
    return "…" + text[-(width - 1):] if keep_end else text[: width - 1] + "…"


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
    turns = s.get("turns")
    if isinstance(turns, list) and turns:  # a multi-turn trajectory, turn by turn, the tools' answers marked
        for turn in turns:
            turn = turn if isinstance(turn, dict) else {}
            mine = turn.get("role") == "assistant"
            grid.add_row("model" if mine else "tool/env", Text(str(turn.get("text", "")).strip(),
                                                               style=TEXT_BRIGHT if mine else f"italic {MUTED}"))
    else:
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


def _short(name: str) -> str:
    return name if len(name) <= 8 else name[:7] + "…"


def group_table(group: list[dict], selected: dict) -> Table:
    """The G completions of one prompt: reward per function, total, advantage and verdict, side by side
    (one row each, the selected one marked), ranked as GRPO ranks them: by advantage."""
    names = list(dict.fromkeys(fn for row in group if isinstance(row.get("rewards"), dict) for fn in row["rewards"]))
    table = Table(box=None, show_header=True, header_style=f"bold {MUTED}", padding=(0, 1),
                  title=f"its group: {len(group)} completions of this prompt", title_justify="left",
                  title_style=f"bold {MUTED}")
    table.add_column("#", justify="right")
    for fn in names:
        table.add_column(_short(fn), justify="right")
    table.add_column("total", justify="right")
    table.add_column("adv", justify="right")
    table.add_column("ok")
    table.add_column("completion", overflow="ellipsis", no_wrap=True, max_width=PREVIEW)
    ranked = sorted(group, key=lambda r: -(r.get("advantage") if isinstance(r.get("advantage"), (int, float))
                                           else float("-inf")))
    for row in ranked:
        # samples.jsonl rows written before they carried it were each group's first completion
        mine = row.get("completion_index") == selected.get("completion_index", 0)
        rewards = row.get("rewards") if isinstance(row.get("rewards"), dict) else {}
        advantage = row.get("advantage")
        correct = row.get("correct")
        table.add_row(
            Text(f"{'▶' if mine else ''}{row.get('completion_index', '')}",
                 style=f"bold {TEXT_BRIGHT}" if mine else ""),
            *(fmt_value(rewards.get(fn)) for fn in names),
            fmt_value(row.get("total")),
            Text(fmt_value(advantage), style=GOOD if isinstance(advantage, (int, float)) and advantage > 0 else BAD),
            Text("✓", style=GOOD) if correct else Text("✗", style=BAD) if correct is not None else "",
            # its end: where the answer is, the part that differs between the G completions
            _end(str(row.get("completion", "")), PREVIEW))
    return table


def sample_group(run_dir, s: dict, cache: dict) -> list[dict]:
    """The group of sample `s` in its step's completions file, by (step, prompt_index); [] when the run kept
    no completions."""
    step = s.get("step")
    if not isinstance(step, int):
        return []
    key = (str(run_dir), step)
    if key not in cache:
        cache.clear()  # one step at a time: moving along the list reads each file once
        cache[key] = groups(read_step(run_dir, step, display=True))
    index = s.get("prompt_index")
    return cache[key].get(index, []) if isinstance(index, int) else []


HEATMAP_STEPS, HEATMAP_LINES = 40, 8  # columns (the last steps) and text lines (two cells each)


def heatmap_text(matrix: np.ndarray, lines: int = HEATMAP_LINES) -> Text:
    """matrix[example, step] as coloured half-blocks: a column per step, the examples averaged into
    2 x `lines` bands (best first at the top); grey where a step has no value."""
    finite = matrix[np.isfinite(matrix)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    span = hi - lo if hi > lo else 1.0
    bands = np.array_split(np.arange(matrix.shape[0]), 2 * lines)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a band of NaN (mean of nothing): drawn grey
        rows = np.array([np.nanmean(matrix[band], axis=0) if len(band) else np.full(matrix.shape[1], np.nan)
                         for band in bands])
    text = Text()
    for line in range(lines):
        for top, bottom in zip(rows[2 * line], rows[2 * line + 1]):
            text.append("▀", style=f"{scale_colour((top - lo) / span if math.isfinite(top) else math.nan)} on "
                                   f"{scale_colour((bottom - lo) / span if math.isfinite(bottom) else math.nan)}")
        text.append("\n")
    text.append(f"total reward {lo:.3g} ", style=MUTED)
    for k in range(10):
        text.append("█", style=scale_colour(k / 9))
    text.append(f" {hi:.3g}", style=MUTED)
    return text


def run_heatmap(run_dir, cache: dict) -> tuple[list[int], np.ndarray]:
    """The last HEATMAP_STEPS kept steps of a run, step x example; a step's file is read once (written whole,
    it never changes)."""
    steps = completion_steps(run_dir)[-HEATMAP_STEPS:]
    for step in steps:
        if (str(run_dir), step) not in cache:
            cache[(str(run_dir), step)] = ordered_totals(read_step(run_dir, step))
    return steps, heatmap_matrix([cache[(str(run_dir), step)] for step in steps])


class SamplesTable(DataTable):
    """The samples list. It says when its width changes: the completion column follows the width, and the view's
    own resize can come before the list is laid out (the list still 0 wide), which left the narrow fallback."""

    class Resized(Message):
        """The list has a new size."""

    def on_resize(self) -> None:
        self.post_message(self.Resized())


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
        self._groups: dict = {}  # (run dir, step) -> that step's completions by prompt
        self._columns: dict = {}  # (run dir, step) -> that step's totals in the heatmap's order
        self._shape: tuple = (-1, 0, PREVIEW, False)  # the list's layout (_layout) its rows were made for

    @property
    def focus_target(self) -> Widget:
        """The widget that takes the keyboard when the view is shown."""
        return self.query_one("#samples-table", DataTable)

    def compose(self) -> ComposeResult:
        """The samples table and the detail box."""
        yield SamplesTable(id="samples-table", cursor_type="row", zebra_stripes=True)
        with VerticalScroll(id="sample-detail-box"):
            yield Static("no samples yet", id="sample-detail")

    def on_samples_table_resized(self) -> None:
        """The completion column follows the list's width: laid out again at the new size."""
        self.update_data()

    def _layout(self, table: DataTable) -> tuple[int, int, int, bool]:
        """(the list's width, the expected column's, the completion column's, whether a run column is shown):
        the expected answer whole (up to ANSWER_PREVIEW), the completion's end in the width left beside it, and
        the run's name only when several runs are shown."""
        answers = [len(str(s.get("answer", ""))) for run in self.board.runs for s in run.samples]
        answer_width = max(len("expected"), min(ANSWER_PREVIEW, max(answers, default=0)))
        width = table.size.width
        padding = 2 * table.cell_padding  # each column's
        left = width - sum(LEADING_WIDTHS) - answer_width - 5 * padding - 2  # the vertical scrollbar
        preview = max(MIN_PREVIEW, min(PREVIEW * 2, left)) if width else PREVIEW
        return width, answer_width, preview, len(self.board.runs) > 1

    def update_data(self) -> None:
        """Add the samples the runs wrote since the last refresh."""
        board = self.board
        runs = board.runs
        table = self.query_one(DataTable)
        layout = self._layout(table)
        rebuild = self._filter != self.filter or self._runs_version != board.runs_version or any(
            seen[0] != run.samples_resets for seen, run in zip(self._seen, runs)) or layout[:2] != self._shape[:2] \
            or layout[3] != self._shape[3]
        if rebuild:
            self._shape = layout
            table.clear(columns=True)
            table.add_columns("step", "total", "ok", "completion (its end)", "expected", "prompt", "len",
                              *(["run"] if layout[3] else []))  # answer and scores first: they fit a narrow list
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
            # again once the new rows are laid out: a scroll computed before a scrollbar appears hides the last row
            # (moving to the row it is on would not scroll: go to the end, as a log does)
            table.call_after_refresh(table.scroll_end, animate=False)
            self._show(table.cursor_row)

    def _add_row(self, table: DataTable, run_index: int, s: dict) -> None:
        board = self.board
        key = str(self._next_key)
        self._next_key += 1
        correct = s.get("correct")
        completion = " ".join(str(s.get("completion", "")).split())
        prompt = " ".join(str(s.get("prompt", "")).split())
        _, answer_width, preview, several = self._shape
        table.add_row(
            Text(fmt_count(s.get("step", 0)), justify="right"),
            Text(fmt_value(s.get("total")), justify="right"),
            Text("✓", style=GOOD) if correct else Text("✗", style=BAD) if correct is not None else "",
            _end(completion, preview),  # the answer is at the end; the detail pane shows it all
            _preview(str(s.get("answer", "")), answer_width),
            _preview(prompt, PROMPT_PREVIEW, keep_end=True),  # a prompt's question is at its end
            Text(str(s.get("length", "")), justify="right"),
            *([Text(board.runs[run_index].name, style=board.color(run_index))] if several else []),
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
            run = self.board.runs[i]
            detail: list = [_sample_text(run.name, self.board.color(i), s)]
            if group := sample_group(run.run_dir, s, self._groups):
                detail += [Text(""), group_table(group, s)]
            steps, matrix = run_heatmap(run.run_dir, self._columns)
            if len(steps) >= 2 and matrix.size:
                detail += [Text(""), Text(f"reward heatmap: steps {steps[0]}-{steps[-1]} x examples (groups by "
                                          "mean, best first)", style=f"bold {MUTED}"), heatmap_text(matrix)]
            self.query_one("#sample-detail", Static).update(Group(*detail))
