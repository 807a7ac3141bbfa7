"""`mlx-grpo mcp [--dir PATH] [--allow-control]`: a Model Context Protocol server on stdio for coding agents
(mcp_server/)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

# The project folder as an environment variable, for clients that set a server's environment but not its
# working directory (Claude Desktop starts servers in /, Cursor has no cwd field).
DIR_ENV = "MLX_GRPO_DIR"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", metavar="PATH", default=None,
                        help=f"the project folder the tools' relative paths (runs/, configs) are read from "
                             f"(default: ${DIR_ENV} if set, else the directory the client starts the server in)")
    parser.add_argument("--allow-control", action="store_true",
                        help="also offer the tools that act: start a run, stop one, roll one back to a checkpoint "
                             "(default: read-only tools only)")


def project_dir(flag: str | None) -> Path | None:
    """The folder named by --dir or $MLX_GRPO_DIR (None: the working directory as it is); refused unless it
    is an existing directory."""
    given, source = (flag, "--dir") if flag else (os.environ.get(DIR_ENV) or None, DIR_ENV)
    if given is None:
        return None
    from ..common.errors import UserError

    path = Path(given).expanduser()
    if not path.is_absolute():  # a relative path is relative to where the client starts the server: say so
        raise UserError(f"{source} {given!r}: give the project folder as an absolute path (clients start "
                        "servers in folders of their own choosing)")
    if not path.is_dir():
        raise UserError(f"{source} {given!r}: no such directory")
    return path


def run(args: argparse.Namespace) -> int:
    from ..common.errors import UserError, install_hint

    folder = project_dir(args.dir)
    if folder is not None:
        os.chdir(folder)  # every tool's relative path, and the runs it starts, follow the project folder
    try:
        from ..mcp_server import build_server

        server = build_server(allow_control=args.allow_control)
    except ImportError as err:
        raise UserError(f"mlx-grpo mcp needs the MCP SDK, which is not installed ({err.name}): "
                        f"{install_hint('mcp')}") from None
    server.run("stdio")
    return 0
