"""Importing a user's Python file (reward functions, tools, environments, correctness checks).

Only files the config or the command line names are imported: a run directory's files are data and are never
imported because the run directory names them (run_code.py). Imports no mlx and nothing heavy: the tool
worker process starts with it."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from .errors import UserError


def import_file(path: Path, what: str = "reward file") -> ModuleType:
    """`path` imported as a module; one UserError naming the file when it is missing or fails to import."""
    if not path.is_file():
        raise UserError(f"{what} not found: {path}")
    # A unique module name per path; registered so dataclasses/pickling in the user file work.
    module_name = "mlx_grpo_user_rewards_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        first = (str(exc).strip().splitlines() or [""])[0]
        detail = f": {first}" if first else ""
        raise UserError(f"cannot import {what} {path}: {type(exc).__name__}{detail}") from None
    return module
