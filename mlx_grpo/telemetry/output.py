"""The console that commands print tables through (report, metrics, bench, compare, doctor).

In a terminal it is rich's usual console, at the terminal's width. Piped or redirected (`| less`, `> file`,
CI logs), rich would fall back to 80 columns and fold every table into narrow columns, while printing at the
width of the widest cell made lines of 1,800 characters; this console prints each table at its natural width
up to PIPED_WIDTH columns, wrapping long cells inside their column, with no trailing padding, so diffs and
logs stay readable. `COLUMNS` in the environment still wins, as in rich. `--json` is there for machines.
Imports no mlx.
"""

from __future__ import annotations

import os
from typing import Any

from rich.console import Console
from rich.measure import Measurement

UNBOUNDED = 10_000  # columns to measure a table's natural width in
PIPED_WIDTH = 120  # columns of a piped table at most: wider cells wrap inside their column


class FittedConsole(Console):
    """A rich Console that, when not writing to a terminal, prints each object at its own natural width up to
    PIPED_WIDTH, with trailing spaces removed."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.fitted = not self.is_terminal and "COLUMNS" not in os.environ and "width" not in kwargs
        if self.fitted:
            self.width = PIPED_WIDTH

    def print(self, *objects: Any, width: int | None = None, **kwargs: Any) -> None:
        """Console.print, at the objects' natural width (at most PIPED_WIDTH) when fitted."""
        if not (self.fitted and width is None and objects):
            super().print(*objects, width=width, **kwargs)
            return
        options = self.options.update(max_width=UNBOUNDED)
        measured = [Measurement.get(self, options, self.render_str(o) if isinstance(o, str) else o).maximum
                    for o in objects]
        width = max(1, min(PIPED_WIDTH, max(measured) + len(objects) - 1))
        with self.capture() as captured:
            super().print(*objects, width=width, **kwargs)
        # rich pads every table row to the table's width; a pipe gets the text without the padding
        self.file.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))


def output_console(**kwargs: Any) -> Console:
    """The console the commands print their tables through."""
    return FittedConsole(highlight=False, **kwargs)
