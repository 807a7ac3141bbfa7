"""Metric names that cross a module boundary: made in one module (the step record, the trackers, the
system sampler, the recorder) and read by another (console, dashboard, report, compare, alerts, the
custom-loop monitor). Each is spelled here once and read from here everywhere, the catalogue's own
entries included; `tests/telemetry/test_telemetry_catalogue.py` fails on a catalogued name spelled in two modules.

A name used in one module only stays a literal where it is made (step_data.py, reward_stats.py).
"""

# rewards and accuracy
REWARD_MEAN = "rewards/total/mean"
REWARD_BIMODALITY = "rewards/total/bimodality"
REPETITION_RATE = "completions/repetition_rate"
# the rollout against the update's first pass (update.sampling_mismatch)
SAMPLING_LOGP_DIFF_MEAN = "sampling/logp_diff/mean"
SAMPLING_LOGP_DIFF_MAX = "sampling/logp_diff/max"
REWARD_STD = "rewards/total/std"
REWARD_MEAN_STDERR = "rewards/total/mean_stderr"
REWARD_RECENT_MEAN = "rewards/total/recent_mean"
SIGNAL_TO_NOISE = "rewards/signal_to_noise"
ZERO_STD_GROUP_FRAC = "rewards/zero_std_group_frac"
ACCURACY_TRAIN = "accuracy/train"
SOLVED_GROUP_FRAC = "accuracy/solved_group_frac"
ACCURACY_TRAIN_STDERR = "accuracy/train_stderr"
EVAL_ACCURACY = "eval/accuracy"
EVAL_NUM_SAMPLES = "eval/num_samples"

# tool use (multiturn/metrics.py makes them; the report and the dashboard chart them)
TOOL_CALL_FREQUENCY = "tools/call_frequency"
TOOL_FAILURE_FREQUENCY = "tools/failure_frequency"
TOOL_CALLED_FRAC = "tools/called_frac"

# policy
LOSS = "policy/loss"
KL = "policy/kl"
ENTROPY = "policy/entropy"
CLIP_FRAC = "policy/clip_frac"
GRAD_NORM = "policy/grad_norm"
LEARNING_RATE = "policy/lr"

# lengths
LENGTH_MEAN = "completions/length/mean"
TRUNCATED_FRAC = "completions/truncated_frac"
FINISHED_FRAC = "completions/finished_frac"
FINISHED_CORRECT_FRAC = "completions/finished_correct_frac"
TRUNCATED_CORRECT_FRAC = "completions/truncated_correct_frac"
PROMPT_LENGTH_MEAN = "prompts/length/mean"
PROMPT_TRUNCATED_FRAC = "prompts/truncated_frac"
TOKENS_TOTAL = "tokens/total"
TOKENS_CUMULATIVE = "tokens/cumulative"

# throughput and timing
GEN_TOKENS_PER_S = "throughput/gen_tokens_per_s"
BACKPROP_TOKENS_PER_S = "throughput/backprop_tokens_per_s"
STEP_TOKENS_PER_S = "throughput/step_tokens_per_s"
MFU = "perf/mfu"
STEP_SECONDS = "timing/step_s"
ROLLOUT_SECONDS = "timing/rollout_s"
UPDATE_SECONDS = "timing/update_s"
EVAL_SECONDS = "timing/eval_s"
CHECKPOINT_SECONDS = "timing/checkpoint_s"
ELAPSED_SECONDS = "timing/elapsed_s"
GEN_MS_PER_TOKEN = "timing/gen_ms_per_token"

# system
CPU_PERCENT = "system/cpu_percent"
MEMORY_PERCENT = "system/memory_percent"
MEMORY_USED_GB = "system/memory_used_gb"
PROCESS_RSS_GB = "system/process_rss_gb"
ACCEL_ACTIVE_GB = "system/accel_active_gb"
ACCEL_PEAK_GB = "system/accel_peak_gb"
ACCEL_LIMIT_GB = "system/accel_limit_gb"
ACCEL_MEMORY_PERCENT = "system/accel_memory_percent"
ACCEL_HELD_PERCENT = "system/accel_held_percent"
SWAP_USED_GB = "system/swap_used_gb"
MEMORY_PRESSURE_LEVEL = "system/memory_pressure_level"
# the Mac's physical state (mac_state.py)
THERMAL_WARNING_LEVEL = "system/thermal_warning_level"
CPU_SPEED_LIMIT = "system/cpu_speed_limit_percent"
ON_BATTERY = "system/on_battery"
LOW_POWER_MODE = "system/low_power_mode"

# the samples table (TensorBoard text, W&B table)
SAMPLES_TABLE = "samples/completions"

# dynamic sampling, made in the trainer
REDRAWN_PROMPTS = "sampling/redrawn_prompts"


def legend_names(metrics: list[str]) -> list[str]:
    """Names without the path segments all of them share, front and back.

    [rewards/a/mean, rewards/b/mean] -> [a, b]; [accuracy/train, eval/accuracy]
    stay whole; a single metric keeps its full name.
    """
    if len(metrics) < 2:
        return list(metrics)
    parts = [m.split("/") for m in metrics]
    shortest = min(len(p) for p in parts)
    front = 0
    while front < shortest - 1 and len({p[front] for p in parts}) == 1:
        front += 1
    back = 0
    while back < shortest - front - 1 and len({p[-1 - back] for p in parts}) == 1:
        back += 1
    return ["/".join(p[front : len(p) - back]) for p in parts]
