"""The `?` screen: keys, views and what the run states mean."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from .palette import HIGHLIGHT

KEYS = (
    ("q", "quit"),
    ("?", "this help (any key closes it)"),
    ("tab / shift+tab", "next / previous view"),
    ("1 … 9", "go to a view"),
    ("j k ↓ ↑", "move in lists and tables; select a tile or chart (also h l ← →)"),
    ("enter", "open the selected tile, chart or metric as a chart of its own (escape goes back)"),
    ("/", "filter this view: its tiles and charts, metrics, alerts, samples or config (enter keeps it, "
          "escape clears it)"),
    ("+ / -", "refresh slower / faster"),
    ("s", "smoothing: off, EMA 0.6, 0.9, 0.99"),
    ("y", "y axes: linear or log (charts whose values are all positive)"),
    ("p", "pause / resume reading the run"),
    ("r", "runs: pick the runs to overlay among those beside the watched ones"),
)

STATES = (
    ("LIVE", "new metrics keep arriving"),
    ("STARTING", "running, no metrics yet (model loading, first rollout)"),
    ("STALLED", "running, but no new metrics for 10× the usual step time (at least 60 s)"),
    ("CRASHED", "run.json says running but the trainer's process is gone"),
    ("FINISHED / INTERRUPTED / FAILED", "as the trainer wrote in run.json"),
    ("WAITING", "the run directory or its files do not exist yet"),
)


def help_text(views: list[str]) -> Table:
    """The help: keys, views, run states and what alert colours mean."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style=f"bold {HIGHLIGHT}", no_wrap=True)
    grid.add_column()
    grid.add_row(Text("keys", style="bold underline"), "")
    for key, what in KEYS:
        grid.add_row(key, what)
    grid.add_row("", "")
    grid.add_row(Text("views", style="bold underline"), "")
    for i, view in enumerate(views, 1):
        grid.add_row(str(i), view)
    grid.add_row("", "")
    grid.add_row(Text("states", style="bold underline"), "")
    for state, what in STATES:
        grid.add_row(state, what)
    grid.add_row("", "")
    grid.add_row(Text("alerts", style="bold underline"),
                 "a tile or chart turns yellow (warning) or red (error) while an alert on its metric stands: "
                 "until 10 more steps are logged after it fired")
    return grid


class HelpScreen(ModalScreen):
    """The help over the dashboard; any key or click closes it."""

    def __init__(self, views: list[str]):
        super().__init__()
        self.views = views

    def compose(self) -> ComposeResult:
        """The help text."""
        with VerticalScroll(id="help-box"):
            yield Static(help_text(self.views))

    def on_key(self, event) -> None:
        """Any key closes the help."""
        event.stop()
        self.dismiss()

    def on_click(self) -> None:
        """A click closes the help."""
        self.dismiss()
