"""docs/MCP.md's client snippets (Claude Code, Claude Desktop, Cursor, VS Code, Codex): each parses as its client
reads it, names the project folder itself (no snippet leans on `cwd`), and started as it says from `/`, the
server's `list_runs()` finds the project's runs."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

DOC = Path(__file__).parents[2] / "docs" / "MCP.md"
CLIENTS = ("Claude Code", "Claude Desktop", "Cursor", "VS Code", "Codex")
EXE, PROJECT = "/path/to/mlx-grpo/.venv/bin/mlx-grpo", "/path/to/your/project"


def snippets() -> dict[str, tuple[str, str]]:
    """{client: (language, code)} from the doc's "### <client>" sections."""
    text = DOC.read_text()
    found = {}
    for client in CLIENTS:
        section = text.split(f"\n### {client}\n", 1)[1].split("\n#", 1)[0]
        lang, code = re.search(r"```(\w+)\n(.*?)```", section, re.S).groups()
        found[client] = (lang, code)
    return found


def server_command(client: str, lang: str, code: str) -> tuple[str, list[str], dict]:
    """(command, args, env) as the client would start the server."""
    if lang == "bash":  # claude mcp add NAME -- COMMAND ARGS...
        words = shlex.split(code)
        assert words[:3] == ["claude", "mcp", "add"] and "--" in words
        command, *args = words[words.index("--") + 1:]
        return command, args, {}
    if lang == "toml":
        entry = tomllib.loads(code)["mcp_servers"]["mlx-grpo"]
    else:
        doc = json.loads(code)
        entry = (doc.get("mcpServers") or doc["servers"])["mlx-grpo"]
        assert entry.get("type", "stdio") == "stdio"
    assert "cwd" not in entry
    return entry["command"], list(entry.get("args", [])), dict(entry.get("env", {}))


def test_every_client_has_a_snippet_that_names_the_project_folder():
    found = snippets()
    assert set(found) == set(CLIENTS)
    assert found["Codex"][0] == "toml" and found["Claude Code"][0] == "bash"
    for client, (lang, code) in found.items():
        command, args, env = server_command(client, lang, code)
        assert command == EXE and args[0] == "mcp", client
        assert "--dir" in args or "MLX_GRPO_DIR" in env, client


async def _list_runs(command: list[str], env: dict) -> list[dict]:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=command[0], args=command[1:], env=env, cwd="/")
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            result = await session.call_tool("list_runs", {})
            structured = getattr(result, "structured_content", getattr(result, "structuredContent", None))
            return structured.get("result", structured) if structured is not None else json.loads(result.content[0].text)


def test_each_snippet_started_from_root_lists_the_projects_runs(tmp_path):
    pytest.importorskip("mcp")
    from mlx_grpo.telemetry.rundir.writer import RunInfo, write_run_info

    (tmp_path / "runs" / "demo").mkdir(parents=True)
    write_run_info(tmp_path / "runs" / "demo", RunInfo(name="demo", status="finished", config={}))
    base_env = {**os.environ}
    base_env.pop("MLX_GRPO_DIR", None)

    async def every_client() -> dict[str, list]:
        seen = {}
        for client, (lang, code) in snippets().items():
            command, args, env = server_command(client, lang, code)
            args = [a.replace(PROJECT, str(tmp_path)).replace("${workspaceFolder}", str(tmp_path)) for a in args]
            env = {k: v.replace(PROJECT, str(tmp_path)) for k, v in env.items()}
            seen[client] = await _list_runs([sys.executable, "-m", "mlx_grpo.cli", *args], {**base_env, **env})
        return seen

    for client, listed in asyncio.run(every_client()).items():
        assert [r["name"] for r in listed["runs"]] == ["demo"], client  # a page: {"runs": [...], "more": 0}


@pytest.mark.parametrize("given, message", [("relative/dir", "absolute path"), ("/no/such/dir", "no such directory")])
def test_a_project_folder_that_cannot_be_used_is_named(given, message):
    env = {**os.environ, "MLX_GRPO_DIR": given}
    flag = subprocess.run([sys.executable, "-m", "mlx_grpo.cli", "mcp", "--dir", given], capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL)
    from_env = subprocess.run([sys.executable, "-m", "mlx_grpo.cli", "mcp"], capture_output=True, text=True,
                              timeout=300, env=env, stdin=subprocess.DEVNULL)
    for result, source in ((flag, "--dir"), (from_env, "MLX_GRPO_DIR")):
        assert result.returncode == 2 and f"{source} {given!r}" in result.stderr and message in result.stderr
        assert "Traceback" not in result.stderr
