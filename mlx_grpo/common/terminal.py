"""Text on its way to a terminal: control characters made visible.

Strings from run files, datasets, model completions, judges, reward exceptions and alert rules can hold
escape sequences: ESC[2J blanks a screen, OSC 0 retitles the terminal, OSC 52 can set the clipboard.
`terminal_safe` writes every C0/C1 control character except newline and tab as `\\x1b`-style text, so
they show instead of acting; every printer of such text (the trainer's console, the dashboard's readers,
report, compare, sweep) goes through it. Imports nothing heavy (the dashboard uses it).
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# A JSON line can hold a control character only escaped (\u001b) or, for DEL and C1, raw (UTF-8 c2 80-9f).
_JSON_MAY_HOLD_CONTROL = re.compile(rb"\\u00[0-9a-fA-F]{2}|\x7f|\xc2[\x80-\x9f]")


def terminal_safe(text: str) -> str:
    """The text with its control characters written as `\\x1b`-style escapes, safe to print."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text) if _CONTROL.search(text) else text


def terminal_safe_obj(obj: Any) -> Any:
    """`terminal_safe` applied to every string of a parsed JSON value, keys included."""
    if isinstance(obj, str):
        return terminal_safe(obj)
    if isinstance(obj, dict):
        return {terminal_safe(k) if isinstance(k, str) else k: terminal_safe_obj(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [terminal_safe_obj(v) for v in obj]
    return obj


def json_may_hold_control(line: bytes) -> bool:
    """Cheap test on a raw JSON line: False means no string in it can hold a control character."""
    return _JSON_MAY_HOLD_CONTROL.search(line) is not None


def open_standard_streams() -> None:
    """Standard input, output and error, each on /dev/null when it was closed at start (`>&-`, as cron jobs
    and service managers do). Otherwise the first file the run opens would take the closed descriptor, and
    whatever is printed would land in it; Python also leaves sys.stdout None, which ended the run at once."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
        except OSError:
            devnull = os.open(os.devnull, os.O_RDWR)  # the lowest free descriptor: fd itself
            if devnull != fd:
                os.dup2(devnull, fd)
                os.close(devnull)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, mode, closefd=False))
