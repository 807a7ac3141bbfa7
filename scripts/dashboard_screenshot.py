"""Draw the dashboard over a run directory as an SVG, the way docs/img/dashboard.svg is made:

    python scripts/dashboard_screenshot.py runs/grpo-... docs/img/dashboard.svg [--size 120x40]

It runs the real app headless (Textual's pilot) at a fixed terminal size, waits for the charts, and saves
Textual's own screenshot, so the picture is today's build, not a capture of some terminal's rendering."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from mlx_grpo.tui.app import WatchApp


async def screenshot(run_dir: Path, out: Path, width: int, height: int) -> None:
    app = WatchApp([run_dir], refresh=3600)
    async with app.run_test(size=(width, height)) as pilot:
        for _ in range(100):  # until the charts have their first data
            await pilot.pause(0.1)
            if app.board.runs[0].step:
                break
        await pilot.pause(1.0)
        app.save_screenshot(filename=out.name, path=str(out.parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--size", default="120x40", help="terminal columns x rows (default 120x40)")
    args = parser.parse_args()
    width, height = map(int, args.size.split("x"))
    asyncio.run(screenshot(args.run_dir, args.out, width, height))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
