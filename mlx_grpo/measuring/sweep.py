"""Hyper-parameter sweeps: grid or random search over run-config keys, one run directory per trial.

A sweep file (YAML; format in docs/SWEEPS.md):

    name: lr-beta                 # default: the file name; also the W&B group of every trial
    base: default.yaml            # run config the trials start from (relative to this file); default: built-in
    method: grid                  # grid (every combination) | random (`trials` draws)
    trials: 8                     # random only
    seed: 0                       # random only
    output_dir: sweeps            # trials go to <output_dir>/<name>/trial-NNN (relative to the current directory)
    fixed: {num_steps: 100}       # keys every trial sets
    parameters:                   # any config key, nested ones dotted (adaptive_window.enable)
      beta: [0.0, 0.04]                                                # values
      epsilon: {min: 0.1, max: 0.3, step: 0.1}                         # a range
      learning_rate: {min: 5.0e-5, max: 2.0e-4, distribution: log_uniform, num: 3}

Grid search needs discrete parameters (values, or a range with `step` or `num`); random search draws
ranges continuously (log-uniform when asked), integers for integer keys. Every trial's config is
checked before anything runs. Trials run as `mlx-grpo train` subprocesses, one after another or
several at once; a trial whose run.json says `finished` is not run again, an unfinished one is
resumed from its last checkpoint. Ctrl-C or SIGTERM stops the sweep and sends each running trial
one SIGTERM (it finishes its step and checkpoints). `sweep.json` in the sweep directory records the
plan, so a changed sweep file is noticed instead of mixing two sweeps in one directory. Imports no mlx.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..common.errors import UserError
from ..common.terminal import terminal_safe
from ..config.train_config import TrainConfig
from ..config.typed_yaml import build_dataclass, nest, read_yaml_mapping
from ..planning.machine import MEMORY_SHARE_ENV
from ..telemetry.rundir.writer import read_run_info

TOP_KEYS = ("name", "base", "method", "trials", "seed", "output_dir", "fixed", "parameters")
RANGE_KEYS = ("values", "min", "max", "step", "num", "distribution")
DISTRIBUTIONS = ("uniform", "log_uniform")
# Set by the sweep for each trial: a sweep file may not choose them.
SWEEP_OWNED = ("run_name", "monitoring_dir")
MANIFEST = "sweep.json"
MAX_TRIALS = 10_000  # a sweep larger than this is a typo (each trial is a training run)


@dataclass(frozen=True)
class Parameter:
    key: str
    values: tuple | None = None
    low: float | None = None
    high: float | None = None
    step: float | None = None
    num: int | None = None
    log: bool = False
    integer: bool = False

    def count(self) -> int | None:
        """How many discrete values a grid tries (None when continuous), without listing them."""
        if self.values is not None:
            return len(self.values)
        if self.num is not None:
            return self.num
        if self.step is not None:
            return int(math.floor((self.high - self.low) / self.step + 1e-9)) + 1
        return None

    def point(self, i: int) -> Any:
        """The i-th discrete value (0 <= i < count())."""
        if self.values is not None:
            return self.values[i]
        if self.num is not None:
            if self.num == 1:
                p = self.low
            elif self.log:
                p = self.low * ((self.high / self.low) ** (1 / (self.num - 1))) ** i
            else:
                p = self.low + (self.high - self.low) * i / (self.num - 1)
        else:
            p = self.low + i * self.step
        # round away float noise (0.1 + 2 * 0.1 = 0.30000000000000004) so run configs read as written
        return int(round(p)) if self.integer else float(f"{p:.10g}")

    def grid(self) -> list | None:
        """The discrete values a grid search tries (None when the parameter is continuous)."""
        count = self.count()
        return None if count is None else [self.point(i) for i in range(count)]

    def draw(self, rng: random.Random) -> Any:
        count = self.count()
        if count is not None:
            return self.point(rng.randrange(count))  # the draw rng.choice(grid) makes, without the list
        if self.log:
            value = math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        else:
            value = rng.uniform(self.low, self.high)
        return int(round(value)) if self.integer else value


@dataclass
class Trial:
    name: str
    params: dict[str, Any]


@dataclass
class SweepSpec:
    path: Path
    name: str
    base: Path | None
    method: str
    trials: int | None
    seed: int
    directory: Path
    fixed: dict[str, Any] = field(default_factory=dict)
    parameters: list[Parameter] = field(default_factory=list)


# ----------------------------------------------------------------------------- reading the sweep file

def _key_type(dotted: str) -> Any:
    """The annotated type of a (dotted) TrainConfig key, or None when there is no such key."""
    cls: Any = TrainConfig
    tp: Any = None
    for part in dotted.split("."):
        if not dataclasses.is_dataclass(cls):
            return None
        hints = typing.get_type_hints(cls)
        if part not in {f.name for f in dataclasses.fields(cls)}:
            return None
        tp = cls = hints[part]
    return tp


def _check_key(path: Path, where: str, key: str) -> Any:
    tp = _key_type(key)
    if tp is None:
        names = [f.name for f in dataclasses.fields(TrainConfig)]
        close = difflib.get_close_matches(key.split(".")[0], names, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise UserError(f"{path}: key '{where}.{key}' is not a run-config key{hint}")
    if key in SWEEP_OWNED:
        raise UserError(f"{path}: key '{where}.{key}' is set by the sweep itself (one run directory per trial)")
    return tp


def _is_int_key(tp: Any) -> bool:
    args = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
    return args[0] is int


def _number(path: Path, where: str, value: Any) -> float:
    try:
        number = None if isinstance(value, bool) or not isinstance(value, (int, float)) else float(value)
    except OverflowError:  # an int beyond float's range
        number = None
    if number is None or not math.isfinite(number):
        raise UserError(f"{path}: key '{where}' is {str(value)[:40]}; expected a finite number")
    return number


def _parameter(path: Path, key: str, raw: Any) -> Parameter:
    where = f"parameters.{key}"
    integer = _is_int_key(_check_key(path, "parameters", key))
    if isinstance(raw, list):
        raw = {"values": raw}
    if not isinstance(raw, dict):
        raise UserError(f"{path}: key '{where}' is {raw!r}; expected a list of values or a mapping with "
                        f"values, or min and max")
    unknown = sorted(set(raw) - set(RANGE_KEYS))
    if unknown:
        raise UserError(f"{path}: unknown key '{where}.{unknown[0]}' (expected {', '.join(RANGE_KEYS)})")
    if "values" in raw:
        values = raw["values"]
        if not isinstance(values, list) or not values:
            raise UserError(f"{path}: key '{where}.values' must be a non-empty list")
        if set(raw) != {"values"}:
            raise UserError(f"{path}: key '{where}' has values and a range; give one of them")
        return Parameter(key, values=tuple(values))
    if "min" not in raw or "max" not in raw:
        raise UserError(f"{path}: key '{where}' needs values, or min and max")
    low, high = _number(path, f"{where}.min", raw["min"]), _number(path, f"{where}.max", raw["max"])
    if low > high:
        raise UserError(f"{path}: key '{where}': min {low:g} is above max {high:g}")
    distribution = raw.get("distribution", "uniform")
    if distribution not in DISTRIBUTIONS:
        raise UserError(f"{path}: key '{where}.distribution' is {distribution!r}; expected one of "
                        f"{', '.join(DISTRIBUTIONS)}")
    log = distribution == "log_uniform"
    if log and low <= 0:
        raise UserError(f"{path}: key '{where}': a log_uniform range needs min > 0, got {low:g}")
    step = _number(path, f"{where}.step", raw["step"]) if "step" in raw else None
    if step is not None and (step <= 0 or log):
        raise UserError(f"{path}: key '{where}.step' must be positive, on a uniform range (use num for log_uniform)")
    num = raw.get("num")
    if num is not None and (isinstance(num, bool) or not isinstance(num, int) or num < 1):
        raise UserError(f"{path}: key '{where}.num' is {num!r}; expected a whole number of points, at least 1")
    if step is not None and num is not None:
        raise UserError(f"{path}: key '{where}' has both step and num; give one of them")
    return Parameter(key, low=low, high=high, step=step, num=num, log=log, integer=integer)


def load_sweep(path: str | Path) -> SweepSpec:
    """Read and check a sweep file; every problem names the file and the key."""
    path = Path(path)
    raw = read_yaml_mapping(path)
    unknown = sorted(set(raw) - set(TOP_KEYS))
    if unknown:
        close = difflib.get_close_matches(unknown[0], TOP_KEYS, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise UserError(f"{path}: unknown key '{unknown[0]}'{hint}")
    here = path.resolve().parent
    name = str(raw.get("name") or path.stem)
    if not name or "/" in name or name.startswith(".") or not name.isprintable():  # printed and made a directory
        raise UserError(f"{path}: key 'name' is {name!r}; expected a plain directory name")
    base = None
    if raw.get("base") is not None:
        base = Path(raw["base"]).expanduser()
        base = base if base.is_absolute() else here / base
        if not base.is_file():
            raise UserError(f"{path}: key 'base': config file {base} not found")
    method = raw.get("method", "grid")
    if method not in ("grid", "random"):
        raise UserError(f"{path}: key 'method' is {method!r}; expected grid or random")
    trials = raw.get("trials")
    if method == "random" and (isinstance(trials, bool) or not isinstance(trials, int) or trials < 1):
        raise UserError(f"{path}: key 'trials' is {trials!r}; random search needs a number of trials (at least 1)")
    if method == "grid" and trials is not None:
        raise UserError(f"{path}: key 'trials' is only for method: random (a grid runs every combination)")
    seed = raw.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise UserError(f"{path}: key 'seed' is {seed!r}; expected an integer")
    fixed = raw.get("fixed") or {}
    parameters = raw.get("parameters") or {}
    for key, value in (("fixed", fixed), ("parameters", parameters)):
        if not isinstance(value, dict):
            raise UserError(f"{path}: key '{key}' must be a mapping of config keys")
    for key in fixed:
        _check_key(path, "fixed", str(key))
    if not parameters:
        raise UserError(f"{path}: key 'parameters' is empty; name at least one config key to vary")
    params = [_parameter(path, str(key), value) for key, value in parameters.items()]
    both = sorted(set(fixed) & set(parameters))
    if both:
        raise UserError(f"{path}: key '{both[0]}' is both fixed and a parameter")
    if method == "grid":
        for p in params:
            if p.count() is None:
                raise UserError(f"{path}: key 'parameters.{p.key}': a grid needs values, or a range with step or num "
                                f"(or use method: random)")
    # counted before any trial is built: a mistyped step (1e-6 for 0.1) must not fill the memory, even in --dry-run
    count = trials if method == "random" else math.prod(p.count() for p in params)
    if count > MAX_TRIALS:
        sizes = " x ".join(f"{p.key} {p.count()}" for p in params) if method == "grid" else f"trials: {trials}"
        raise UserError(f"{path}: {count:,} trials ({sizes}); at most {MAX_TRIALS:,}: check each step, num and "
                        f"trials")
    output = Path(raw.get("output_dir", "sweeps")).expanduser()
    # outputs go where the user stands; the base config is found next to the sweep file
    directory = (output if output.is_absolute() else Path.cwd() / output) / name
    return SweepSpec(path, name, base, method, trials, seed, directory, dict(fixed), params)


# ----------------------------------------------------------------------------- the plan

def plan_trials(spec: SweepSpec) -> list[Trial]:
    if spec.method == "grid":
        combos = itertools.product(*[p.grid() for p in spec.parameters])
        choices = [dict(zip([p.key for p in spec.parameters], combo)) for combo in combos]
    else:
        rng = random.Random(spec.seed)
        choices = [{p.key: p.draw(rng) for p in spec.parameters} for _ in range(spec.trials)]
    width = max(3, len(str(len(choices) - 1)))
    return [Trial(f"trial-{i:0{width}d}", params) for i, params in enumerate(choices)]


def trial_config(spec: SweepSpec, trial: Trial) -> TrainConfig:
    """The full run config of one trial, checked like `mlx-grpo train` would check it."""
    config = TrainConfig()
    if spec.base is not None:
        config = build_dataclass(TrainConfig, read_yaml_mapping(spec.base), "", str(spec.base), base=config)
    source = f"{spec.path} ({trial.name}: {describe(trial.params)})"
    config = build_dataclass(TrainConfig, nest({**spec.fixed, **trial.params}), "", source, base=config)
    config.validate(source)
    return config


def describe(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


def manifest(spec: SweepSpec, trials: list[Trial]) -> dict[str, Any]:
    return {"name": spec.name, "sweep_file": str(spec.path.resolve()),
            "base": str(spec.base) if spec.base else None, "method": spec.method, "seed": spec.seed,
            "fixed": spec.fixed, "trials": [{"name": t.name, "params": t.params} for t in trials]}


def check_manifest(spec: SweepSpec, plan: dict[str, Any]) -> None:
    """Refuse to continue a sweep directory whose trials were planned differently."""
    path = spec.directory / MANIFEST
    if not path.is_file():
        return
    try:
        previous = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        raise UserError(f"{path}: unreadable; delete it to start the sweep again") from None
    for key in ("base", "fixed", "trials"):
        if previous.get(key) != json.loads(json.dumps(plan[key])):
            raise UserError(f"{spec.path}: '{key}' differs from the sweep already in {spec.directory}; give the "
                            f"sweep a new name (key 'name') or delete that directory")


# ----------------------------------------------------------------------------- running

def trial_state(run_dir: Path) -> str:
    """finished | resumable (a run.json exists) | new."""
    info = read_run_info(run_dir)
    if info is None:
        return "new"
    return "finished" if info.status == "finished" else "resumable"


def trial_command(spec: SweepSpec, trial: Trial, resume: bool) -> list[str]:
    train = [sys.executable, "-m", "mlx_grpo.cli", "train"]
    if resume:
        return [*train, "--resume", str(spec.directory / trial.name)]
    command = [*train, *([str(spec.base)] if spec.base else [])]
    settings = {**spec.fixed, **trial.params, "monitoring_dir": str(spec.directory), "run_name": trial.name}
    for key, value in settings.items():
        # JSON is YAML, so each value reaches the config loader with its exact type ("007" stays a string)
        command += ["--set", f"{key}={json.dumps(value)}"]
    return command


def trial_env(spec: SweepSpec, parallel: int = 1) -> dict[str, str]:
    """The trials' environment: W&B groups every trial of the sweep under its name, and trials running
    side by side each plan for and cap themselves at their share of the machine's memory (each MLX
    process otherwise assumes the whole unified memory is its own)."""
    return {**os.environ, "WANDB_RUN_GROUP": os.environ.get("WANDB_RUN_GROUP", spec.name),
            MEMORY_SHARE_ENV: str(max(1, parallel))}


@dataclass
class Outcome:
    trial: Trial
    status: str  # finished | failed | skipped | elsewhere (still trained by a process an earlier sweep left)
    seconds: float = 0.0
    detail: str = ""


def _error_line(path: Path, start: int) -> str:
    """What a failed trial said: its last `mlx-grpo ...` line (an error, a stop) written since `start`,
    else its last line. A trial an earlier sweep left running may write to the same log meanwhile."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            lines = [line.strip() for line in f.read().decode("utf-8", "replace").splitlines() if line.strip()]
    except OSError:
        return ""
    ours = [line for line in lines if line.startswith("mlx-grpo")]
    return terminal_safe((ours or lines or [""])[-1][:300])


def run_sweep(spec: SweepSpec, parallel: int = 1, say: Callable[[str], None] = print,
              poll_s: float = 0.2) -> list[Outcome]:
    """Run every trial not finished yet, at most `parallel` at a time; one outcome per trial, in order."""
    trials = plan_trials(spec)
    logs = _write_manifest(spec, trials)
    outcomes: dict[str, Outcome] = {}
    queue = _queue(spec, trials, outcomes, say)
    running: list[tuple[Trial, subprocess.Popen, float, Any, int]] = []
    env = trial_env(spec, parallel)
    previous = _stop_on_sigterm()
    try:
        while queue or running:
            while queue and len(running) < max(1, parallel):
                trial, resume = queue.pop(0)
                log = open(logs / f"{trial.name}.log", "a", encoding="utf-8")
                # A session of its own: Ctrl-C reaches only the sweep, which then stops each trial once
                # (SIGTERM: the trainer finishes its step and checkpoints, so a rerun resumes it).
                process = subprocess.Popen(trial_command(spec, trial, resume), stdout=log,
                                           stderr=subprocess.STDOUT, env=env, cwd=spec.path.resolve().parent,
                                           start_new_session=True)
                running.append((trial, process, time.perf_counter(), log, log.tell()))
                say(f"{trial.name}: {'resumed' if resume else 'started'} ({describe(trial.params)})")
            time.sleep(poll_s)
            for item in list(running):
                code = item[1].poll()
                if code is None:
                    continue
                running.remove(item)
                _record_end(item, code, logs, outcomes, say)
    finally:
        for _, process, _, log, _ in running:  # the sweep was interrupted: stop the trials still running
            if process.poll() is None:
                process.terminate()
            process.wait()
            log.close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return [outcomes[t.name] for t in trials]


def _write_manifest(spec: SweepSpec, trials: list[Trial]) -> Path:
    """Every trial checked before the first one starts, the manifest written; the logs' folder."""
    for trial in trials:
        trial_config(spec, trial)
    plan = manifest(spec, trials)
    check_manifest(spec, plan)
    logs = spec.directory / "logs"
    try:
        logs.mkdir(parents=True, exist_ok=True)
        (spec.directory / MANIFEST).write_text(json.dumps(plan, indent=2) + "\n")
    except OSError as err:
        raise UserError(f"{spec.directory}: cannot write the sweep there ({err.strerror}); "
                        f"set output_dir in {spec.path} to a writable directory") from None
    return logs


def _queue(spec: SweepSpec, trials: list[Trial], outcomes: dict[str, Outcome],
           say: Callable[[str], None]) -> list[tuple[Trial, bool]]:
    """The trials to run, each with whether it resumes; those finished earlier are skipped."""
    queue: list[tuple[Trial, bool]] = []
    for trial in trials:
        state = trial_state(spec.directory / trial.name)
        if state == "finished":
            outcomes[trial.name] = Outcome(trial, "skipped", detail="finished earlier")
            say(f"{trial.name}: already finished ({describe(trial.params)})")
            continue
        if state == "new":
            shutil.rmtree(spec.directory / trial.name, ignore_errors=True)  # a start that never wrote run.json
        queue.append((trial, state == "resumable"))
    return queue


def _record_end(item: tuple[Trial, subprocess.Popen, float, Any, int], code: int, logs: Path,
                outcomes: dict[str, Outcome], say: Callable[[str], None]) -> None:
    """A trial's process ended with `code`: its outcome, said in one line."""
    trial, _, started, log, log_start = item
    log.close()
    seconds = time.perf_counter() - started
    if code == 0:
        outcomes[trial.name] = Outcome(trial, "finished", seconds)
        say(f"{trial.name}: finished in {seconds:.0f} s")
        return
    detail = _error_line(logs / f"{trial.name}.log", log_start)
    if "still being trained by" in detail or "is training this run" in detail:
        # a trial an earlier, killed sweep started and that trains on: not a failure
        outcomes[trial.name] = Outcome(trial, "elsewhere", seconds, detail)
        say(f"{trial.name}: {detail.split('error: ')[-1]}")
    else:
        outcomes[trial.name] = Outcome(trial, "failed", seconds, detail)
        say(f"{trial.name}: failed (exit {code}) after {seconds:.0f} s: {detail}")


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _stop_on_sigterm() -> dict[int, Any]:
    """SIGTERM and SIGHUP (the terminal closed) stop the sweep like Ctrl-C: its trials live in their own
    sessions, so without this they would train on unsupervised."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    signals = [signal.SIGTERM] + ([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])
    return {signum: signal.signal(signum, _raise_interrupt) for signum in signals}
