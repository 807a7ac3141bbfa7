"""`mlx-grpo watch`: a live terminal dashboard over one or more run directories.

The app polls the runs on a timer (RunReader reads only new bytes) and updates
the header and the visible view; hidden views catch up when shown. What the
user sets (smoothing, pause, refresh, the view's filter) are reactives whose
watchers push the change down and redraw. Widgets ask for a chart of their own
with an OpenChart message; `r` opens the run browser.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Callable

from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.reactive import var
from textual.widgets import Footer, Input, TabbedContent, TabPane

from ..telemetry.analysis.alert_replay import AlertReplay
from ..telemetry.rundir.reader import RunReader, pid_alive
from .alerts_view import AlertsView
from .board import Board
from .board_widget import BoardView, BoardWidget
from .chart_screen import ChartScreen
from .chart_view import ChartsView
from .config_view import ConfigView
from .header import RunHeader, Settings
from .help_screen import HelpScreen
from .messages import OpenChart
from .metrics_view import MetricsView
from .palette import css_variables
from .run_picker import RunPicker
from .samples_view import SamplesView
from .system_view import SystemView
from .views import LENGTHS, OVERVIEW, POLICY, THROUGHPUT

NARROW_WIDTH = 120
SHORT_HEIGHT = 30  # rows; below it charts are lower (watch.tcss: -short)
SMOOTHING_LEVELS = (0.0, 0.6, 0.9, 0.99)
REFRESH_LEVELS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0)

# The views in tab order (keys 1-9): title, and what makes it from the board.
VIEWS: tuple[tuple[str, Callable[..., BoardView]], ...] = (
    ("Overview", partial(ChartsView, spec=OVERVIEW)),
    ("Policy", partial(ChartsView, spec=POLICY)),
    ("Lengths", partial(ChartsView, spec=LENGTHS)),
    ("Throughput", partial(ChartsView, spec=THROUGHPUT)),
    ("System", SystemView),
    ("Alerts", AlertsView),
    ("Samples", SamplesView),
    ("Config", ConfigView),
    ("Metrics", MetricsView),
)
VIEW_KEYS = tuple(title.lower() for title, _ in VIEWS)


def next_refresh(current: float, direction: int) -> float:
    """The refresh interval one level up (+1, slower) or down (-1, faster)."""
    i = min(range(len(REFRESH_LEVELS)), key=lambda k: abs(REFRESH_LEVELS[k] - current))
    return REFRESH_LEVELS[max(0, min(len(REFRESH_LEVELS) - 1, i + direction))]


class FilterInput(Input):
    """The filter's input line; escape clears the filter and closes it."""

    BINDINGS = [Binding("escape", "app.close_filter(True)", "clear filter")]


class WatchApp(App[None]):
    """The dashboard: a header, numbered views of one Board, a filter line and the key bindings."""

    CSS_PATH = "watch.tcss"
    TITLE = "mlx-grpo watch"
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("question_mark", "help", "help"),
        Binding("tab", "next_view(1)", "next view", priority=True, show=False),
        Binding("shift+tab", "next_view(-1)", "previous view", priority=True, show=False),
        *(Binding(str(i), f"show_view({i})", title, show=False) for i, (title, _) in enumerate(VIEWS, 1)),
        Binding("j", "move(1)", "down", show=False),
        Binding("k", "move(-1)", "up", show=False),
        # priority: handled as the key arrives, before the keys queued behind it are passed on, so the rest
        # of "/zero_std" typed in one burst (a paste, a fast ssh link) lands in the box, not in the view
        Binding("slash", "open_filter", "filter", priority=True),
        Binding("plus,equals_sign", "refresh_interval(1)", "slower"),
        Binding("minus", "refresh_interval(-1)", "faster"),
        Binding("s", "smoothing", "smoothing"),
        Binding("y", "log_scale", "log y"),
        Binding("p", "pause", "pause"),
        Binding("r", "pick_runs", "runs"),
    ]

    smoothing = var(0.6, init=False)
    log_scale = var(False, init=False)
    paused = var(False, init=False)
    refresh_s = var(1.0, init=False)
    filter = var("", init=False)  # the visible view's

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
        self._reader_options = reader_options or {}
        readers = [self._reader(d) for d in run_dirs]
        # The run browser lists the runs beside the ones given (their folders, e.g. runs/).
        self.run_roots = list(dict.fromkeys(Path(d).parent for d in run_dirs))
        self.board = Board(readers, clock=clock, alive=alive, smoothing=self.smoothing)
        self.set_reactive(WatchApp.refresh_s, refresh)
        self._timer = None

    def _reader(self, run_dir: str | Path) -> RunReader:
        """A run's reader, with its own alert rules replayed over what it reads."""
        return RunReader(run_dir, replay=AlertReplay(), **self._reader_options)

    def get_css_variables(self) -> dict[str, str]:
        """Textual's CSS variables plus the palette's colours."""
        return {**super().get_css_variables(), **css_variables()}

    def compose(self) -> ComposeResult:
        """The header, a tab per view, the filter line and the footer."""
        yield RunHeader(self.board, id="header")
        with TabbedContent(initial=VIEW_KEYS[0], id="views"):
            for i, ((title, make), key) in enumerate(zip(VIEWS, VIEW_KEYS), 1):
                with TabPane(f"{i} {title}", id=key):
                    yield make(self.board, id=f"view-{key}")
        yield FilterInput(placeholder="filter this view: part of a name, then enter (escape clears)", id="filter")
        yield Footer()

    def on_mount(self) -> None:
        """Read the runs once, draw the first view and start the refresh timer."""
        # Held directly: while the help screen is up, queries would search that screen.
        self._header = self.query_one(RunHeader)
        self._tabs = self.query_one(TabbedContent)
        self._filter_box = self.query_one("#filter", FilterInput)
        self._fit_columns(self.size.width, self.size.height)
        self.board.poll()
        self.update_views()
        self._focus_view()
        self._timer = self.set_interval(self.refresh_s, self.tick)

    def on_resize(self, event) -> None:
        """Switch between one and two chart columns with the width."""
        self._fit_columns(event.size.width, event.size.height)

    def _fit_columns(self, width: int, height: int) -> None:
        # Two chart columns when there is room for both to be readable; lower ones, and short tab titles, on a
        # small terminal (btop-style: every view stays reachable and accuracy stays on the first screen).
        tabs = getattr(self, "_tabs", None)  # a resize can come before on_mount
        if tabs is not None:
            tabs.set_class(width < NARROW_WIDTH, "-narrow")
            tabs.set_class(height < SHORT_HEIGHT, "-short")
            short_titles = width < NARROW_WIDTH
            for i, ((title, _), key) in enumerate(zip(VIEWS, VIEW_KEYS), 1):
                tab = tabs.get_tab(key)
                label = f"{i} {title[:4] if short_titles else title}"
                if str(tab.label) != label:
                    tab.label = label

    def on_unmount(self) -> None:
        """Close the run readers."""
        self.board.close()

    # ------------------------------------------------------------------ refresh
    def tick(self) -> None:
        """One refresh: read what the runs wrote (unless paused), then redraw."""
        if not self._header.is_attached:  # the app is shutting down
            return
        if not self.paused:
            self.board.poll()
        self.update_views()

    def update_views(self) -> None:
        """Header always (elapsed time moves); the visible view only, and a chart opened over it."""
        self._header.settings = Settings(self.refresh_s, self.smoothing, self.paused, self.filter, self.log_scale)
        self._header.update_data()
        view = self.active_view()
        if view is not None:
            view.update_data()
        if isinstance(self.screen, BoardWidget):
            self.screen.update_data()

    def active_view(self) -> BoardView | None:
        """The view of the selected tab, if any."""
        active = self._tabs.active
        return self._tabs.query_one(f"#view-{active}", BoardView) if active else None

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        """Draw a view as soon as its tab is chosen."""
        view = self.active_view()
        if view is None:
            return
        self._filter_box.value = view.filter
        self.filter = view.filter
        self.update_views()
        # A view shown by a key has the focus already, perhaps moved on by the keys after it: keep that.
        if not self._filter_box.has_focus and not view.has_focus_within:
            self._focus_view()

    def _focus_view(self) -> None:
        """Give the visible view the keyboard, so arrows and j/k move in it.

        At once, not with focus(), which waits a turn: meanwhile the hidden view's focused widget hands the
        focus to a sibling in its own pane, and TabbedContent follows the focus back to that pane.
        """
        view = self.active_view()
        if view is not None:
            view.screen.set_focus(view.focus_target)

    def _switch_view(self, key: str) -> None:
        """Show the view `key` over whatever is open, and give it the keyboard in the same step (see _focus_view)."""
        self._back_to_views()
        self._tabs.active = key
        self.update_views()  # the view's rows first: a table scrolled to its cursor before then keeps a stale scrollbar
        if not self._filter_box.has_focus:
            self._focus_view()

    # ------------------------------------------------------------------ watchers
    def watch_smoothing(self, value: float) -> None:
        """Give the board the new smoothing and redraw."""
        self.board.smoothing = value
        self.update_views()

    def watch_log_scale(self, value: bool) -> None:
        """Redraw the charts on the new y scale."""
        self.board.log_scale = value
        self.update_views()

    def watch_paused(self) -> None:
        """Redraw the header's paused mark."""
        self.update_views()

    def watch_refresh_s(self, value: float) -> None:
        """Restart the refresh timer at the new interval."""
        if self._timer is not None:
            self._timer.stop()
        self._timer = self.set_interval(value, self.tick)
        self.update_views()

    def watch_filter(self, value: str) -> None:
        """Redraw the views with the new filter."""
        view = self.active_view()
        if view is not None:
            view.filter = value
        self.update_views()

    # ------------------------------------------------------------------ charts and runs
    def on_open_chart(self, message: OpenChart) -> None:
        """Open the requested metric as a chart of its own."""
        self.push_screen(ChartScreen(self.board, message.title, message.metrics))

    def _back_to_views(self) -> None:
        """Close a chart screen (or the help) so that the views are what the keys act on."""
        while len(self.screen_stack) > 1:
            self.pop_screen()

    def action_pick_runs(self) -> None:
        """Open the run browser; the runs picked there replace the watched ones."""
        self._back_to_views()
        watched = [reader.run_dir for reader in self.board.readers]
        self.push_screen(RunPicker(watched, self.run_roots), callback=self._set_runs)

    def _set_runs(self, chosen: list[Path] | None) -> None:
        """Watch the chosen runs: those watched already keep their reader, place and colour; new ones follow."""
        if not chosen:
            return
        kept = {reader.run_dir.resolve(): reader for reader in self.board.readers}
        wanted = {path.resolve(): path for path in chosen}
        readers = [reader for key, reader in kept.items() if key in wanted]
        readers += [self._reader(path) for key, path in wanted.items() if key not in kept]
        self.board.replace_readers(readers)
        self.board.poll()
        self.update_views()

    # ------------------------------------------------------------------ actions
    def check_action(self, action: str, parameters: tuple) -> bool | None:
        """Refuse the filter while a chart or a dialog is open."""
        # The filter belongs to a view: there is none to filter while a chart or a dialog is open.
        if action == "open_filter" and len(self.screen_stack) > 1:
            return False
        return True

    def action_help(self) -> None:
        """Show the help screen."""
        self.push_screen(HelpScreen([title for title, _ in VIEWS]))

    def action_show_view(self, index: int) -> None:
        """Switch to view number `index` (1-based)."""
        if 1 <= index <= len(VIEW_KEYS):
            self._switch_view(VIEW_KEYS[index - 1])

    def action_next_view(self, direction: int) -> None:
        """Switch to the next (1) or previous (-1) view."""
        current = VIEW_KEYS.index(self._tabs.active)
        self._switch_view(VIEW_KEYS[(current + direction) % len(VIEW_KEYS)])

    def action_move(self, direction: int) -> None:
        """Move the focused widget's cursor, or scroll it, one line down (1) or up (-1)."""
        focused = self.focused
        if focused is None:
            return
        down = direction > 0
        names = ("action_cursor_down", "action_scroll_down") if down else ("action_cursor_up", "action_scroll_up")
        for name in names:
            action = getattr(focused, name, None)
            if action is not None:
                action()
                return

    def action_open_filter(self) -> None:
        """Show the filter line holding the current filter."""
        if self.focused is self._filter_box:  # the binding has priority: in the box, '/' is part of the filter
            self._filter_box.post_message(events.Key("slash", "/"))  # queued behind the keys before it
            return
        self._filter_box.value = self.filter
        self._filter_box.display = True
        self.set_focus(self._filter_box)  # at once: the next keys typed are the filter's

    def on_paste(self, event: events.Paste) -> None:
        """Text pasted outside the filter box is a filter ('/zero_std' as well as 'zero_std'): the box opens
        holding all of it, where a key-by-key reading would drop characters or run them as commands."""
        text = " ".join(event.text.split())
        if self.focused is self._filter_box or not text or not self.check_action("open_filter", ()):
            return
        event.stop()
        self.action_open_filter()
        self._filter_box.value = text.removeprefix("/")
        self._filter_box.cursor_position = len(self._filter_box.value)

    def action_close_filter(self, clear: bool = False) -> None:
        """Hide the filter line; with `clear`, drop the filter too."""
        box = self._filter_box
        if clear:
            box.value = ""
            self.filter = ""
        box.display = False
        self._focus_view()

    def on_input_changed(self, event: Input.Changed) -> None:
        """Filter as the user types."""
        if event.input.id == "filter":
            self.filter = event.value

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """Enter keeps the filter and closes its line."""
        if event.input.id == "filter":
            self.action_close_filter()

    def action_refresh_interval(self, direction: int) -> None:
        """Refresh less (1) or more (-1) often."""
        self.refresh_s = next_refresh(self.refresh_s, direction)

    def action_smoothing(self) -> None:
        """Cycle through the smoothing levels."""
        levels = SMOOTHING_LEVELS
        self.smoothing = levels[(levels.index(self.smoothing) + 1) % len(levels)]

    def action_log_scale(self) -> None:
        """Switch the charts' y axis between linear and log."""
        self.log_scale = not self.log_scale

    def action_pause(self) -> None:
        """Stop or resume reading the runs."""
        self.paused = not self.paused
