"""The MCP server gives an agent least privilege (review 4, U1-U5, U8): a read-only server runs no code it is
handed, paths stay inside the folder the server was started in, links out of a run are not followed, replies
are bounded and paged, and stop_run signals only a checked trainer, never a process named by a run.json."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlx_grpo.common.errors import UserError
from mlx_grpo.mcp_server import MAX_OUTPUT_CHARS, MAX_RECORDS, Workspace

EVIL = """import pathlib
pathlib.Path(__file__).with_name("PWNED").write_text("imported")

def f(completions, **kwargs):
    return [0.0 for _ in completions]
"""


def _run(root: Path, name: str = "r", status: str = "finished", **info) -> Path:
    run_dir = root / "runs" / name
    run_dir.mkdir(parents=True)
    record = {"name": name, "status": status, "config": {"rewards": [{"name": "answer_check", "weight": 1.0}]},
              "hostname": socket.gethostname(), **info}
    (run_dir / "run.json").write_text(json.dumps(record))
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "rewards/total/mean": 0.5}) + "\n")
    return run_dir


# ------------------------------------------------------------------ U1: a read-only server runs no code


async def _replay_through_server(cwd: Path, args: list[str]) -> tuple[str, list]:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=sys.executable, args=["-m", "mlx_grpo.cli", "mcp", *args], cwd=str(cwd),
                                   env=dict(os.environ))  # this checkout, not an installed copy
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = (await session.list_tools()).tools
            result = await session.call_tool("replay", {"run_dir": "runs/r", "rewards": ["evil.py:f"]})
            return result.content[0].text, tools


def test_a_read_only_server_never_imports_a_reward_file_an_agent_names(tmp_path):
    (tmp_path / "evil.py").write_text(EVIL)
    _run(tmp_path)
    text, tools = asyncio.run(_replay_through_server(tmp_path, []))
    assert not (tmp_path / "PWNED").exists()  # the marker a hostile reward file writes on import
    assert "read-only" in text and "evil.py:f" in text
    (replay,) = [t for t in tools if t.name == "replay"]
    assert "Built-in reward names only" in replay.description


def test_with_allow_control_reward_files_must_lie_in_the_folder_and_outside_runs(tmp_path):
    root = tmp_path / "work"
    root.mkdir()
    run_dir = _run(root)
    (run_dir / "evil.py").write_text(EVIL)  # a run directory's own code: data, never run
    (tmp_path / "outside.py").write_text(EVIL)
    (root / "mine.py").write_text("def f(completions, **kwargs):\n    return [0.0] * len(completions)\n")
    ws = Workspace(root, allow_control=True)
    with pytest.raises(UserError, match="outside the folder"):
        ws.check_config(None, {"rewards": [f"{tmp_path}/outside.py:f"]})
    with pytest.raises(UserError, match="inside the run directory"):
        ws.check_config(None, {"rewards": ["runs/r/evil.py:f"]})
    with pytest.raises(UserError, match="inside the run directory"):
        ws.replay("runs/r", rewards=["runs/r/evil.py:f=2"])
    with pytest.raises(UserError, match="outside the folder"):
        ws.check_config(None, {"correctness": f"{tmp_path}/outside.py:f"})
    ws.check_config(None, {"rewards": [f"{root}/mine.py:f"]})  # the user's own file, in the folder: allowed
    assert not (run_dir / "PWNED").exists() and not (tmp_path / "PWNED").exists()


def test_no_argument_an_agent_passes_on_is_read_as_an_option(tmp_path):
    (tmp_path / "rubric.yaml").write_text("criteria: []\n")
    _run(tmp_path)
    ws = Workspace(tmp_path)
    with pytest.raises(UserError, match="would be read as an option"):
        ws.replay("runs/r", without=["answer_check", "--rubric-file=rubric.yaml"])
    with pytest.raises(UserError, match="would be read as an option"):
        ws.replay("runs/r", rewards=["--rubric-file=rubric.yaml"])
    from mlx_grpo.mcp_server.records import _overrides

    assert _overrides({"--rubric-file": "x"}) == ['--set=--rubric-file="x"']  # one token: a (bad) config key


# ------------------------------------------------------------------ U2: only a checked trainer is signalled


def _decoy(argv0: str) -> subprocess.Popen:
    return subprocess.Popen(["bash", "-c", f'exec -a "{argv0}" sleep 60'])


@pytest.mark.parametrize("argv0", ["vim /src/mlx-grpo/README.md", "python -m mlx_grpo.cli train --run-name r"])
def test_stop_run_leaves_a_process_that_merely_mentions_mlx_grpo_alone(tmp_path, argv0):
    decoy = _decoy(argv0)
    try:
        time.sleep(0.2)
        _run(tmp_path, status="running", pid=decoy.pid, start_time=time.time() + 3600)
        ws = Workspace(tmp_path, allow_control=True)
        with pytest.raises(UserError, match="does not hold the run's lock"):
            ws.stop_run("runs/r", wait_s=1)
        time.sleep(0.3)
        assert decoy.poll() is None  # it survived
    finally:
        decoy.kill()
        decoy.wait()


HOLDER = """import fcntl, os, signal, sys, time
f = open(sys.argv[1], "a+"); fcntl.flock(f, fcntl.LOCK_EX); f.seek(0); f.truncate(); f.write(f"{os.getpid()}\\n"); f.flush()
print("locked", flush=True)
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
time.sleep(60)
"""


def test_stop_run_signals_the_process_that_holds_the_runs_lock_and_refuses_a_younger_one(tmp_path):
    run_dir = _run(tmp_path, status="running")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir / ".lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        info = json.loads((run_dir / "run.json").read_text())
        ws = Workspace(tmp_path, allow_control=True)
        (run_dir / "run.json").write_text(json.dumps({**info, "pid": holder.pid, "start_time": time.time() - 3600}))
        with pytest.raises(UserError, match="started after the run's session"):  # a reused pid: born later
            ws.stop_run("runs/r", wait_s=1)
        (run_dir / "run.json").write_text(json.dumps({**info, "pid": holder.pid, "start_time": time.time(),
                                                      "hostname": "another-machine"}))
        with pytest.raises(UserError, match="another machine"):
            ws.stop_run("runs/r", wait_s=1)
        assert holder.poll() is None
        (run_dir / "run.json").write_text(json.dumps({**info, "pid": holder.pid, "start_time": time.time()}))
        assert ws.stop_run("runs/r", wait_s=10)["pid"] == holder.pid
        assert holder.wait(timeout=10) == 0  # SIGTERM, handled as the trainer handles it
    finally:
        holder.kill()
        holder.wait()


def test_a_trainer_the_server_started_is_reaped_so_stop_run_does_not_wait_on_a_zombie(tmp_path):
    run_dir = _run(tmp_path, status="running")
    ws = Workspace(tmp_path, allow_control=True)
    process = subprocess.Popen(["sleep", "60"], start_new_session=True)
    ws.started[process.pid] = (process, run_dir)
    began = time.monotonic()
    result = ws.stop_run("runs/r", wait_s=60)
    assert result["pid"] == process.pid and time.monotonic() - began < 10
    assert process.returncode == -signal.SIGTERM and not ws.started  # collected: no zombie left


# ------------------------------------------------------------------ U3, U8: a run name is one folder name


@pytest.mark.parametrize("name", ["ABS", "../../escape", "a/b/c", "..", "bad\x1bname"])
def test_start_run_refuses_a_run_name_that_is_not_one_folder_name_before_touching_the_disk(tmp_path, name):
    root = tmp_path / "a" / "b"
    root.mkdir(parents=True)
    name = str(tmp_path / "abs") if name == "ABS" else name
    ws = Workspace(root, allow_control=True)
    with pytest.raises(UserError, match="expected a plain name"):
        ws.start_run(run_name=name, overrides={"num_steps": 1})
    assert not ws.started and not list(tmp_path.rglob("*.console.log")) and not (root / "runs").exists()


def test_start_run_refuses_a_monitoring_dir_outside_the_folder(tmp_path):
    ws = Workspace(tmp_path / "in", allow_control=True)
    (tmp_path / "in").mkdir()
    with pytest.raises(UserError, match="outside the folder"):
        ws.start_run(run_name="x", monitoring_dir=str(tmp_path / "elsewhere"))
    assert not (tmp_path / "elsewhere").exists() and not ws.started


# ------------------------------------------------------------------ U4: bounded replies, with paging


def test_read_samples_cuts_a_huge_completion_and_bounds_the_reply(tmp_path):
    run_dir = _run(tmp_path)
    with open(run_dir / "samples.jsonl", "w") as f:
        f.write(json.dumps({"step": 1, "prompt": "p", "completion": "x" * 30_000_000}) + "\n")
        for step in (2, 3):
            f.write(json.dumps({"step": step, "prompt": "p", "completion": "y" * 1_000_000}) + "\n")
    reply = Workspace(tmp_path).read_samples("runs/r")
    assert len(json.dumps(reply)) < MAX_OUTPUT_CHARS
    assert [r["step"] for r in reply["records"]] == [2, 3] and reply["skipped_lines"] == 1
    assert reply["records"][0]["completion"].endswith("(998000 characters cut)")


def test_read_metrics_is_bounded_and_pages_back_through_every_record(tmp_path):
    run_dir = _run(tmp_path)
    with open(run_dir / "metrics.jsonl", "w") as f:
        for step in range(1, 60_001):
            f.write(json.dumps({"step": step, "rewards/total/mean": step / 10, "policy/kl": 0.1}) + "\n")
    ws = Workspace(tmp_path)
    reply = ws.read_metrics("runs/r", last=10**9)
    assert len(reply["records"]) <= MAX_RECORDS and len(json.dumps(reply)) <= MAX_OUTPUT_CHARS
    assert reply["records"][-1]["step"] == 60_000
    steps, before = [], None
    for _ in range(400):
        page = ws.read_metrics("runs/r", names=["rewards/"], last=200, before=before)
        steps = [r["step"] for r in page["records"]] + steps
        before = page["before"]
        if before is None:
            break
    assert steps == list(range(1, 60_001))  # every record once, in order


def test_list_runs_is_bounded_and_pages(tmp_path):
    for i in range(105):
        _run(tmp_path, name=f"r{i:03d}")
    ws = Workspace(tmp_path)
    first = ws.list_runs("runs")
    second = ws.list_runs("runs", skip=100)
    assert len(first["runs"]) == 100 and first["more"] == 5 and len(second["runs"]) == 5 and second["more"] == 0
    assert {r["name"] for r in first["runs"] + second["runs"]} == {f"r{i:03d}" for i in range(105)}


# ------------------------------------------------------------------ U5 and the folder: no way out


def test_a_metrics_file_linked_out_of_the_run_is_not_read(tmp_path):
    secret = tmp_path / "secret.jsonl"
    secret.write_text(json.dumps({"step": 1, "api_key": "sk-SECRET"}) + "\n")
    run_dir = _run(tmp_path / "work")
    (run_dir / "metrics.jsonl").unlink()
    (run_dir / "metrics.jsonl").symlink_to(secret)
    ws = Workspace(tmp_path / "work")
    for call in (lambda: ws.read_metrics("runs/r"), lambda: ws.read_alerts("runs/r"), lambda: ws.report("runs/r")):
        with pytest.raises(UserError, match="symbolic link that leads out"):
            call()
    (listed,) = ws.list_runs("runs")["runs"]
    assert "sk-SECRET" not in json.dumps(listed) and "leads out" in listed["note"]


def test_paths_outside_the_folder_are_refused_even_through_a_link(tmp_path):
    outside = _run(tmp_path / "outside")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "link").symlink_to(outside)
    ws = Workspace(tmp_path / "work")
    for path in (str(outside), "../outside/runs/r", "link"):
        with pytest.raises(UserError, match="outside the folder"):
            ws.read_metrics(path)
    with pytest.raises(UserError, match="outside the folder"):
        ws.list_runs(str(tmp_path))
    with pytest.raises(UserError, match="outside the folder"):
        ws.plan(config=str(tmp_path / "cfg.yaml"))
