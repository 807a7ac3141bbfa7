"""`mlx-grpo mcp [--allow-control]`: a Model Context Protocol server on stdio for coding agents (mcp_server.py)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--allow-control", action="store_true",
                        help="also offer the tools that act: start a run, stop one, roll one back to a checkpoint "
                             "(default: read-only tools only)")


def run(args: argparse.Namespace) -> int:
    from ..common.errors import UserError, install_hint

    try:
        from ..mcp_server import build_server

        server = build_server(allow_control=args.allow_control)
    except ImportError as err:
        raise UserError(f"mlx-grpo mcp needs the MCP SDK, which is not installed ({err.name}): "
                        f"{install_hint('mcp')}") from None
    server.run("stdio")
    return 0
