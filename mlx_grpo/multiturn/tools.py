"""Tools the model may call: plain Python functions with type hints and a Google-style docstring (as TRL takes
them), given as built-in names (`calculator`) or `file.py:function` specs from the config or the command line.

Their JSON schemas, which the chat template shows the model, come from transformers' `get_json_schema`. They
run in a worker process (tool_worker.py): a call that raises comes back as an error message, one that passes
`timeout` seconds is answered with an error and its worker killed (the next call starts a new one), and a
result longer than `max_chars` is cut with a note. None of these stops the run; each is counted.
A user's tool file is imported only because the config or command line names it (never from a run directory)."""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..common.errors import UserError
from ..common.user_code import import_file
from .tool_worker import BUILTIN_TOOLS

STARTUP_SECONDS = 60.0  # a new worker's Python start and imports; not counted against a call's time limit


@dataclass
class ToolResult:
    text: str  # what the model reads as the tool's answer
    failed: bool  # the call raised, timed out, named no such tool or had bad arguments


def resolve_tool(spec: str, base_dir: Path) -> tuple[str, dict, Callable]:
    """(tool name, the worker's spec, the function) of a built-in name or `file.py:function`."""
    if ":" not in spec:
        if spec not in BUILTIN_TOOLS:
            raise UserError(f"unknown tool '{spec}'; built-in tools are {', '.join(BUILTIN_TOOLS)}, "
                            "or use 'file.py:function'")
        return spec, {"builtin": spec}, BUILTIN_TOOLS[spec]
    file_part, _, name = spec.rpartition(":")
    path = (base_dir / file_part).resolve()
    function = getattr(import_file(path, "tool file"), name, None)
    if not callable(function):
        raise UserError(f"tool file {path} has no function '{name}'")
    return name, {"file": str(path), "function": name}, function


def tool_schema(name: str, function: Callable) -> dict:
    """The JSON schema the chat template shows the model, from the function's type hints and docstring."""
    from transformers.utils import get_json_schema
    try:
        schema = get_json_schema(function)
    except Exception as exc:  # noqa: BLE001 - transformers raises its own error types for missing hints/docs
        raise UserError(f"tool '{name}': {str(exc).splitlines()[0]} (a tool needs type hints and a docstring "
                        "with an Args: section)") from None
    schema["function"]["name"] = name
    return schema


class ToolRunner:
    """Calls tools in a worker process, one call at a time, with a time limit and a size limit."""

    def __init__(self, specs: list[str], base_dir: Path, timeout: float = 5.0, max_chars: int = 2000):
        resolved = [resolve_tool(spec, base_dir) for spec in specs]
        names = [name for name, _, _ in resolved]
        if len(set(names)) != len(names):
            raise UserError(f"key 'tools': a tool name is listed twice: {', '.join(names)}")
        self.worker_specs = {name: spec for name, spec, _ in resolved}
        self.schemas = [tool_schema(name, function) for name, _, function in resolved]
        self.timeout = timeout
        self.max_chars = max_chars
        self._process: subprocess.Popen | None = None

    @property
    def names(self) -> list[str]:
        return list(self.worker_specs)

    def call(self, name: str, arguments: dict) -> ToolResult:
        if name not in self.worker_specs:
            return ToolResult(f"error: unknown tool {name!r}; tools: {', '.join(self.worker_specs)}", True)
        process = self._worker()
        if process is None:
            return ToolResult("error: the tool process did not start", True)
        try:
            process.stdin.write(json.dumps({"name": name, "arguments": arguments}, default=str) + "\n")
            process.stdin.flush()
        except (BrokenPipeError, OSError):
            self.close()
            return ToolResult("error: the tool process ended", True)
        line = self._read_line(process)
        if line is None:
            self.close()  # hung (or died): a new worker serves the next call
            return ToolResult(f"error: the tool {name} took longer than {self.timeout:g} s and was stopped", True)
        try:
            reply = json.loads(line)
        except json.JSONDecodeError:
            self.close()
            return ToolResult("error: the tool process answered garbage", True)
        if not reply.get("ok"):
            return ToolResult(f"error: {reply.get('error', 'the tool failed')}", True)
        text = str(reply.get("result", ""))
        if len(text) > self.max_chars:
            text = text[:self.max_chars] + f"... (cut to {self.max_chars} characters)"
        return ToolResult(text, False)

    def _read_line(self, process: subprocess.Popen, timeout: float | None = None) -> str | None:
        """One line of the worker's answer within the time limit; None when none came."""
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            if not selector.select(self.timeout if timeout is None else timeout):
                return None
        line = process.stdout.readline()
        return line or None

    def _worker(self) -> subprocess.Popen | None:
        """The worker process, started (and its tools loaded) when there is none; None when it cannot start."""
        if self._process is None or self._process.poll() is not None:
            env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}  # tools need no BLAS
            self._process = subprocess.Popen(
                [sys.executable, "-m", "mlx_grpo.multiturn.tool_worker", json.dumps(self.worker_specs),
                 str(self.max_chars)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                text=True, env=env, bufsize=1)
            ready = self._read_line(self._process, STARTUP_SECONDS)
            if ready is None or not json.loads(ready).get("ready"):
                self.close()
                return None
        return self._process

    def close(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None

    def __del__(self) -> None:
        self.close()
