"""A synthetic trainer for dashboard tests: writes a run directory the way the
trainer does (docs/RUN_DIRECTORY.md), with deterministic values per step."""

from __future__ import annotations

import json
import math
from pathlib import Path

from mlx_grpo.telemetry.events import Start
from mlx_grpo.telemetry.rundir.writer import RunInfo, new_run_info, write_run_info

REWARD_FUNCTIONS = ("format_exact", "answer_check")


def start_sinks(sink, run_dir, name="run", config=None, **kwargs) -> RunInfo:
    """Start a sink (or a SinkSet) on a new run directory as the run does; returns the RunInfo."""
    info = new_run_info(run_dir, name, config or {}, **kwargs)
    sink.handle(Start(info, Path(run_dir)))
    return info


def metric_record(step: int, time: float) -> dict:
    """A plausible GRPO metric record: reward climbing, KL growing, lengths settling."""
    progress = 1.0 - math.exp(-step / 40.0)
    wiggle = math.sin(step * 0.7)
    rec = {
        "step": step,
        "time": time,
        "rewards/total/mean": 0.2 + 1.5 * progress + 0.05 * wiggle,
        "rewards/total/std": 0.4 - 0.1 * progress,
        "rewards/total/min": 0.0,
        "rewards/total/max": 2.0,
        "accuracy/train": 0.3 + 0.4 * progress,
        "policy/loss": 0.05 * wiggle,
        "policy/kl": 0.002 * step,
        "policy/entropy": 1.2 - 0.5 * progress,
        "policy/clip_frac_low": 0.01 + 0.01 * progress,
        "policy/clip_frac_high": 0.02 + 0.01 * progress,
        "policy/clip_frac": 0.03 + 0.02 * progress,
        "policy/grad_norm": 0.8 + 0.2 * wiggle,
        "policy/lr": 1e-4,
        "completions/length/mean": 20.0 - 6.0 * progress,
        "completions/length/min": 8.0,
        "completions/length/max": 24.0,
        "completions/truncated_frac": 0.3 * (1.0 - progress),
        "completions/finished_frac": 0.7 + 0.3 * progress,
        "throughput/gen_tokens_per_s": 3000.0 + 100.0 * wiggle,
        "throughput/backprop_tokens_per_s": 9000.0 + 200.0 * wiggle,
        "timing/step_s": 0.5,
        "timing/rollout_s": 0.3,
        "timing/reward_s": 0.01,
        "timing/update_s": 0.19,
        "system/cpu_percent": 90.0 + 5.0 * wiggle,
        "system/memory_percent": 40.0,
        "system/process_rss_gb": 1.5 + 0.001 * step,
        "system/accel_active_gb": 0.8,
        "system/accel_peak_gb": 1.1,
        "system/accel_limit_gb": 16.0,
    }
    for i, fn in enumerate(REWARD_FUNCTIONS):
        rec[f"rewards/{fn}/mean"] = (0.5 + 0.1 * i) * progress + 0.1 * i
    return rec


def sample_record(step: int, time: float, k: int) -> dict:
    correct = (step + k) % 2 == 0
    return {
        "step": step, "time": time,
        "prompt": f"What is {step} + {k}?",
        "completion": f"<reasoning>add</reasoning><answer>{step + k if correct else step}</answer>",
        "answer": str(step + k),
        "rewards": {"format_exact": 1.0, "answer_check": 1.0 if correct else 0.0},
        "total": 2.0 if correct else 1.0,
        "advantage": 0.7 if correct else -0.7,
        "length": 18 + k,
        "truncated": False,
        "correct": correct,
    }


class RunWriter:
    """Appends to a run directory line by line, flushing each line like the trainer."""

    def __init__(self, run_dir: Path, name: str = "synthetic", total_steps: int = 100,
                 start_time: float = 1_700_000_000.0, step_seconds: float = 0.5, pid: int | None = None):
        self.run_dir = Path(run_dir)
        self.name = name
        self.total_steps = total_steps
        self.start_time = start_time
        self.step_seconds = step_seconds
        self.pid = pid
        self.step = 0

    def start(self, config: dict | None = None) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.write_run_json("running", config=config)

    def write_run_json(self, status: str, end_time: float | None = None, config: dict | None = None) -> None:
        write_run_info(self.run_dir, RunInfo(
            run_id=f"{self.name}-id", name=self.name, start_time=self.start_time, end_time=end_time, status=status,
            pid=self.pid,
            config=config if config is not None else {"model": "tiny-llama", "learning_rate": 1e-4,
                                                      "num_steps": self.total_steps, "enable_alerts": False},
            versions={"mlx_grpo": "0.1.0", "python": "3.11"},
            device={"backend": "cpu", "dtype": "float32"},
            total_steps=self.total_steps,
        ))

    def time_of(self, step: int) -> float:
        return self.start_time + 5.0 + step * self.step_seconds

    def append(self, name: str, obj: dict) -> None:
        with open(self.run_dir / name, "a") as f:
            f.write(json.dumps(obj) + "\n")
            f.flush()

    def log_step(self, samples: int = 2) -> int:
        self.step += 1
        t = self.time_of(self.step)
        self.append("metrics.jsonl", metric_record(self.step, t))
        for k in range(samples):
            self.append("samples.jsonl", sample_record(self.step, t, k))
        return self.step

    def alert(self, metric: str, level: str = "warning", message: str = "looks wrong") -> None:
        self.append("alerts.jsonl", {"step": self.step, "time": self.time_of(self.step), "level": level,
                                     "rule": f"test_{metric.replace('/', '_')}", "metric": metric,
                                     "value": 1.0, "message": message})

    def finish(self, status: str = "finished") -> None:
        self.write_run_json(status, end_time=self.time_of(self.step) + 1.0)
