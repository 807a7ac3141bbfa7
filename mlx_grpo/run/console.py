"""What a training run prints: a progress bar with the numbers people watch, and plain lines."""

from __future__ import annotations

import os
import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.text import Text

from ..common.terminal import terminal_safe
from ..telemetry.metrics import names


class _PipeSafeConsole(Console):
    """A console whose stdout may go away (`| head`, a pager quit early, a dead log collector) or fail (a log
    file on a full disk): rich's own answer is SystemExit(1) from inside print, or the OSError, which ended
    training at once with no message and no checkpoint. Here the output goes to /dev/null from then on, and
    stderr says so once; training goes on."""

    def on_broken_pipe(self) -> None:
        self._stop_printing("it was closed (broken pipe)")

    def _check_buffer(self) -> None:
        try:
            super()._check_buffer()
        except OSError as err:  # a full disk (ENOSPC), an I/O error: output that cannot be written
            del self._buffer[:]
            self._stop_printing(f"it cannot be written: {err.strerror or err}")

    def _stop_printing(self, why: str) -> None:
        self.quiet = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        try:
            print(f"mlx-grpo: warning: standard output stopped ({why}); training goes on without printing "
                  "progress, the run directory keeps every record", file=sys.stderr, flush=True)
        except OSError:  # stderr gone too: nothing left to tell
            pass


class TrainingConsole:
    """A rich progress bar with step, reward, accuracy and tokens/s; messages print above it."""

    def __init__(self, total_steps: int, start_step: int = 0, enabled: bool = True, console: Console | None = None):
        # Without a terminal (a log file, CI, a pipe) lines are never wrapped at rich's default 80 columns:
        # a run directory path or an alert stays one line that grep and copy-paste can use.
        self.console = console or _PipeSafeConsole(stderr=False, highlight=False, soft_wrap=not sys.stdout.isatty())
        self.task_total = total_steps
        self.progress = Progress(
            *self._columns(""),
            console=self.console,
            disable=not enabled or not sys.stdout.isatty(),
        )
        self.task = self.progress.add_task("train", total=total_steps, completed=start_step, summary="")
        self.plain = not sys.stdout.isatty()

    def _columns(self, summary: str) -> tuple:
        """The bar's columns for this terminal width: the numbers people watch (reward, accuracy) always fit;
        the bar shrinks first, then the elapsed time goes, then the bar (rich would cut the summary instead)."""
        width = self.console.width
        steps = len(str(self.task_total)) * 2 + 1
        fixed = len("step") + 1 + steps + 1 + len(summary) + 1 + len("eta") + 1 + 7  # 7: "0:00:27"
        elapsed = 8
        bar = min(24, width - fixed - elapsed - 2)
        if bar < 6:
            elapsed = 0
            bar = min(24, width - fixed - 2)
        columns = [TextColumn("[bold]step"), MofNCompleteColumn()]
        if bar >= 4:
            columns.append(BarColumn(bar_width=bar))
        columns.append(TextColumn("{task.fields[summary]}"))
        if elapsed:
            columns.append(TimeElapsedColumn())
        return (*columns, TextColumn("eta"), TimeRemainingColumn())

    def __enter__(self) -> "TrainingConsole":
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def step(self, step: int, record: dict[str, float], every: int) -> None:
        reward = record.get(names.REWARD_MEAN)
        acc = record.get(names.ACCURACY_TRAIN)
        tps = record.get(names.STEP_TOKENS_PER_S)
        held_out = record.get(names.EVAL_ACCURACY)
        parts = []
        if reward is not None:
            parts.append(f"reward {reward:+.3f}")
        if acc is not None:
            parts.append(f"acc {acc:.0%}")
        if held_out is not None:
            parts.append(f"held-out {held_out:.0%}")
        if tps is not None:
            parts.append(f"{tps:,.0f} tok/s")
        summary = "  ".join(parts)
        self.progress.columns = self._columns(summary)
        self.progress.update(self.task, completed=step, summary=summary)
        # Without a terminal (CI, a log file) a line every `every` steps stands in for the bar.
        if self.plain and (step % every == 0 or held_out is not None):
            self.console.print(f"step {step}/{self.progress.tasks[0].total}  {summary}")

    def message(self, text: str | Text, style: str | None = None) -> None:
        # Text from rewards, datasets, judges and alert rules: escape sequences shown, not acted on.
        self.console.print(terminal_safe(text) if isinstance(text, str) else text, style=style)
