"""The kill test at scale: SIGKILL a small run at random moments, resume it each time, and compare the end with
a run nobody interrupted. Bit-exact or it fails: final weights and optimiser state, every metric record
(clock readings aside), every sample, every kept completion, final_metrics.json.

    python benchmarks/kill_test.py                          # 20 kills, seed 0, in a temporary folder
    python benchmarks/kill_test.py --kills 5 --seed 3 --keep /tmp/kills --json kills.json

The run is the built-in default model on the built-in task, small (`--steps` steps of batch 2 x 2
completions, a checkpoint every 2 steps, held-out evaluation every 4). The moments, taken in turn:
- load: a random time after the process starts, while the model loads (before run.json, or just after);
- step: a random time after a new metrics record, inside the next step's rollout or update;
- checkpoint: while `checkpoints/.step_N.tmp` is being written;
- evaluation: a random time after the record of the step before a held-out evaluation;
- mcp: a run started (or continued, by rolling back to its latest checkpoint) through the MCP server's
  tools, killed at a random time after start_run/rollback_run returned.
After each kill the run continues as a user would: `mlx-grpo train --resume RUN` when run.json exists, else
the first command again. Exits 1 when anything differs. On Linux it restarts itself with OpenBLAS preloaded.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OPENBLAS = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0"
MOMENTS = ("load", "step", "checkpoint", "evaluation", "mcp")
CLOCK_PREFIXES = ("timing/", "system/", "throughput/", "perf/", "memory/")  # measured, not computed
CLOCK_KEYS = {"time", "elapsed_s", "seconds"}


def config(steps: int) -> dict:
    return {"model_id": "default", "num_steps": steps, "batch_size": 2, "num_generations": 2,
            "max_generation_steps": 4, "train_size": 6, "eval_every": 4, "eval_size": 4, "checkpoint_every": 2,
            "keep_checkpoints": 2, "samples_per_step": 1, "seed": 3, "wandb": False, "tensorboard": False}


def env() -> dict:
    out = {**os.environ, "WANDB_MODE": "disabled"}
    if os.path.exists(OPENBLAS):
        out["LD_PRELOAD"] = OPENBLAS  # set here so the CLI does not re-exec: the pid we kill is the trainer
    return out


def train(args: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mlx_grpo.cli", "train", *args], cwd=cwd, env=env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def records(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


def wait_until(proc_alive, condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc_alive():
        if condition():
            return True
        time.sleep(0.005)
    return False


class Killer:
    """Runs the killed run to its end, `kills` SIGKILLs on the way."""

    def __init__(self, root: Path, cfg: Path, rng: random.Random, steps: int):
        self.root, self.cfg, self.rng, self.steps = root, cfg, rng, steps
        self.run_dir = root / "runs" / "killed"
        self.log: list[dict] = []

    def start(self) -> subprocess.Popen:
        if (self.run_dir / "run.json").is_file():
            return train(["--resume", str(self.run_dir)], self.root)
        return train([str(self.cfg), "--run-name", "killed", "--monitoring-dir", str(self.root / "runs")], self.root)

    def kill_once(self, moment: str) -> bool:
        """One start and one SIGKILL at `moment`; False when the run ended before the moment came."""
        if moment == "mcp":
            return self.kill_mcp()
        proc = self.start()
        alive = lambda: proc.poll() is None  # noqa: E731
        metrics = self.run_dir / "metrics.jsonl"
        if moment == "load":
            time.sleep(self.rng.uniform(0.0, 3.0))
        elif moment == "step":  # a record written by this process, then a random point of the next step
            started = time.time()
            wait_until(alive, lambda: metrics.exists() and metrics.stat().st_mtime > started, 600)
            time.sleep(self.rng.uniform(0.0, 1.0))
        elif moment == "checkpoint":
            checkpoints = self.run_dir / "checkpoints"
            wait_until(alive, lambda: any(checkpoints.glob(".step_*.tmp")), 600)
        elif moment == "evaluation":
            target = self.rng.choice([s for s in range(4, self.steps, 4)])  # eval steps: 4, 8, ...
            wait_until(alive, lambda: records(metrics) >= target, 600)  # records: step 0's eval and 1..target-1
            time.sleep(self.rng.uniform(0.0, 0.5))
        if proc.poll() is not None:
            self.log.append({"moment": moment, "killed": False, "records": records(metrics)})
            proc.communicate()
            return False
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        self.log.append({"moment": moment, "killed": True, "records_at_kill": records(metrics),
                         "tmp_checkpoint": bool(list((self.run_dir / "checkpoints").glob(".step_*.tmp")))
                         if (self.run_dir / "checkpoints").is_dir() else False})
        return True

    def kill_mcp(self) -> bool:
        from mlx_grpo.mcp_server import Workspace

        workspace = Workspace(self.root, allow_control=True)
        checkpoints = sorted(int(p.name[5:]) for p in (self.run_dir / "checkpoints").glob("step_*")) \
            if (self.run_dir / "checkpoints").is_dir() else []
        if not (self.run_dir / "run.json").is_file():
            shutil.rmtree(self.run_dir, ignore_errors=True)  # a start killed before run.json: start again
            result = workspace.start_run(config=str(self.cfg), run_name="killed")
        elif checkpoints:
            result = workspace.rollback_run("runs/killed", checkpoints[-1])
        else:
            return self.kill_once("step")
        process = workspace.started[result["pid"]][0]
        time.sleep(self.rng.uniform(0.0, 2.0))
        if process.poll() is not None:
            self.log.append({"moment": "mcp", "killed": False})
            return False
        process.send_signal(signal.SIGKILL)
        process.wait()
        self.log.append({"moment": "mcp", "killed": True, "records_at_kill": records(self.run_dir / "metrics.jsonl")})
        return True

    def finish(self) -> None:
        proc = self.start()
        _, err = proc.communicate(timeout=3600)
        if proc.returncode != 0:
            raise SystemExit(f"the final resume failed (exit {proc.returncode}): {err.strip()[-500:]}")


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def comparable(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in CLOCK_KEYS and not k.startswith(CLOCK_PREFIXES)}


def completions(run_dir: Path) -> dict[str, list[dict]]:
    out = {}
    for path in sorted((run_dir / "completions").glob("step_*.jsonl.gz")):
        with gzip.open(path, "rt") as f:
            out[path.name] = [comparable(json.loads(line)) for line in f if line.strip()]
    return out


def differences(run_dir: Path, reference: Path, steps: int) -> list[str]:
    """Everything in which the killed-and-resumed run differs from the reference; [] when bit-exact."""
    import mlx.core as mx
    import numpy as np

    found = []
    got, want = lines(run_dir / "metrics.jsonl"), lines(reference / "metrics.jsonl")
    if [r.get("step") for r in got] != [r.get("step") for r in want]:
        found.append(f"metrics steps {[r.get('step') for r in got]} != {[r.get('step') for r in want]}")
    found += [f"metrics of step {a.get('step')} differ" for a, b in zip(got, want) if comparable(a) != comparable(b)]
    samples = [comparable(s) for s in lines(run_dir / "samples.jsonl")]
    if samples != [comparable(s) for s in lines(reference / "samples.jsonl")]:
        found.append("samples.jsonl differs")
    if completions(run_dir) != completions(reference):
        found.append("completions/ differ")
    final = json.loads((run_dir / "final_metrics.json").read_text())
    if final != json.loads((reference / "final_metrics.json").read_text()):
        found.append("final_metrics.json differs")
    for name in ("model.safetensors", "optimizer.safetensors"):
        a = mx.load(str(run_dir / "checkpoints" / f"step_{steps}" / name))
        b = mx.load(str(reference / "checkpoints" / f"step_{steps}" / name))
        if a.keys() != b.keys():
            found.append(f"{name}: other tensors")
            continue
        found += [f"{name}: {key} differs (max {float(np.abs(np.array(a[key]) - np.array(b[key])).max()):.3g})"
                  for key in sorted(b) if not np.array_equal(np.array(a[key]), np.array(b[key]))]
    info = json.loads((run_dir / "run.json").read_text())
    if info.get("status") != "finished":
        found.append(f"status {info.get('status')}")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, help="keep the runs in this folder (default: a temporary one)")
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args()
    return run(args.kills, args.steps, args.seed, args.keep, args.json)


def run(kills: int, steps: int, seed: int, keep: Path | None = None, json_path: Path | None = None) -> int:
    import yaml

    root = Path(tempfile.mkdtemp(prefix="kill-test-")) if keep is None else keep
    root.mkdir(parents=True, exist_ok=True)
    cfg = root / "config.yaml"
    cfg.write_text(yaml.safe_dump(config(steps)))
    began = time.perf_counter()
    ref = train([str(cfg), "--run-name", "reference", "--monitoring-dir", str(root / "runs")], root)
    _, err = ref.communicate(timeout=3600)
    if ref.returncode != 0:
        raise SystemExit(f"the reference run failed: {err.strip()[-500:]}")
    reference_s = time.perf_counter() - began
    rng = random.Random(seed)
    killer = Killer(root, cfg, rng, steps)
    done, attempts = 0, 0
    while done < kills and attempts < kills * 4:
        attempts += 1
        moment = MOMENTS[done % len(MOMENTS)]
        if (killer.run_dir / "run.json").is_file() and json.loads((killer.run_dir / "run.json").read_text()).get(
                "status") == "finished":
            break  # finished between kills: nothing left to interrupt
        done += killer.kill_once(moment)
    killer.finish()
    found = differences(killer.run_dir, root / "runs" / "reference", steps)
    result = {"kills": done, "attempts": attempts, "steps": steps, "seed": seed, "differences": found,
              "bit_exact": not found and done == kills, "reference_s": round(reference_s, 1),
              "total_s": round(time.perf_counter() - began, 1),
              "moments": {m: sum(1 for e in killer.log if e["moment"] == m and e["killed"]) for m in MOMENTS},
              "kills_during_checkpoint_write": sum(1 for e in killer.log if e.get("tmp_checkpoint")),
              "resumes": len(json.loads((killer.run_dir / "run.json").read_text()).get("resumes", [])),
              "log": killer.log}
    print(json.dumps({k: v for k, v in result.items() if k != "log"}, indent=2))
    if json_path is not None:
        json_path.write_text(json.dumps(result, indent=2))
    if keep is None:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if result["bit_exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
