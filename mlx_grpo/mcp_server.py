"""`mlx-grpo mcp`: a Model Context Protocol server on stdio, so a coding agent can watch and steer runs.

Read-only tools are always there: list the runs under a folder, read a run's metrics, alerts and samples,
its report, a config's memory plan, and a reward replay. Tools that act on runs (start one, stop one, roll
one back to a checkpoint) exist only when the server is started with `--allow-control`: an agent that was
only meant to watch cannot spend the machine or end a run.

The server reads run directories with the dashboard's readers and never imports mlx; `plan`, `replay`,
`report` and `train` run as `mlx-grpo` subprocesses, so a slow or failing command never takes the server
down, and what an agent gets is what a person would see. A started run is its own process group: it
outlives the server. Built on the official `mcp` SDK (`pip install -e '.[mcp]'`); docs/MCP.md has client
configs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .common.errors import UserError
from .telemetry.analysis.compare import load_summary
from .telemetry.rundir.jsonl_tail import JsonlTail
from .telemetry.rundir.reader import pid_alive
from .telemetry.rundir.layout import ALERTS, METRICS, RUN_JSON, SAMPLES
from .telemetry.rundir.writer import read_run_info

COMMAND_TIMEOUT_S = 900  # plan, report and replay of a long run finish well within this
MAX_OUTPUT_CHARS = 60_000  # what one tool returns at most: an agent's context is not a log file
ROLLED_BACK = "rolled_back"  # checkpoints set aside by rollback_run, kept rather than deleted


def _mlx_grpo(*args: str, timeout: float = COMMAND_TIMEOUT_S) -> str:
    """Run an `mlx-grpo` command and return what it printed (its error line when it failed)."""
    env = {**os.environ, "COLUMNS": "120", "NO_COLOR": "1"}
    done = subprocess.run([sys.executable, "-m", "mlx_grpo.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    out = done.stdout if done.returncode == 0 else f"exit {done.returncode}\n{done.stderr}{done.stdout}"
    return _bounded(out)


def _bounded(text: str) -> str:
    return text if len(text) <= MAX_OUTPUT_CHARS else text[:MAX_OUTPUT_CHARS] + "\n... (cut)"


def _run_dir(path: str) -> Path:
    run_dir = Path(path).expanduser()
    if not (run_dir / RUN_JSON).is_file():
        raise UserError(f"{run_dir}: not a run directory (no {RUN_JSON})")
    return run_dir


def _records(path: Path) -> list[dict]:
    return JsonlTail(path).poll(final=True).records if path.is_file() else []


def _overrides(overrides: dict[str, Any] | None) -> list[str]:
    return [arg for key, value in (overrides or {}).items() for arg in ("--set", f"{key}={json.dumps(value)}")]


# ------------------------------------------------------------------------ reading


def list_runs(directory: str = "runs") -> list[dict]:
    """The runs in `directory` (and one level below, a sweep's folder), newest first: name, path, status
    (running, finished, interrupted, failed, or crashed when its process is gone), steps done of total, and the
    last reward and accuracies."""
    root = Path(directory).expanduser()
    if not root.is_dir():
        raise UserError(f"{root}: no such directory")
    found = [p for p in root.iterdir() if (p / RUN_JSON).is_file()]
    found += [q for p in root.iterdir() if p.is_dir() and not (p / RUN_JSON).is_file()
              for q in p.iterdir() if (q / RUN_JSON).is_file()]
    runs = []
    for run_dir in sorted(found, key=lambda p: (p / RUN_JSON).stat().st_mtime, reverse=True):
        summary = load_summary(run_dir)
        info = read_run_info(run_dir)
        status = summary.status
        if status == "running" and info is not None and info.pid and not pid_alive(info.pid):
            status = "crashed"
        runs.append({"name": summary.name, "path": str(run_dir), "status": status, "steps": summary.steps,
                     "total_steps": summary.total_steps, "reward": summary.final_reward,
                     "train_accuracy": summary.train_accuracy, "held_out_accuracy": summary.eval_accuracy})
    return runs


def read_metrics(run_dir: str, names: list[str] | None = None, last: int = 20) -> list[dict]:
    """The last `last` metric records of a run (metrics.jsonl); with `names`, only those metrics (a name
    ending in '/' takes every metric under it, e.g. 'rewards/'), besides each record's step."""
    records = _records(_run_dir(run_dir) / METRICS)[-max(1, last):]
    if names:
        records = [{k: v for k, v in r.items() if k == "step" or k in names
                    or any(n.endswith("/") and k.startswith(n) for n in names)} for r in records]
    return records


def read_alerts(run_dir: str, last: int = 50) -> list[dict]:
    """The run's alerts (alerts.jsonl), oldest first, at most the last `last`: step, level, rule, metric, value,
    message. An empty list: no alert so far."""
    return _records(_run_dir(run_dir) / ALERTS)[-max(1, last):]


def read_samples(run_dir: str, last: int = 8) -> list[dict]:
    """The last `last` logged samples (samples.jsonl): step, prompt, completion, expected answer, rewards."""
    return _records(_run_dir(run_dir) / SAMPLES)[-max(1, last):]


def report(run_dir: str) -> str:
    """`mlx-grpo report RUN_DIR`: what happened in the run, the reward functions' quality, alerts, hacking."""
    return _mlx_grpo("report", str(_run_dir(run_dir)))


def plan(config: str | None = None, overrides: dict[str, Any] | None = None) -> str:
    """`mlx-grpo plan [CONFIG] --json`: each phase's predicted peak memory and whether the run fits, with
    config keys overridden by `overrides` (e.g. {"batch_size": 4})."""
    return _mlx_grpo("plan", *([config] if config else []), *_overrides(overrides), "--json")


def replay(run_dir: str, rewards: list[str] | None = None, without: list[str] | None = None,
           steps: str | None = None) -> str:
    """`mlx-grpo replay`: re-score the run's kept completions under another reward set (`rewards`, e.g.
    ["answer_check=2", "my_rewards.py:brevity"]) or without some (`without`, by name), over `steps` ("A:B"),
    and say what GRPO would have learnt differently. No model is loaded."""
    args = ["replay", str(_run_dir(run_dir))]
    args += ["--rewards", *rewards] if rewards else []
    args += ["--without", *without] if without else []
    args += ["--steps", steps] if steps else []
    return _mlx_grpo(*args)


# ------------------------------------------------------------------------ control (--allow-control)


def start_run(config: str | None = None, overrides: dict[str, Any] | None = None, run_name: str | None = None,
              monitoring_dir: str = "runs") -> dict:
    """Start `mlx-grpo train [CONFIG]` in the background (config keys overridden by `overrides`); returns the
    run directory to watch, the process id and the file its console output goes to. The run outlives the
    server."""
    name = run_name or time.strftime("mcp-%Y%m%d-%H%M%S")
    root = Path(monitoring_dir).expanduser().resolve()  # absolute: the agent's folder need not be the server's
    root.mkdir(parents=True, exist_ok=True)
    log = root / f"{name}.console.log"
    args = [sys.executable, "-m", "mlx_grpo.cli", "train", *([config] if config else []), *_overrides(overrides),
            "--run-name", name, "--monitoring-dir", str(root)]
    with log.open("ab") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    return {"run_dir": str(root / name), "pid": process.pid, "console_log": str(log)}


def _running_pid(run_dir: Path) -> int:
    info = read_run_info(run_dir)
    if info is None or info.status != "running" or not info.pid or not pid_alive(info.pid):
        raise UserError(f"{run_dir}: not running (status {info.status if info else 'unknown'})")
    if not _is_trainer(info.pid):
        raise UserError(f"{run_dir}: process {info.pid} is not an mlx-grpo trainer (a reused process id?)")
    return info.pid


def _is_trainer(pid: int) -> bool:
    import psutil

    try:
        return any("mlx_grpo" in part or "mlx-grpo" in part for part in psutil.Process(pid).cmdline())
    except psutil.Error:
        return False


def _wait_for_end(run_dir: Path, pid: int, wait_s: float) -> str:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and pid_alive(pid):
        time.sleep(0.2)
    info = read_run_info(run_dir)
    return info.status if info is not None and info.status else "unknown"


def stop_run(run_dir: str, wait_s: float = 120.0) -> dict:
    """Stop a running run as Ctrl-C does: it finishes its step, writes a checkpoint and ends 'interrupted'
    (continue it with `mlx-grpo train --resume RUN_DIR` or `rollback_run`). Waits up to `wait_s` seconds."""
    path = _run_dir(run_dir)
    pid = _running_pid(path)
    os.kill(pid, signal.SIGTERM)
    return {"run_dir": str(path), "pid": pid, "status": _wait_for_end(path, pid, wait_s)}


def _checkpoint_step(path: Path) -> int | None:
    """The step of a checkpoint directory (checkpoint.py's `step_<N>`; not imported: it imports mlx)."""
    match = re.fullmatch(r"step_(\d+)", path.name)
    return int(match.group(1)) if match and path.is_dir() else None


def rollback_run(run_dir: str, to_step: int, overrides: dict[str, Any] | None = None,
                 wait_s: float = 120.0) -> dict:
    """Roll a run back to its checkpoint at `to_step` and continue from there (with `overrides`, e.g. a lower
    learning_rate): stops it first when it runs, sets the later checkpoints aside in rolled_back/ (kept, not
    deleted), and resumes; the resume cuts the logs back to that step."""
    path = _run_dir(run_dir)
    checkpoints = {step: p for p in (path / "checkpoints").glob("step_*") if (step := _checkpoint_step(p)) is not None}
    steps = sorted(checkpoints)
    if to_step not in steps:
        raise UserError(f"{path}: no checkpoint at step {to_step} (checkpoints: {', '.join(map(str, steps)) or 'none'})")
    info = read_run_info(path)
    status = None
    if info is not None and info.status == "running" and info.pid and pid_alive(info.pid):
        status = stop_run(run_dir, wait_s)["status"]
        if pid_alive(info.pid):
            raise UserError(f"{path}: the run did not stop within {wait_s:g} s; nothing was rolled back")
    kept = path / ROLLED_BACK
    for step in steps:
        if step > to_step:
            kept.mkdir(exist_ok=True)
            shutil.move(str(checkpoints[step]), str(kept / checkpoints[step].name))
    log = path.parent / f"{path.name}.console.log"
    args = [sys.executable, "-m", "mlx_grpo.cli", "train", "--resume", str(path), *_overrides(overrides)]
    with log.open("ab") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    return {"run_dir": str(path), "stopped": status, "resumed_from_step": to_step, "pid": process.pid,
            "console_log": str(log)}


READ_TOOLS = (list_runs, read_metrics, read_alerts, read_samples, report, plan, replay)
CONTROL_TOOLS = (start_run, stop_run, rollback_run)


def build_server(allow_control: bool = False):
    """The MCP server with the read tools, and the control tools when `allow_control`."""
    try:
        from mcp.server.mcpserver import MCPServer as Server  # mcp 2.x
        from mcp.server.mcpserver.exceptions import ToolError
    except ImportError:
        from mcp.server.fastmcp import FastMCP as Server  # mcp 1.x
        from mcp.server.fastmcp.exceptions import ToolError

    server = Server("mlx-grpo", instructions="GRPO runs on this machine: list them, read their metrics, alerts, "
                                             "samples and reports, plan memory, replay rewards"
                                             + ("; start, stop and roll back runs" if allow_control else ""))
    for tool in READ_TOOLS + (CONTROL_TOOLS if allow_control else ()):
        server.tool()(_as_tool_errors(tool, ToolError))
    return server


def _as_tool_errors(tool, tool_error: type[Exception]):
    """`tool` with a UserError raised as the SDK's ToolError: the agent gets its one line as the tool's error
    result (anything else is a crash, reported by the SDK without its message)."""
    import functools

    @functools.wraps(tool)
    def wrapped(*args, **kwargs):
        try:
            return tool(*args, **kwargs)
        except UserError as err:
            raise tool_error(str(err)) from None

    return wrapped

