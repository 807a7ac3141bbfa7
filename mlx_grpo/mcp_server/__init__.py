"""`mlx-grpo mcp`: a Model Context Protocol server on stdio, so a coding agent can watch and steer runs.

Read-only tools are always there: list the runs under a folder, read a run's metrics, alerts and samples,
its report, a config's memory plan, and a reward replay with built-in reward functions. Tools that act on runs
(start one, stop one, roll one back to a checkpoint) exist only when the server is started with
`--allow-control`: an agent that was only meant to watch cannot spend the machine, end a run or run code.

Least privilege, because an agent follows what it reads and run directories are data (docs/MCP.md):
- every path an agent names must lead, symbolic links resolved, inside the folder the server was started in
  (its workspace); a run directory with a link that leads out of it is not read;
- a read-only server runs no code an agent or a run names: `replay` takes built-in reward names only; with
  `--allow-control`, reward and correctness files and rubrics must lie inside the workspace;
- what a read tool returns is bounded (records, bytes, each string), with a cursor to page back;
- `stop_run` and `rollback_run` signal only a trainer this server started, or the process a run directory
  names after checking that it is this machine's, holds the run's lock and is no younger than the session
  it claims; never a process picked by its command line.

The server reads run directories itself and never imports mlx; `plan`, `replay`, `report` and `train` run as
`mlx-grpo` subprocesses, so a slow or failing command never takes the server down, and what an agent gets is
what a person would see. A started run is its own process group: it outlives the server (which reaps it when
it ends first). Built on the official `mcp` SDK (`pip install -e '.[mcp]'`); docs/MCP.md has client configs.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from ..common.errors import UserError
from .records import MAX_OUTPUT_CHARS, MAX_RECORDS
from .workspace import Workspace

__all__ = ["MAX_OUTPUT_CHARS", "MAX_RECORDS", "Workspace", "build_server"]

READ_TOOLS = ("list_runs", "read_metrics", "read_alerts", "read_samples", "report", "plan", "replay")
CONTROL_TOOLS = ("start_run", "stop_run", "rollback_run")


def build_server(allow_control: bool = False, root: str | os.PathLike | None = None):
    """The MCP server for the folder `root` (default: the current one) with the read tools, and the control
    tools when `allow_control`."""
    try:
        from mcp.server.mcpserver import MCPServer as Server  # mcp 2.x
        from mcp.server.mcpserver.exceptions import ToolError
    except ImportError:
        from mcp.server.fastmcp import FastMCP as Server  # mcp 1.x
        from mcp.server.fastmcp.exceptions import ToolError

    workspace = Workspace(Path(root) if root is not None else Path.cwd(), allow_control)
    server = Server("mlx-grpo", instructions="GRPO runs in this folder: list them, read their metrics, alerts, "
                                             "samples and reports, plan memory, replay built-in rewards"
                                             + ("; start, stop and roll back runs" if allow_control else
                                                "; read-only: runs no code, acts on no run"))
    for name in READ_TOOLS + (CONTROL_TOOLS if allow_control else ()):
        tool = getattr(workspace, name)
        description = tool.__doc__
        if name == "replay" and allow_control:
            description = description.replace("Built-in reward names only; a file.py:function reward is refused "
                                              "(this server runs no code it is given).",
                                              "A file.py:function reward must lie inside the server's folder.")
        server.tool(name=name, description=" ".join(description.split()))(_as_tool_errors(tool, ToolError))
    return server


def _as_tool_errors(tool, tool_error: type[Exception]):
    """`tool` with a UserError raised as the SDK's ToolError: the agent gets its one line as the tool's error
    result (anything else is a crash, reported by the SDK without its message)."""

    @functools.wraps(tool)
    def wrapped(*args, **kwargs):
        try:
            return tool(*args, **kwargs)
        except UserError as err:
            raise tool_error(str(err)) from None

    return wrapped
