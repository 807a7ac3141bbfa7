"""`mlx-grpo watch`: a live terminal dashboard over one or more run directories.

The app polls the runs on a timer (RunReader reads only new bytes) and updates
the header and the visible view; hidden views catch up when shown.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import Footer, Input, TabbedContent, TabPane

from ..telemetry.rundir_reader import RunReader, pid_alive

from .alerts_view import AlertsView
from .board import Board
from .chart_view import ChartsView
from .config_view import ConfigView
from .header import RunHeader
from .help_screen import HelpScreen
from .metrics_view import MetricsView
from .samples_view import SamplesView
from .system_view import SystemView
from .views import LENGTHS, OVERVIEW, POLICY, THROUGHPUT

NARROW_WIDTH = 120

VIEWS = (
    ("overview", "Overview"),
    ("policy", "Policy"),
    ("lengths", "Lengths"),
    ("throughput", "Throughput"),
    ("system", "System"),
    ("alerts", "Alerts"),
    ("samples", "Samples"),
    ("config", "Config"),
    ("metrics", "Metrics"),
)


class FilterInput(Input):
    BINDINGS = [Binding("escape", "app.close_filter(True)", "clear filter")]


class WatchApp(App):
    CSS_PATH = "watch.tcss"
    TITLE = "mlx-grpo watch"
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("question_mark", "help", "help"),
        Binding("tab", "next_view(1)", "next view", priority=True, show=False),
        Binding("shift+tab", "next_view(-1)", "previous view", priority=True, show=False),
        *(Binding(str(i), f"show_view({i})", name, show=False) for i, (_, name) in enumerate(VIEWS, 1)),
        Binding("j", "move(1)", "down", show=False),
        Binding("k", "move(-1)", "up", show=False),
        Binding("slash", "open_filter", "filter"),
        Binding("plus,equals_sign", "refresh_interval(1)", "slower"),
        Binding("minus", "refresh_interval(-1)", "faster"),
        Binding("s", "smoothing", "smoothing"),
        Binding("p", "pause", "pause"),
    ]

    def __init__(
        self,
        run_dirs: list[str | Path],
        *,
        refresh: float = 1.0,
        clock: Callable[[], float] = time.time,
        alive: Callable[[int], bool] = pid_alive,
        reader_options: dict | None = None,
    ):
        super().__init__()
        readers = [RunReader(d, **(reader_options or {})) for d in run_dirs]
        self.board = Board(readers, clock=clock, alive=alive, refresh_s=refresh)
        self._timer = None

    def compose(self) -> ComposeResult:
        yield RunHeader(id="header")
        with TabbedContent(initial="overview", id="views"):
            for i, (key, name) in enumerate(VIEWS, 1):
                with TabPane(f"{i} {name}", id=key):
                    yield self._make_view(key)
        yield FilterInput(placeholder="filter: part of a metric name, then enter (escape clears)", id="filter")
        yield Footer()

    @staticmethod
    def _make_view(key: str):
        specs = {"overview": OVERVIEW, "policy": POLICY, "lengths": LENGTHS, "throughput": THROUGHPUT}
        if key in specs:
            return ChartsView(specs[key], id=f"view-{key}")
        makers = {"system": SystemView, "alerts": AlertsView, "samples": SamplesView,
                  "config": ConfigView, "metrics": MetricsView}
        return makers[key](id=f"view-{key}")

    def on_mount(self) -> None:
        # Held directly: while the help screen is up, queries would search that screen.
        self._header = self.query_one(RunHeader)
        self._tabs = self.query_one(TabbedContent)
        self._filter_box = self.query_one("#filter", FilterInput)
        self._fit_columns(self.size.width)
        self.board.poll()
        self.update_views()
        self._focus_view()
        self._timer = self.set_interval(self.board.refresh_s, self.tick)

    def on_resize(self, event) -> None:
        self._fit_columns(event.size.width)

    def _fit_columns(self, width: int) -> None:
        # Two chart columns when there is room for both to be readable.
        tabs = getattr(self, "_tabs", None)  # a resize can come before on_mount
        if tabs is not None:
            tabs.set_class(width < NARROW_WIDTH, "-narrow")

    def on_unmount(self) -> None:
        self.board.close()

    # ------------------------------------------------------------------ refresh
    def tick(self) -> None:
        if not self._header.is_attached:  # the app is shutting down
            return
        if not self.board.paused:
            self.board.poll()
        self.update_views()

    def update_views(self) -> None:
        """Header always (elapsed time moves); the visible view only."""
        self._header.update_data()
        view = self.active_view()
        if view is not None:
            view.update_data()

    def active_view(self):
        active = self._tabs.active
        return self._tabs.query_one(f"#view-{active}") if active else None

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        view = self.active_view()
        if view is not None:
            view.update_data()
            if not self._filter_box.has_focus:
                self._focus_view()

    def _focus_view(self) -> None:
        """Give the visible view the keyboard, so arrows and j/k move in it."""
        view = self.active_view()
        if view is not None:
            (view.query_one("#samples-table") if isinstance(view, SamplesView) else view).focus()

    # ------------------------------------------------------------------ actions
    def action_help(self) -> None:
        self.push_screen(HelpScreen([name for _, name in VIEWS]))

    def action_show_view(self, index: int) -> None:
        if 1 <= index <= len(VIEWS):
            self._tabs.active = VIEWS[index - 1][0]

    def action_next_view(self, direction: int) -> None:
        keys = [k for k, _ in VIEWS]
        current = keys.index(self._tabs.active)
        self._tabs.active = keys[(current + direction) % len(keys)]

    def action_move(self, direction: int) -> None:
        focused = self.focused
        if focused is None:
            return
        down = direction > 0
        for name in (("action_cursor_down", "action_scroll_down") if down else ("action_cursor_up", "action_scroll_up")):
            action = getattr(focused, name, None)
            if action is not None:
                action()
                return

    def action_open_filter(self) -> None:
        self._filter_box.display = True
        self._filter_box.focus()

    def action_close_filter(self, clear: bool = False) -> None:
        box = self._filter_box
        if clear:
            box.value = ""
            self._set_filter("")
        box.display = False
        self._focus_view()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "filter":
            self._set_filter(event.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "filter":
            self.action_close_filter()

    def _set_filter(self, text: str) -> None:
        self.board.filter = text
        self.update_views()

    def action_refresh_interval(self, direction: int) -> None:
        self.board.change_refresh(direction)
        if self._timer is not None:
            self._timer.stop()
        self._timer = self.set_interval(self.board.refresh_s, self.tick)
        self.update_views()

    def action_smoothing(self) -> None:
        self.board.cycle_smoothing()
        self.update_views()

    def action_pause(self) -> None:
        self.board.paused = not self.board.paused
        self.update_views()
