"""Synthetic GRPO runs for the alert and analysis tests: metric records and samples as a run writes them.

A healthy run looks like a default run on the shipped model (its numbers were
measured on one): 16 prompts x 8 completions, sampled accuracy climbing from ~20% to
~40% with prompts of very different difficulty (about a third of the groups all
wrong), the four built-in rewards (format rewards nearly always earned, answer and
number rewards paying for correctness), per-token KL ramping from 0 to ~0.35 in 10
steps then wandering with rare single spikes, gradient norms around 1.3 with a rare
10x spike, entropy easing from ~0.35, steady lengths, noisy throughput, steady memory.
Each fault knob bends one part of it from `fault_step` on, the way a sick run does.
Reward metrics come from the trainer's own reward_stats.reward_metrics, so the
streams have the real definitions.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlx_grpo.telemetry.metrics.reward_stats import RewardTracker, reward_metrics
from mlx_grpo.telemetry.metrics.step_data import bimodality
from mlx_grpo.telemetry.rundir.writer import RunInfo, write_run_info

PROMPTS, GROUP = 16, 8
MAX_TOKENS = 24


@dataclass
class Faults:
    fault_step: int = 100
    constant_reward: bool = False  # one reward function returns 1.0 for everything, the only one
    nan_loss: bool = False  # policy metrics NaN at fault_step
    length_reward: bool = False  # a reward paying for length: lengths and reward climb, accuracy sinks
    kl_blowup: bool = False
    entropy_collapse: bool = False
    grad_spike: bool = False  # a 10x gradient norm at fault_step
    throughput_drop: bool = False
    memory_high: bool = False  # the step's peak near the accelerator's working set
    system_memory_high: bool = False  # the machine nearly out of memory
    cache_held_high: bool = False  # MLX's live arrays and buffer cache fill the working set (wired on a Mac)
    memory_pressure: bool = False  # macOS reports memory pressure "warning"
    collapse: bool = False  # the policy breaks: accuracy to 0 and the format rewards mostly lost at once
    stagnant: bool = False  # accuracy stays at 30% for the whole run
    rare_success: bool = False  # answers almost never right and no format reward: tiny signal-to-noise
    takeover: bool = False  # format_approx's weight grows while accuracy falls
    clip_saturation: bool = False  # the PPO clip active on a third of the tokens (num_iterations > 1)
    zero_gradient: bool = False  # updates with a gradient norm of exactly 0 (nothing to learn from)
    format_gaming: bool = False  # formats rarely earned, then learnt to the ceiling in 10 steps; accuracy stalls
    repetition: bool = False  # the completions' repetition rate climbs from ~0.02 toward 0.6
    graded: bool = False  # one graded reward (a judge's 0-10 score) instead of the built-in four
    bimodal: bool = False  # with graded: a growing share of completions scores 9, the rest 3; accuracy stalls


def _accuracy(step: int, steps: int, faults: Faults, gain: float) -> float:
    if faults.stagnant:
        return 0.20
    if (faults.format_gaming or faults.bimodal) and step >= faults.fault_step:
        return 0.20 + gain * min(1.0, faults.fault_step / steps)
    if faults.rare_success:
        return 0.005
    base = 0.20 + gain * min(1.0, step / steps)
    if faults.collapse and step >= faults.fault_step:
        return 0.001
    if (faults.length_reward or faults.takeover) and step >= faults.fault_step:
        return max(0.05, base - 0.002 * (step - faults.fault_step))
    return base


def simulate(steps: int = 200, seed: int = 0, faults: Faults | None = None, eval_every: int = 25,
             accuracy_gain: float = 0.20, format_rate: float = 0.99,
             grad_spike_rate: float = 0.005, shape_metrics: bool = False) -> tuple[list[dict], list[dict]]:
    """(metric records, samples) of one run, steps 1..steps.

    `accuracy_gain`: sampled accuracy rises from 20% by this much over the run;
    `format_rate`: share of completions earning each format reward (at 0.99 a whole
    batch often earns it, and the reward is constant for that step);
    `grad_spike_rate`: chance per step of a single 10x gradient-norm spike;
    `shape_metrics`: also `completions/repetition_rate` and `rewards/total/bimodality` (the latter computed from
    the step's totals as the trainer does).
    """
    faults = faults or Faults()
    rng = np.random.default_rng(seed)
    if faults.constant_reward:
        names = ["constant"]
    elif faults.rare_success:
        names = ["answer_check"]
    elif faults.graded:
        names = ["judge"]
    elif faults.length_reward:
        names = ["format_exact", "format_approx", "answer_check", "number_check", "length_bonus"]
    else:
        names = ["format_exact", "format_approx", "answer_check", "number_check"]
    tracker = RewardTracker(names)
    difficulty = rng.normal(0.0, 1.5, size=200)  # per-prompt offsets in logit space
    metrics, samples = [], []
    t0 = 1_700_000_000.0
    for step in range(1, steps + 1):
        after = step >= faults.fault_step
        acc = _accuracy(step, steps, faults, accuracy_gain)
        prompts = rng.integers(0, len(difficulty), size=PROMPTS)
        logit = math.log(acc / (1 - acc)) + np.repeat(difficulty[prompts], GROUP)
        correct = rng.random(PROMPTS * GROUP) < 1 / (1 + np.exp(-logit))
        base_len = 14.0
        if faults.length_reward and after:
            base_len = min(MAX_TOKENS, 14.0 + 0.25 * (step - faults.fault_step))
        lengths = np.clip(np.round(rng.normal(base_len, 2.0, size=correct.size)), 4, MAX_TOKENS)
        truncated = lengths >= MAX_TOKENS
        rows = []
        weights = []
        if faults.collapse and after:
            format_rate = 0.3
        if faults.format_gaming:
            format_rate = 0.3 + 0.69 * min(1.0, max(0, step - faults.fault_step) / 10)
        for name in names:
            if name == "constant":
                row = np.ones(correct.size)
            elif name == "format_exact":
                row = np.where(rng.random(correct.size) < format_rate, 3.0, 0.0)
            elif name == "format_approx":
                row = np.where(rng.random(correct.size) < format_rate, 2.5, 1.0)
            elif name == "answer_check":
                row = np.where(correct, 3.0, np.where(rng.random(correct.size) < 0.02, 0.5, -1.0))
                if faults.rare_success:
                    row = np.where(correct, 1.0, 0.0)
            elif name == "judge":  # 0-10, centred on 3 + 4 x accuracy, a bell around it
                row = np.clip(rng.normal(3 + 4 * acc, 1.2, size=correct.size), 0, 10)
                if faults.bimodal and after:
                    share = 0.5 * min(1.0, (step - faults.fault_step + 1) / 15)
                    high = rng.random(correct.size) < share
                    row = np.where(high, rng.normal(9, 0.3, correct.size), rng.normal(3, 0.5, correct.size))
            elif name == "number_check":
                row = np.where(correct, 1.5, 0.0)
            else:  # length_bonus
                row = 0.2 * lengths
            rows.append(row)
            weight = 1.0
            if faults.takeover and after and name == "format_approx":
                weight = 1.0 + 0.1 * (step - faults.fault_step)
            weights.append(weight)
        scores = np.vstack(rows)
        total = (np.asarray(weights)[:, None] * scores).sum(axis=0)
        record: dict = {"step": step, "time": t0 + step}
        record.update(reward_metrics(scores, names, weights, total, GROUP))
        record.update(tracker.update(step, scores, total))
        record["accuracy/train"] = float(correct.mean())
        record["completions/length/mean"] = float(lengths.mean())
        record["completions/truncated_frac"] = float(truncated.mean())
        if shape_metrics:
            rate = 0.02 + abs(rng.normal(0, 0.005))
            if faults.repetition and after:
                rate = min(0.6, rate + 0.02 * (step - faults.fault_step))
            record["completions/repetition_rate"] = rate
            if (b := bimodality(total)) is not None:
                record["rewards/total/bimodality"] = b
        level = 0.4 - 0.2 * step / steps
        kl = level * min(1.0, max(0.0, (step - 2) / 8)) * math.exp(rng.normal(0, 0.35))
        if rng.random() < 0.01:
            kl *= 6  # a single-step spike, as real runs have
        if faults.kl_blowup and after:
            kl = 0.4 * 1.4 ** (step - faults.fault_step + 1)
        record["policy/kl"] = kl
        entropy = 0.35 - 0.1 * step / steps + rng.normal(0, 0.03)
        if faults.entropy_collapse and after:
            entropy = 0.04
        record["policy/entropy"] = entropy
        grad = 1.3 * math.exp(rng.normal(0.0, 0.32))
        if rng.random() < grad_spike_rate or (faults.grad_spike and step == faults.fault_step):
            grad *= 10
        if faults.zero_gradient and after:
            grad = 0.0
        record["policy/grad_norm"] = grad
        if faults.clip_saturation:
            record["policy/clip_frac"] = 0.35 if after else float(abs(rng.normal(0.03, 0.01)))
        record["policy/loss"] = float(rng.normal(0, 0.05))
        if faults.nan_loss and step == faults.fault_step:
            for key in ("policy/loss", "policy/grad_norm", "policy/kl", "policy/entropy"):
                record[key] = math.nan
        speed = 3000.0 * math.exp(rng.normal(0, 0.3))
        if step <= 2:
            speed *= 0.4  # warm-up
        if faults.throughput_drop and after:
            speed *= 0.3
        record["throughput/gen_tokens_per_s"] = speed
        memory = 40.0 + rng.normal(0, 1.0)
        record["system/accel_memory_percent"] = memory
        record["memory/peak_percent"] = 95.0 if faults.memory_high and after else 1.6 * memory
        record["system/memory_percent"] = 95.0 if faults.system_memory_high and after else 55.0 + 0.05 * memory
        if faults.cache_held_high:  # only in the runs that test it: the others' records stay as they were
            record["system/accel_held_percent"] = 97.0 if after else memory + 20.0
        if faults.memory_pressure:
            record["system/memory_pressure_level"] = 2.0 if after else 1.0
        if eval_every and step % eval_every == 0:
            record["eval/accuracy"] = float(np.clip(acc + rng.normal(0, 0.035), 0, 1))
        metrics.append(record)
        advantages = (total - total.reshape(-1, GROUP).mean(axis=1).repeat(GROUP))
        for i in rng.choice(correct.size, size=4, replace=False):
            samples.append({
                "step": step, "time": t0 + step, "prompt": f"{i} + {step} =", "completion": "<answer>?</answer>",
                "answer": str(i + step), "rewards": {name: float(scores[k, i]) for k, name in enumerate(names)},
                "total": float(total[i]), "advantage": float(advantages[i]), "length": int(lengths[i]),
                "truncated": bool(truncated[i]), "correct": bool(correct[i]),
            })
    return metrics, samples


def write_run_dir(path: Path, metrics: list[dict], samples: list[dict], name: str = "synthetic") -> Path:
    """A run directory as the trainer leaves it (NaN written as null, like the JSONL sink)."""
    path.mkdir(parents=True, exist_ok=True)
    write_run_info(path, RunInfo(run_id=name, name=name, status="finished", total_steps=len(metrics)))
    with open(path / "metrics.jsonl", "w") as f:
        for record in metrics:
            clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
            f.write(json.dumps(clean) + "\n")
    with open(path / "samples.jsonl", "w") as f:
        for sample in samples:
            f.write(json.dumps(sample) + "\n")
    return path
