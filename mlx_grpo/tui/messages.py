"""What widgets ask of the app: messages that bubble up to it (data comes down as calls)."""

from __future__ import annotations

from textual.message import Message


class OpenChart(Message):
    """Show these metrics as a chart of their own (Enter or a click on a tile, a chart or a metrics row)."""

    def __init__(self, title: str, metrics: tuple[str, ...]):
        super().__init__()
        self.title = title
        self.metrics = metrics
