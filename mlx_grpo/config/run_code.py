"""A run directory is data: the code it names is imported only when the command line names it too.

run.json records the run's reward functions, correctness check and rubric. Built-in ones are known by name
and are ours. A `file.py:function` spec, or a rubric file (it can name python scorers and a judge endpoint
to send an API key to), is code or configuration the run directory points at, and a run directory may
come from someone else. `replay RUN_DIR` and `eval RUN_DIR` therefore use the built-ins by name and refuse,
naming the file and the flag that would pass it, anything else the run names.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from ..common.errors import UserError
from ..common.terminal import terminal_safe
from ..telemetry.reward_names import translate_reward


def is_user_code(spec: str) -> bool:
    """A spec that names a file: `file.py:function`, or TRL's `module.function` read as one (a built-in is a
    plain name)."""
    return ":" in translate_reward(spec)[0]


def named_file(spec_or_path: str, base_dir: Path, spec: bool = True) -> str:
    """Where a reward spec's file (`file.py:function`, TRL's `module.function`) or, `spec` False, a rubric
    path points: the file that would be read, printable."""
    translated = translate_reward(spec_or_path)[0] if spec else spec_or_path
    file_part = translated.rpartition(":")[0] if spec and ":" in translated else spec_or_path
    path = Path(file_part)
    try:
        path = path if path.is_absolute() else (base_dir / path)
        return terminal_safe(str(path.absolute()))
    except (OSError, ValueError):
        return terminal_safe(file_part)


def refuse_named_code(run_dir: Path, command: str, what: str, spec: str, base_dir: Path, how: str) -> UserError:
    """The one-line refusal: which file the run names, that nothing is imported, how to pass it yourself."""
    return UserError(f"{terminal_safe(str(run_dir))}: the run's {what} {terminal_safe(spec)} is user code "
                     f"({named_file(spec, base_dir)}); {command} imports no code a run directory names. "
                     f"To use it, name it on the command line: {how}")


def spec_text(spec: str, weight: float, base_dir: Path) -> str:
    """A reward as `--rewards` takes it: built-ins by name, a user file as its absolute path."""
    name = (f"{named_file(spec, base_dir)}:{terminal_safe(translate_reward(spec)[0].rpartition(':')[2])}"
            if is_user_code(spec) else spec)
    return shlex.quote(f"{name}={weight:g}")
