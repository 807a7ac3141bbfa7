"""The process tools run in: `python -m mlx_grpo.multiturn.tool_worker SPECS_JSON`.

One JSON request per line on stdin (`{"name": ..., "arguments": {...}}`), one JSON answer per line on stdout
(`{"ok": true, "result": "..."}` or `{"ok": false, "error": "..."}`), after one `{"ready": true}` line once the
tools are loaded (or `{"ready": false, "error": ...}`). A tool's own prints go to stderr, so they
cannot corrupt an answer. The result is cut to the size limit here, before it crosses the pipe. The trainer
kills this process when a call passes its time limit and starts a new one for the next call."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..common.user_code import import_file
from .calculator import calculator

BUILTIN_TOOLS = {"calculator": calculator}


def load_function(spec: dict):
    """A tool function from its resolved spec: {"builtin": name} or {"file": absolute path, "function": name}."""
    if "builtin" in spec:
        return BUILTIN_TOOLS[spec["builtin"]]
    return getattr(import_file(Path(spec["file"]), "tool file"), spec["function"])


def answer(functions: dict, request: dict, max_chars: int) -> dict:
    function = functions.get(request.get("name"))
    if function is None:
        return {"ok": False, "error": f"unknown tool {request.get('name')!r}; tools: {', '.join(functions)}"}
    arguments = request.get("arguments")
    if not isinstance(arguments, dict):
        return {"ok": False, "error": "arguments must be a JSON object"}
    try:
        result = function(**arguments)
    except Exception as exc:  # noqa: BLE001 - whatever a tool raises goes back to the model as its result
        return {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:max_chars]}"}
    text = result if isinstance(result, str) else json.dumps(result, default=str)
    return {"ok": True, "result": text[:max_chars + 1]}  # one more: the trainer sees that it was cut


def main() -> None:
    specs = json.loads(sys.argv[1])
    max_chars = int(sys.argv[2])
    protocol = sys.stdout
    sys.stdout = sys.stderr  # a tool's prints must not reach the protocol stream
    try:
        functions = {name: load_function(spec) for name, spec in specs.items()}
    except Exception as exc:  # noqa: BLE001 - reported to the trainer, which says it in one line
        protocol.write(json.dumps({"ready": False, "error": f"{type(exc).__name__}: {exc}"}) + "\n")
        protocol.flush()
        return
    protocol.write(json.dumps({"ready": True}) + "\n")
    protocol.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
        except json.JSONDecodeError:
            reply = {"ok": False, "error": "bad request"}
        else:
            reply = answer(functions, request, max_chars)
        protocol.write(json.dumps(reply) + "\n")
        protocol.flush()


if __name__ == "__main__":
    main()
