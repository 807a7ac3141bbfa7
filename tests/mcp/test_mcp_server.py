"""`mlx-grpo mcp`, driven by the MCP SDK's own client over stdio: an agent lists runs, starts one, reads its
alerts while it runs and stops it; without --allow-control the tools that act are not offered."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

mcp = pytest.importorskip("mcp")

ALERT_RULES = """rules:
  - name: reward_seen
    kind: threshold
    metric: rewards/total/mean
    op: ">"
    value: -1000
    level: warning
    hint: "fires on every step, so the test has an alert to read"
"""


def _is_error(result) -> bool:
    return bool(getattr(result, "is_error", None) or getattr(result, "isError", False))  # mcp 2.x / 1.x


def _value(result):
    """A tool result's value: its structured content when it has one, else its text as JSON or text."""
    assert not _is_error(result), result.content
    structured = getattr(result, "structured_content", getattr(result, "structuredContent", None))
    if structured is not None:
        return structured.get("result", structured)
    text = result.content[0].text
    try:
        return json.loads(text)
    except ValueError:
        return text


async def _agent_session(cwd: Path) -> dict:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    seen: dict = {}
    params = StdioServerParameters(command=sys.executable, args=["-m", "mlx_grpo.cli", "mcp", "--allow-control"],
                                   cwd=str(cwd), env=dict(os.environ))  # this checkout, not an installed copy
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            seen["tools"] = sorted(t.name for t in (await session.list_tools()).tools)
            started = _value(await session.call_tool("start_run", {
                "overrides": {"num_steps": 2000, "eval_every": 0, "batch_size": 2, "alerts_file": "alerts.yaml",
                              "checkpoint_every": 0},
                "run_name": "agent"}))
            run_dir = started["run_dir"]
            seen["run_json_at_start"] = (Path(run_dir) / "run.json").is_file()  # start_run returned once it existed
            alerts, deadline = [], time.monotonic() + 240
            while not alerts and time.monotonic() < deadline:
                await asyncio.sleep(1.0)
                alerts = _value(await session.call_tool("read_alerts", {"run_dir": run_dir}))["records"]
            seen["alerts"] = alerts
            seen["runs"] = _value(await session.call_tool("list_runs", {"directory": "runs"}))["runs"]
            seen["metrics"] = _value(await session.call_tool("read_metrics", {"run_dir": run_dir,
                                                                              "names": ["rewards/"], "last": 1}))["records"]
            seen["stopped"] = _value(await session.call_tool("stop_run", {"run_dir": run_dir, "wait_s": 120}))
            seen["stop_again"] = await session.call_tool("stop_run", {"run_dir": run_dir})
    return seen


@pytest.mark.slow
def test_an_agent_lists_runs_reads_a_running_runs_alerts_and_stops_it(tmp_path):
    (tmp_path / "alerts.yaml").write_text(ALERT_RULES)
    seen = asyncio.run(_agent_session(tmp_path))
    assert {"list_runs", "read_metrics", "read_alerts", "read_samples", "report", "plan", "replay", "start_run",
            "stop_run", "rollback_run"} <= set(seen["tools"])
    assert seen["run_json_at_start"]
    assert seen["alerts"] and seen["alerts"][0]["rule"] == "reward_seen"
    (listed,) = [r for r in seen["runs"] if r["name"] == "agent"]
    assert listed["status"] == "running" and listed["total_steps"] == 2000
    assert any(k.startswith("rewards/") for k in seen["metrics"][0]) and "policy/kl" not in seen["metrics"][0]
    assert seen["stopped"]["status"] == "interrupted"  # stopped as Ctrl-C stops it: checkpoint, then out
    assert _is_error(seen["stop_again"]) and "not running" in seen["stop_again"].content[0].text
    info = json.loads((tmp_path / "runs" / "agent" / "run.json").read_text())
    assert info["status"] == "interrupted" and (tmp_path / "runs" / "agent" / "checkpoints").is_dir()


async def _read_only_tools(cwd: Path) -> list[str]:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=sys.executable, args=["-m", "mlx_grpo.cli", "mcp"], cwd=str(cwd),
                                   env=dict(os.environ))
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = sorted(t.name for t in (await session.list_tools()).tools)
            missing = await session.call_tool("read_alerts", {"run_dir": "nope"})
            assert _is_error(missing) and "not a run directory" in missing.content[0].text
            return tools


def test_without_allow_control_an_agent_can_only_read(tmp_path):
    tools = asyncio.run(_read_only_tools(tmp_path))
    assert tools == sorted(["list_runs", "read_metrics", "read_alerts", "read_samples", "report", "plan", "replay"])


@pytest.mark.slow
def test_rollback_sets_later_checkpoints_aside_and_resumes_from_the_chosen_step(tmp_path, monkeypatch):
    from mlx_grpo.mcp_server import Workspace

    monkeypatch.chdir(tmp_path)
    done = subprocess.run([sys.executable, "-m", "mlx_grpo.cli", "train", "--num-steps", "3", "--checkpoint-every",
                           "1", "--eval-every", "0", "--batch-size", "2", "--run-name", "r"], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    run_dir = tmp_path / "runs" / "r"
    workspace = Workspace(tmp_path, allow_control=True)
    result = workspace.rollback_run("runs/r", 1, overrides={"learning_rate": 1e-5})
    assert sorted(p.name for p in (run_dir / "rolled_back").iterdir())[-1].startswith("step_")
    workspace.started[result["pid"]][0].wait(timeout=600)  # the resumed run, to its end
    assert json.loads((run_dir / "run.json").read_text())["status"] == "finished"
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3] and result["resumed_from_step"] == 1  # cut back to step 1, then steps 2 and 3 again
