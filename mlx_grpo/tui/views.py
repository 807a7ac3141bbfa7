"""What each chart view shows: its tiles and its charts, by canonical metric name.

A chart's metrics may be patterns, as in alert rules (`*` matches within one
path segment): the per-function reward charts find the run's reward functions
by themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..telemetry.alerts import metric_pattern


@dataclass(frozen=True)
class ChartSpec:
    title: str
    metrics: tuple[str, ...]
    # Names matching a pattern that are not wanted (e.g. the total among per-function rewards).
    exclude: tuple[str, ...] = ()


@dataclass(frozen=True)
class ViewSpec:
    tiles: tuple[tuple[str, str], ...]  # (label, metric)
    charts: tuple[ChartSpec, ...]


def resolve(spec: ChartSpec, available: list[str]) -> list[str]:
    """The chart's metrics that exist in at least one run, in spec order then name order."""
    out: list[str] = []
    for m in spec.metrics:
        rx = metric_pattern(m)
        if rx is None:
            if m in available and m not in out:
                out.append(m)
            continue
        out.extend(sorted(n for n in available if rx.match(n) and n not in spec.exclude and n not in out))
    return out


OVERVIEW = ViewSpec(
    tiles=(
        ("reward", "rewards/total/mean"),
        ("accuracy", "accuracy/train"),
        ("eval acc", "eval/accuracy"),
        ("KL", "policy/kl"),
        ("entropy", "policy/entropy"),
        ("length", "completions/length/mean"),
        ("gen tok/s", "throughput/gen_tokens_per_s"),
        ("step s", "timing/step_s"),
    ),
    charts=(
        ChartSpec("total reward", ("rewards/total/mean",)),
        ChartSpec("reward per function", ("rewards/*/mean",), exclude=("rewards/total/mean",)),
        ChartSpec("accuracy", ("accuracy/train", "eval/accuracy")),
    ),
)

POLICY = ViewSpec(
    tiles=(
        ("KL", "policy/kl"),
        ("entropy", "policy/entropy"),
        ("PPO clip frac", "policy/clip_frac"),
        ("loss", "policy/loss"),
        ("grad norm", "policy/grad_norm"),
        ("lr", "policy/lr"),
    ),
    charts=(
        ChartSpec("KL to reference", ("policy/kl",)),
        ChartSpec("entropy", ("policy/entropy",)),
        ChartSpec("clip fractions", ("policy/clip_frac_low", "policy/clip_frac_high", "policy/clip_frac")),
        ChartSpec("loss", ("policy/loss", "policy/pg_loss")),
        ChartSpec("grad norm", ("policy/grad_norm",)),
        ChartSpec("importance ratio", ("policy/ratio/mean", "policy/ratio/p95", "policy/ppo_kl")),
    ),
)

LENGTHS = ViewSpec(
    tiles=(
        ("length", "completions/length/mean"),
        ("truncated", "completions/truncated_frac"),
        ("finished", "completions/finished_frac"),
        ("prompt len", "prompts/length/mean"),
        ("tokens/step", "tokens/total"),
    ),
    charts=(
        ChartSpec("completion length", ("completions/length/mean", "completions/length/min", "completions/length/max")),
        ChartSpec("truncation", ("completions/truncated_frac", "prompts/truncated_frac")),
        ChartSpec("finished / correct",
                  ("completions/finished_frac", "completions/finished_correct_frac", "completions/truncated_correct_frac")),
        ChartSpec("prompt length", ("prompts/length/mean",)),
    ),
)

THROUGHPUT = ViewSpec(
    tiles=(
        ("gen tok/s", "throughput/gen_tokens_per_s"),
        ("backprop tok/s", "throughput/backprop_tokens_per_s"),
        ("step s", "timing/step_s"),
        ("rollout s", "timing/rollout_s"),
        ("update s", "timing/update_s"),
        ("gen ms/tok", "timing/gen_ms_per_token"),
    ),
    charts=(
        ChartSpec("tokens per second", ("throughput/gen_tokens_per_s", "throughput/backprop_tokens_per_s",
                                        "throughput/step_tokens_per_s")),
        ChartSpec("phase timings (s)", ("timing/step_s", "timing/rollout_s", "timing/reward_s", "timing/ref_s",
                                        "timing/update_s", "timing/checkpoint_s", "timing/eval_s")),
        ChartSpec("ms per token", ("timing/gen_ms_per_token", "timing/update_ms_per_token")),
    ),
)

SYSTEM = ViewSpec(
    tiles=(
        ("CPU %", "system/cpu_percent"),
        ("memory %", "system/memory_percent"),
        ("process GB", "system/process_rss_gb"),
        ("accel GB", "system/accel_active_gb"),
        ("accel peak", "system/accel_peak_gb"),
        ("accel limit", "system/accel_limit_gb"),
    ),
    charts=(
        ChartSpec("accelerator memory vs limit (GB)",
                  ("system/accel_active_gb", "system/accel_peak_gb", "system/accel_limit_gb")),
    ),
)

# Metrics of the system view drawn as sparklines under its tiles.
SYSTEM_SPARKLINES = (
    ("CPU %", "system/cpu_percent"),
    ("memory %", "system/memory_percent"),
    ("memory used GB", "system/memory_used_gb"),
    ("process RSS GB", "system/process_rss_gb"),
    ("accel active GB", "system/accel_active_gb"),
    ("accel memory %", "system/accel_memory_percent"),
)
