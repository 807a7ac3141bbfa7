"""The bases of every widget that draws from the Board.

Data goes down: the app hands each widget the board when it is made and calls
`update_data()` on what is visible after every read. Requests go up as
messages (messages.py). Both bases are mixins, listed before the Textual class
they extend: `class AlertsView(BoardView, DataTable)`.
"""

from __future__ import annotations

from textual.widget import Widget

from .board import Board


def matches(filter_text: str, *texts: str) -> bool:
    """True when the filter is empty or is part of any of the texts (case-insensitive)."""
    f = filter_text.strip().lower()
    return not f or any(f in t.lower() for t in texts)


class BoardWidget:
    """A widget that draws from the board."""

    def __init__(self, board: Board, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.board = board

    def update_data(self) -> None:
        """Bring the widget up to date with the board; cheap when nothing it shows changed."""
        raise NotImplementedError(f"{type(self).__name__} must implement update_data()")


class BoardView(BoardWidget):
    """One of the dashboard's views (a tab): it has its own filter and says what gets the keyboard."""

    filter: str = ""

    def matches(self, *texts: str) -> bool:
        """True when the filter is empty or is part of one of `texts`."""
        return matches(self.filter, *texts)

    @property
    def focus_target(self) -> Widget:
        """The widget that gets the keyboard when the view is shown."""
        assert isinstance(self, Widget)
        return self
