"""The folder one server may touch and the tools it offers there: read runs, plan, replay; with control,
start, stop and roll back runs it can prove are its own to signal."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..common.errors import UserError
from ..common.terminal import terminal_safe
from ..config.run_code import is_user_code
from ..telemetry.metrics.names import ACCURACY_TRAIN, EVAL_ACCURACY, REWARD_MEAN
from ..telemetry.reward_names import translate_reward
from ..telemetry.rundir.layout import ALERTS, FINAL_METRICS, METRICS, RUN_JSON, SAMPLES, RunPaths
from ..telemetry.rundir.reader import pid_alive
from ..telemetry.rundir.writer import read_json_object, read_run_info
from .records import MAX_RECORDS, _bounded, _cut_strings, _overrides, _page, _plain_values, tail_records
from .runs import (
    MAX_RUNS,
    _check_run_name,
    _checkpoint_step,
    _entries,
    _is_run,
    _last_line,
    _link_out,
    _lock_holder,
    _mtime,
    _start_time,
)

COMMAND_TIMEOUT_S = 900  # plan, report and replay of a long run finish well within this
START_WAIT_S = 600  # start_run waits this long at most for the run directory (the model loads first)
ROLLED_BACK = "rolled_back"  # checkpoints set aside by rollback_run, kept rather than deleted
CLOCK_SLACK_S = 2.0  # a process's start time and run.json's are read from two clocks' roundings


@dataclass
class Workspace:
    """What one server may touch: the folder it was started in (`root`), whether it may act, and the
    trainers it started (pid -> process, run directory)."""

    root: Path
    allow_control: bool = False
    started: dict[int, tuple[subprocess.Popen, Path]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.root = Path(os.path.realpath(self.root))

    # ------------------------------------------------------------------ paths

    def inside(self, path: str, what: str) -> Path:
        """`path` (relative to the workspace) with its links resolved; UserError when it leads outside."""
        if not isinstance(path, str) or not path or "\x00" in path:
            raise UserError(f"{what}: expected a path inside {terminal_safe(str(self.root))}")
        given = Path(path).expanduser()
        resolved = Path(os.path.realpath(given if given.is_absolute() else self.root / given))
        if resolved != self.root and self.root not in resolved.parents:
            raise UserError(f"{what} {terminal_safe(path)!r} leads to {terminal_safe(str(resolved))}, outside the "
                            f"folder this server was started in ({terminal_safe(str(self.root))}); this server "
                            "reads and writes only inside it")
        return resolved

    def run_dir(self, path: str) -> Path:
        """A run directory inside the workspace that holds no link leading out of it."""
        run_dir = self.inside(path, "run_dir")
        try:
            is_run = stat.S_ISREG(os.lstat(run_dir / RUN_JSON).st_mode)
        except OSError:
            is_run = False
        if not is_run:
            raise UserError(f"{terminal_safe(path)}: not a run directory (no {RUN_JSON})")
        leak = _link_out(run_dir)
        if leak is not None:
            raise UserError(f"{terminal_safe(path)}: {terminal_safe(leak)} is a symbolic link that leads out of the "
                            "run directory; a run directory's files are read only from inside it")
        return run_dir

    # ------------------------------------------------------------------ reading

    def list_runs(self, directory: str = "runs", skip: int = 0) -> dict:
        """The runs in `directory` (and one level below, a sweep's folder), newest first, at most 100 from the
        `skip`-th: name, path, status (running, finished, interrupted, failed, or crashed when its process is
        gone), steps done of total, and the last reward and accuracies. `more`: runs left after these."""
        root = self.inside(directory, "directory")
        if not root.is_dir():
            raise UserError(f"{terminal_safe(directory)}: no such directory")
        found = []
        for entry in _entries(root):
            if _is_run(entry):
                found.append(entry)
            elif entry.is_dir() and not entry.is_symlink():
                found += [sub for sub in _entries(entry) if _is_run(sub)]
        found.sort(key=lambda p: _mtime(p / RUN_JSON), reverse=True)
        skip = max(0, int(skip))
        runs = [self._summary(p) for p in found[skip:skip + MAX_RUNS]]
        return {"runs": runs, "more": max(0, len(found) - skip - MAX_RUNS)}

    def _summary(self, run_dir: Path) -> dict:
        info = read_run_info(run_dir, display=True)
        status = (info.status if info else None) or "unknown"
        if status == "running" and info is not None and info.pid and info.hostname in (None, socket.gethostname()) \
                and not pid_alive(info.pid):
            status = "crashed"
        leak = _link_out(run_dir)
        last: dict[str, Any] = {}
        if leak is None:
            for _, record in tail_records(run_dir / METRICS, 50)[0]:
                last.update({k: v for k, v in record.items()
                             if isinstance(v, (int, float)) and not isinstance(v, bool)})
        final = (read_json_object(run_dir / FINAL_METRICS, display=True) or {}) if leak is None else {}
        held_out = final.get(EVAL_ACCURACY, last.get(EVAL_ACCURACY))
        return {"name": _cut_strings((info.name if info else None) or run_dir.name), "path": str(run_dir),
                "status": _cut_strings(status), "steps": last.get("step", 0),
                "total_steps": info.total_steps if info else None, "reward": last.get(REWARD_MEAN),
                "train_accuracy": last.get(ACCURACY_TRAIN),
                "held_out_accuracy": held_out if isinstance(held_out, (int, float)) else None,
                **({"note": f"{leak} leads out of the run directory; not read"} if leak else {})}

    def read_metrics(self, run_dir: str, names: list[str] | None = None, last: int = 20,
                     before: int | None = None) -> dict:
        """The last `last` (at most 200) metric records of a run (metrics.jsonl); with `names`, only those
        metrics (a name ending in '/' takes every metric under it, e.g. 'rewards/'), besides each record's
        step. Returns {"records": [...], "before": cursor}: pass `before` back to read the records before
        these (null: there are none). Long strings are cut; a reply is at most 60,000 characters."""
        return self._read(run_dir, METRICS, last, before, names)

    def read_alerts(self, run_dir: str, last: int = 50, before: int | None = None) -> dict:
        """The run's alerts (alerts.jsonl), oldest first, at most the last `last` (200 at most): step, level,
        rule, metric, value, message; {"records": [], ...}: no alert so far. `before` pages back as in
        read_metrics."""
        return self._read(run_dir, ALERTS, last, before)

    def read_samples(self, run_dir: str, last: int = 8, before: int | None = None) -> dict:
        """The last `last` logged samples (samples.jsonl, 200 at most): step, prompt, completion, expected
        answer, rewards. Strings longer than 2,000 characters are cut, lines longer than 4 MB skipped (counted in
        `skipped_lines`); `before` pages back as in read_metrics."""
        return self._read(run_dir, SAMPLES, last, before)

    def _read(self, run_dir: str, name: str, last: int, before: int | None, names: list[str] | None = None) -> dict:
        path = self.run_dir(run_dir) / name
        count = max(1, min(int(last), MAX_RECORDS))
        found, scanned_to, skipped = tail_records(path, count, before)
        if names:
            found = [(start, {k: v for k, v in r.items() if k == "step" or k in names
                              or any(n.endswith("/") and k.startswith(n) for n in names)}) for start, r in found]
        return _page(found, scanned_to, skipped)

    def report(self, run_dir: str) -> str:
        """`mlx-grpo report RUN_DIR --no-write`: what happened in the run, the reward functions' quality, alerts,
        hacking (nothing is written into the run directory)."""
        return self.command("report", str(self.run_dir(run_dir)), "--no-write")

    def plan(self, config: str | None = None, overrides: dict[str, Any] | None = None) -> str:
        """`mlx-grpo plan [CONFIG] --json`: each phase's predicted peak memory and whether the run fits, with
        config keys overridden by `overrides` (e.g. {"batch_size": 4}). No reward code is imported."""
        return self.command("plan", *([str(self.inside(config, "config"))] if config else []),
                            *_overrides(overrides), "--json")

    def replay(self, run_dir: str, rewards: list[str] | None = None, without: list[str] | None = None,
               steps: str | None = None) -> str:
        """`mlx-grpo replay`: re-score the run's kept completions under another reward set (`rewards`, e.g.
        ["answer_check=2", "digit_match"]) or without some (`without`, by name), over `steps` ("A:B"), and
        say what GRPO would have learnt differently. No model is loaded. Built-in reward names only; a
        file.py:function reward is refused (this server runs no code it is given)."""
        path = self.run_dir(run_dir)
        for spec in _plain_values("rewards", rewards or []):
            self.check_code(spec.rpartition("=")[0] if "=" in spec else spec, "rewards")
        args = ["replay", str(path)]
        args += ["--rewards", *rewards] if rewards else []
        args += ["--without", *_plain_values("without", without)] if without else []
        args += [f"--steps={steps}"] if steps else []
        return self.command(*args)

    def check_code(self, spec: Any, what: str, base: Path | None = None) -> None:
        """Refuse a spec that names a file of code: always on a read-only server, and with --allow-control
        when the file is not inside the workspace."""
        if not isinstance(spec, str) or not is_user_code(spec):
            return
        if not self.allow_control:
            raise UserError(f"{what} {terminal_safe(spec)!r} names a file of code; this server is read-only and runs "
                            "no code (built-in reward names only). Run replay from a shell, or start the server "
                            "with --allow-control to use reward files inside its folder")
        file_part = translate_reward(spec)[0].rpartition(":")[0]
        self.code_file(file_part, what, base)

    def code_file(self, file: str, what: str, base: Path | None = None) -> Path:
        """A file a run would import or obey (a reward file, a rubric): inside the workspace, and not inside a
        run directory (a run directory is data, whoever made it)."""
        given = Path(file).expanduser()
        path = self.inside(str(given if given.is_absolute() else (base or self.root) / given), what)
        for folder in path.parents:
            if folder == self.root or self.root not in folder.parents:
                break
            if os.path.lexists(folder / RUN_JSON):
                raise UserError(f"{what} {terminal_safe(file)!r} lies inside the run directory "
                                f"{terminal_safe(str(folder))}; "
                                "a run directory is data: its files are never run by this server")
        return path

    def command(self, *args: str, timeout: float = COMMAND_TIMEOUT_S) -> str:
        """Run an `mlx-grpo` command in the workspace and return what it printed (its error when it failed)."""
        self.reap()
        env = {**os.environ, "COLUMNS": "120", "NO_COLOR": "1"}
        try:
            done = subprocess.run([sys.executable, "-m", "mlx_grpo.cli", *args], capture_output=True, text=True,
                                  timeout=timeout, env=env, stdin=subprocess.DEVNULL, cwd=self.root,
                                  errors="replace")
        except subprocess.TimeoutExpired:
            raise UserError(f"mlx-grpo {args[0]} did not finish within {timeout:g} s") from None
        out = done.stdout if done.returncode == 0 else f"exit {done.returncode}\n{done.stderr}{done.stdout}"
        return _bounded(out)

    # ------------------------------------------------------------------ control (--allow-control)

    def start_run(self, config: str | None = None, overrides: dict[str, Any] | None = None,
                  run_name: str | None = None, monitoring_dir: str = "runs") -> dict:
        """Start `mlx-grpo train [CONFIG]` in the background (config keys overridden by `overrides`) and return
        once its run directory exists (the model loads first; up to 10 minutes): the run directory, the
        process id and the file its console output goes to. The run outlives the server. Reward,
        correctness and rubric files must lie inside the server's folder."""
        name = run_name if run_name is not None else time.strftime("mcp-%Y%m%d-%H%M%S")
        _check_run_name(name)
        root = self.inside(monitoring_dir, "monitoring_dir")
        config_path = self.inside(config, "config") if config else None
        self.check_config(config_path, overrides)
        run_dir = root / name
        if os.path.lexists(run_dir):
            raise UserError(f"run_name {name!r}: {terminal_safe(str(run_dir))} exists already; choose another name")
        root.mkdir(parents=True, exist_ok=True)
        log = root / f"{name}.console.log"
        args = ["train", *([str(config_path)] if config_path else []), *_overrides(overrides),
                "--run-name", name, "--monitoring-dir", str(root)]
        process = self.spawn(args, log, run_dir)
        deadline = time.monotonic() + START_WAIT_S
        while not (run_dir / RUN_JSON).is_file() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if process.poll() is not None and not (run_dir / RUN_JSON).is_file():
            raise UserError(f"the run ended before it started (exit {process.returncode}): {_last_line(log)}")
        return {"run_dir": str(run_dir), "pid": process.pid, "console_log": str(log),
                "started": (run_dir / RUN_JSON).is_file()}

    def check_config(self, config_path: Path | None, overrides: dict[str, Any] | None) -> None:
        """The reward, correctness and rubric files a run would import, all inside the workspace."""
        from ..config.aliases import translate
        from ..config.paths import resolve_input_paths
        from ..config.train_config import load_config, top_level_fields_all

        # the trainer runs in the workspace: its command-line paths resolve there, whatever this process's folder
        typed = resolve_input_paths(translate(dict(overrides), "command line", known=top_level_fields_all()),
                                    self.root) if overrides else None
        config = load_config(config_path, typed)
        base = config_path.parent if config_path else self.root
        for spec in config.rewards:
            self.check_code(spec.name, "rewards", base)
        self.check_code(config.correctness, "correctness", base)
        for key in ("rubric_file", "alerts_file"):
            if getattr(config, key):
                self.code_file(getattr(config, key), key, base)

    def spawn(self, args: list[str], log: Path, run_dir: Path) -> subprocess.Popen:
        """`mlx-grpo ARGS` in its own session, output appended to `log`, recorded as this server's."""
        try:
            fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        except OSError as err:
            raise UserError(f"{terminal_safe(str(log))}: cannot write the console log "
                            f"({err.strerror or err})") from None
        with os.fdopen(fd, "ab") as out:
            process = subprocess.Popen([sys.executable, "-m", "mlx_grpo.cli", *args], stdout=out,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.root,
                                       start_new_session=True)
        self.started[process.pid] = (process, run_dir)
        return process

    def reap(self) -> None:
        """Collect the exit of every trainer this server started that has ended (no zombie is left)."""
        for pid, (process, _) in list(self.started.items()):
            if process.poll() is not None:
                del self.started[pid]

    def trainer_pid(self, run_dir: Path) -> int:
        """The process training `run_dir`, checked: one this server started, or the one run.json names, on
        this machine, holding the run's lock and started no later than the session run.json records."""
        self.reap()
        for pid, (process, started_dir) in self.started.items():
            if started_dir == run_dir and process.poll() is None:
                return pid
        info = read_run_info(run_dir)
        shown = terminal_safe(str(run_dir))
        if info is None or info.status != "running" or not info.pid or not pid_alive(info.pid):
            raise UserError(f"{shown}: not running (status {terminal_safe(str(info.status if info else 'unknown'))})")
        if info.hostname != socket.gethostname():
            raise UserError(f"{shown}: its run.json names another machine ({terminal_safe(str(info.hostname))}); "
                            "nothing was signalled")
        holder = _lock_holder(run_dir)
        if holder != info.pid:
            raise UserError(f"{shown}: process {info.pid} does not hold the run's lock (a reused process id, or not "
                            "a trainer); nothing was signalled")
        session = info.last_session_start
        born = _start_time(info.pid)
        if session is None or born is None or born > session + CLOCK_SLACK_S:
            raise UserError(f"{shown}: process {info.pid} started after the run's session did (a reused process "
                            "id); nothing was signalled")
        return info.pid

    def alive(self, pid: int) -> bool:
        """Whether `pid` still runs; a trainer this server started is reaped when it has ended (a zombie
        would look alive to any other test)."""
        if pid in self.started:
            return self.started[pid][0].poll() is None
        return pid_alive(pid)

    def wait_for_end(self, run_dir: Path, pid: int, wait_s: float) -> str:
        deadline = time.monotonic() + max(0.0, float(wait_s))
        while time.monotonic() < deadline and self.alive(pid):
            time.sleep(0.2)
        self.reap()
        info = read_run_info(run_dir, display=True)
        return info.status if info is not None and info.status else "unknown"

    def stop_run(self, run_dir: str, wait_s: float = 120.0) -> dict:
        """Stop a running run as Ctrl-C does: it finishes its step, writes a checkpoint and ends 'interrupted'
        (continue it with `mlx-grpo train --resume RUN_DIR` or `rollback_run`). Waits up to `wait_s` seconds.
        Only a trainer this server started, or the checked trainer of a run of this machine, is signalled."""
        path = self.run_dir(run_dir)
        pid = self.trainer_pid(path)
        os.kill(pid, signal.SIGTERM)
        return {"run_dir": str(path), "pid": pid, "status": self.wait_for_end(path, pid, wait_s)}

    def rollback_run(self, run_dir: str, to_step: int, overrides: dict[str, Any] | None = None,
                     wait_s: float = 120.0) -> dict:
        """Roll a run back to its checkpoint at `to_step` and continue from there (with `overrides`, e.g. a lower
        learning_rate): stops it first when it runs, sets the later checkpoints aside in rolled_back/ (kept, not
        deleted), and resumes; the resume cuts the logs back to that step."""
        path = self.run_dir(run_dir)
        checkpoints = {step: p for p in _entries(RunPaths(path).checkpoints)
                       if (step := _checkpoint_step(p)) is not None}
        steps = sorted(checkpoints)
        if to_step not in steps:
            raise UserError(f"{terminal_safe(str(path))}: no checkpoint at step {to_step} (checkpoints: "
                            f"{', '.join(map(str, steps)) or 'none'})")
        self.check_config(None, overrides)
        info = read_run_info(path)
        status = None
        if info is not None and info.status == "running" and info.pid and pid_alive(info.pid):
            stopped = self.stop_run(str(path), wait_s)
            status = stopped["status"]
            if self.alive(stopped["pid"]):
                raise UserError(f"{terminal_safe(str(path))}: the run did not stop within {wait_s:g} s; nothing was "
                                "rolled back")
        kept = path / ROLLED_BACK
        for step in steps:
            if step > to_step:
                kept.mkdir(exist_ok=True)
                shutil.move(str(checkpoints[step]), str(kept / checkpoints[step].name))
        log = path.parent / f"{path.name}.console.log"
        process = self.spawn(["train", "--resume", str(path), *_overrides(overrides)], log, path)
        return {"run_dir": str(path), "stopped": status, "resumed_from_step": to_step, "pid": process.pid,
                "console_log": str(log)}


