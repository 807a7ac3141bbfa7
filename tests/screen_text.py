"""What a running Textual app shows, as plain text (for assertions on the screen)."""

from __future__ import annotations

import io
import time

from rich.console import Console


def screen_text(app) -> str:
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True,
                      color_system="truecolor", record=True, legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()


async def settle(pilot, keys: tuple[str, ...] | list[str] = (), rounds: int = 3, timeout: float = 30.0) -> None:
    """Press the keys, then wait until the screen is the same for `rounds` pauses in a row.

    Pilot's own waits judge "idle" by the process's CPU time, which a loaded machine fools (the process is idle
    because it is not scheduled), so a screenshot taken after them can catch a layout half done.
    """
    await pilot.press(*keys)
    deadline = time.monotonic() + timeout
    last, same = None, 0
    while same < rounds and time.monotonic() < deadline:
        await pilot.pause()
        shown = pilot.app.export_screenshot()
        same = same + 1 if shown == last else 0
        last = shown
