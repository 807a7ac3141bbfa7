"""Alerts on the console: one coloured line per alert (rich). Imports no mlx."""

from __future__ import annotations

from typing import Iterable

from rich.console import Console
from rich.text import Text

from ...common.terminal import terminal_safe
from .alert import Alert

LEVEL_STYLES = {"info": "cyan", "warning": "bold yellow", "error": "bold white on red"}


def format_alert(alert: Alert) -> Text:
    """`WARNING step 42 kl_drift: <message>`, the level coloured."""
    style = LEVEL_STYLES.get(alert.level, "")
    return Text.assemble((f"{alert.level.upper():<7}", style), f" step {alert.step} ",
                         (terminal_safe(alert.rule), "bold"), ": ", terminal_safe(alert.message))


def print_alerts(alerts: Iterable[Alert], console: Console | None = None) -> None:
    """Print each alert as one logical line (soft-wrapped by the terminal, never split)."""
    console = console or Console(stderr=True)
    for alert in alerts:
        console.print(format_alert(alert), soft_wrap=True, highlight=False)
