"""The console that commands print tables through (report, metrics, bench, compare, doctor).

In a terminal it is rich's usual console, at the terminal's width. Piped or redirected (`| less`, `> file`,
CI logs), rich would fall back to 80 columns and fold every table into narrow columns; this console prints
each table at the full width of its content instead, so a row stays one line for grep, less -S and
copy-paste. `COLUMNS` in the environment still wins, as in rich. Imports no mlx.
"""

from __future__ import annotations

import os
from typing import Any

from rich.console import Console
from rich.measure import Measurement

UNBOUNDED = 10_000  # columns a piped console may use: wider than any table's content


class FittedConsole(Console):
    """A rich Console that, when not writing to a terminal, prints each object at its own natural width."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.fitted = not self.is_terminal and "COLUMNS" not in os.environ and "width" not in kwargs
        if self.fitted:
            self.width = UNBOUNDED

    def print(self, *objects: Any, width: int | None = None, **kwargs: Any) -> None:
        """Console.print, at the objects' natural width when fitted."""
        if self.fitted and width is None and objects:
            options = self.options.update(max_width=UNBOUNDED)
            measured = [Measurement.get(self, options, self.render_str(o) if isinstance(o, str) else o).maximum
                        for o in objects]
            width = max(1, min(UNBOUNDED, max(measured) + len(objects) - 1))
        super().print(*objects, width=width, **kwargs)


def output_console(**kwargs: Any) -> Console:
    """The console the commands print their tables through."""
    return FittedConsole(highlight=False, **kwargs)
