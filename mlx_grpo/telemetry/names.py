"""Metric names that cross the run directory: written by the trainer, read by the console, dashboard,
report and alerts. Each is defined here once; the catalogue (catalogue.py) describes it.

A name used on one side only stays a literal where it is made (step_data.py, reward_stats.py):
a rename there is then one edit, and `tests/test_telemetry_catalogue.py` checks every constant
here names a catalogue entry.
"""

REWARD_MEAN = "rewards/total/mean"
REWARD_STD = "rewards/total/std"
ACCURACY_TRAIN = "accuracy/train"
EVAL_ACCURACY = "eval/accuracy"
KL = "policy/kl"
ENTROPY = "policy/entropy"
LOSS = "policy/loss"
GRAD_NORM = "policy/grad_norm"
LENGTH_MEAN = "completions/length/mean"
TRUNCATED_FRAC = "completions/truncated_frac"
ZERO_STD_GROUP_FRAC = "rewards/zero_std_group_frac"
GEN_TOKENS_PER_S = "throughput/gen_tokens_per_s"
BACKPROP_TOKENS_PER_S = "throughput/backprop_tokens_per_s"
STEP_TOKENS_PER_S = "throughput/step_tokens_per_s"
STEP_SECONDS = "timing/step_s"
REDRAWN_PROMPTS = "sampling/redrawn_prompts"  # dynamic sampling, made in the trainer


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
