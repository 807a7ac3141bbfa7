"""Chart groups and short labels of the catalogue's metrics: TensorBoard's layout and the dashboard's views
are built from them."""

from __future__ import annotations

import math

import numpy as np

from .catalogue import name_pattern
from .names import (
    ACCEL_ACTIVE_GB,
    ACCEL_LIMIT_GB,
    ACCEL_MEMORY_PERCENT,
    ACCEL_PEAK_GB,
    ACCURACY_TRAIN,
    BACKPROP_TOKENS_PER_S,
    CHECKPOINT_SECONDS,
    CLIP_FRAC,
    CPU_PERCENT,
    CPU_SPEED_LIMIT,
    ENTROPY,
    EVAL_ACCURACY,
    EVAL_SECONDS,
    FINISHED_CORRECT_FRAC,
    FINISHED_FRAC,
    GEN_MS_PER_TOKEN,
    GEN_TOKENS_PER_S,
    GRAD_NORM,
    KL,
    LEARNING_RATE,
    LENGTH_MEAN,
    LOSS,
    LOW_POWER_MODE,
    MEMORY_PERCENT,
    MEMORY_USED_GB,
    MFU,
    ON_BATTERY,
    PROCESS_RSS_GB,
    PROMPT_LENGTH_MEAN,
    PROMPT_TRUNCATED_FRAC,
    REPETITION_RATE,
    REWARD_BIMODALITY,
    REWARD_MEAN,
    REWARD_RECENT_MEAN,
    ROLLOUT_SECONDS,
    SAMPLING_LOGP_DIFF_MAX,
    SAMPLING_LOGP_DIFF_MEAN,
    SIGNAL_TO_NOISE,
    STEP_SECONDS,
    STEP_TOKENS_PER_S,
    THERMAL_WARNING_LEVEL,
    TOKENS_CUMULATIVE,
    TOKENS_TOTAL,
    TOOL_CALL_FREQUENCY,
    TOOL_CALLED_FRAC,
    TOOL_FAILURE_FREQUENCY,
    TRUNCATED_CORRECT_FRAC,
    TRUNCATED_FRAC,
    UPDATE_SECONDS,
    ZERO_STD_GROUP_FRAC,
)

# The chart groups of the namespace, by section: the TensorBoard custom layout is generated from
# them (`tensorboard_layout`), and the dashboard's views draw these charts (tui/views.py picks them).
CHART_GROUPS: dict[str, dict[str, tuple[str, ...]]] = {
    "rewards": {
        "total reward": (REWARD_MEAN,),
        "total reward spread": ("rewards/total/median", REWARD_RECENT_MEAN, "rewards/total/min", "rewards/total/max"),
        "reward per function": ("rewards/<fn>/mean",),
        "contribution %": ("rewards/<fn>/contribution_pct",),
        "signal quality": (SIGNAL_TO_NOISE, "rewards/entropy", ZERO_STD_GROUP_FRAC, REWARD_BIMODALITY),
        # train against held-out on a chart of their own; the per-difficulty lines would crowd them
        "accuracy": (ACCURACY_TRAIN, EVAL_ACCURACY, "eval/mean@<k>", "eval/pass@<k>"),
        "accuracy by difficulty": ("difficulty/<level>/accuracy",),
        # runs with tools only: trajectories that call one, calls that fail, calls per trajectory
        "tool use": (TOOL_CALLED_FRAC, TOOL_FAILURE_FREQUENCY, TOOL_CALL_FREQUENCY),
    },
    "policy": {
        "loss": (LOSS, "policy/pg_loss", "policy/kl_penalty"),
        "KL": (KL, "policy/ppo_kl"),
        "entropy": (ENTROPY,),
        "PPO clipping": ("policy/clip_frac_low", "policy/clip_frac_high", CLIP_FRAC, "policy/outside_frac",
                         "policy/clip_frac_low_min", "policy/clip_frac_high_max"),
        "importance ratio": ("policy/ratio/mean", "policy/ratio/std", "policy/ratio/p95", "policy/log_ratio/mean",
                             "policy/log_ratio/std"),
        "sampler vs update log-probs": (SAMPLING_LOGP_DIFF_MEAN, SAMPLING_LOGP_DIFF_MAX),
        "importance ratio to the sampler": ("sampling/importance_ratio/min", "sampling/importance_ratio/mean",
                                            "sampling/importance_ratio/max"),
        "gradient norm": (GRAD_NORM,),
        "learning rate": (LEARNING_RATE,),
        "advantages": ("advantages/mean", "advantages/std", "advantages/min", "advantages/max"),
    },
    "lengths": {
        "completion length": (LENGTH_MEAN, "completions/length/min", "completions/length/max"),
        "length of finished completions": ("completions/terminated_length/mean", "completions/terminated_length/min",
                                           "completions/terminated_length/max"),
        "repetition": (REPETITION_RATE,),
        "truncation": (TRUNCATED_FRAC, PROMPT_TRUNCATED_FRAC),
        "finished / correct": (FINISHED_FRAC, FINISHED_CORRECT_FRAC,
                               TRUNCATED_CORRECT_FRAC),
        "prompt length": (PROMPT_LENGTH_MEAN,),
    },
    "throughput": {
        "generation tokens/s": (GEN_TOKENS_PER_S, "throughput/gen_tokens_per_s/avg",
                                "throughput/gen_tokens_per_s/p99"),
        "backprop tokens/s": (BACKPROP_TOKENS_PER_S, "throughput/backprop_tokens_per_s/avg",
                              "throughput/backprop_tokens_per_s/p99"),
        "step tokens/s": (STEP_TOKENS_PER_S,),
        "tokens": (TOKENS_TOTAL, TOKENS_CUMULATIVE),
        "model FLOPs utilisation": (MFU,),
        "phase seconds": (STEP_SECONDS, ROLLOUT_SECONDS, "timing/reward_s", "timing/advantage_s",
                          "timing/ref_s", UPDATE_SECONDS, CHECKPOINT_SECONDS, EVAL_SECONDS),
        "ms per token": (GEN_MS_PER_TOKEN, "timing/update_ms_per_token", "timing/ref_ms_per_token"),
    },
    "memory": {
        "peak per phase GB": ("memory/rollout_peak_gb", "memory/ref_peak_gb", "memory/update_peak_gb"),
        "accelerator GB": (ACCEL_ACTIVE_GB, ACCEL_PEAK_GB, ACCEL_LIMIT_GB),
    },
    "system": {
        "CPU and GPU %": (CPU_PERCENT, "system/gpu_utilization_percent"),
        "memory %": (MEMORY_PERCENT, ACCEL_MEMORY_PERCENT, "memory/peak_percent"),
        "memory GB": (MEMORY_USED_GB, "system/memory_available_gb", PROCESS_RSS_GB),
        "Mac state": (THERMAL_WARNING_LEVEL, ON_BATTERY, LOW_POWER_MODE),
        "CPU speed limit %": (CPU_SPEED_LIMIT,),
    },
}


# Short labels for tiles and tables; a name without one shows its last path segments.
LABELS: dict[str, str] = {
    REWARD_MEAN: "reward", ACCURACY_TRAIN: "accuracy", EVAL_ACCURACY: "eval acc",
    KL: "KL", ENTROPY: "entropy", CLIP_FRAC: "PPO clip frac", LOSS: "loss",
    GRAD_NORM: "grad norm", LEARNING_RATE: "lr", LENGTH_MEAN: "length",
    TRUNCATED_FRAC: "truncated", FINISHED_FRAC: "finished",
    PROMPT_LENGTH_MEAN: "prompt len", TOKENS_TOTAL: "tokens/step",
    GEN_TOKENS_PER_S: "gen tok/s", BACKPROP_TOKENS_PER_S: "backprop tok/s",
    STEP_SECONDS: "step s", ROLLOUT_SECONDS: "rollout s", UPDATE_SECONDS: "update s",
    GEN_MS_PER_TOKEN: "gen ms/tok", MFU: "MFU", CPU_PERCENT: "CPU %", MEMORY_PERCENT: "memory %",
    PROCESS_RSS_GB: "process GB", ACCEL_ACTIVE_GB: "accel GB", ACCEL_PEAK_GB: "accel peak",
    ACCEL_LIMIT_GB: "accel limit", "memory/update_peak_gb": "update peak GB",
    MEMORY_USED_GB: "memory used GB", ACCEL_MEMORY_PERCENT: "accel memory %",
    SAMPLING_LOGP_DIFF_MAX: "sampler logp diff", REPETITION_RATE: "repetition",
    TOOL_CALLED_FRAC: "calling a tool", TOOL_FAILURE_FREQUENCY: "failed calls", TOOL_CALL_FREQUENCY: "calls each",
}


def label(name: str) -> str:
    """The short label of a metric for tiles and tables."""
    return LABELS.get(name) or "/".join(name.split("/")[-2:])


def tensorboard_layout() -> dict[str, dict[str, list]]:
    """TensorBoard's custom-scalars layout, from CHART_GROUPS (plus the reward's q25..q75 margin chart, its
    variance, and the per-epoch figures)."""
    layout: dict[str, dict[str, list]] = {
        section: {title: ["Multiline", ["^" + name_pattern(n).pattern.removesuffix(r"\Z") + "$" for n in names]]
                  for title, names in charts.items()}
        for section, charts in CHART_GROUPS.items()}
    layout["rewards"] = {"total reward: mean with q25..q75": ["Margin", [REWARD_MEAN, "rewards/total/q25",
                                                                        "rewards/total/q75"]],
                         **layout["rewards"],
                         "total reward variance": ["Multiline", ["^rewards/total/variance$", "^rewards/total/std$"]]}
    # seed 004's "Reward Analysis" and "Loss Analysis": the per-epoch figures (the dashboard has no epoch view)
    layout["epoch"] = {"epoch reward": ["Multiline", ["^epoch/reward/mean$", "^epoch/reward/variance$",
                                                      "^epoch/reward/trend$"]],
                       "epoch loss": ["Multiline", ["^epoch/loss/mean$", "^epoch/loss/trend$"]],
                       "epoch samples": ["Multiline", ["^epoch/num_samples$", "^epoch/api_tokens$"]]}
    return layout


# The colour scale of every reward heatmap (the dashboard's and W&B's), low to high: dark blue, teal, yellow
# (viridis' ends and middle).
_SCALE = np.array([(68, 1, 84), (33, 145, 140), (253, 231, 37)], dtype=float)


def scale_colour(t: float) -> str:
    """The heatmap colour of a value in 0..1 (grey where nothing was logged)."""
    if not math.isfinite(t):
        return "#dddddd"  # not logged at that step
    position = min(max(t, 0.0), 1.0) * (len(_SCALE) - 1)
    i = min(int(position), len(_SCALE) - 2)
    r, g, b = _SCALE[i] + (position - i) * (_SCALE[i + 1] - _SCALE[i])
    return f"#{int(r):02x}{int(g):02x}{int(b):02x}"
