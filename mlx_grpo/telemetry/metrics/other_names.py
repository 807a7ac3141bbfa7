"""Other tools' metric names, and the metric of ours that answers each.

Someone arriving from TRL, verl/TinyZero, Tunix or a TensorBoard GRPO guide knows a metric by that
tool's name (`frac_reward_zero_std`, `actor/pg_clipfrac`, `Train/KLPenalty`). `lookup(name)` finds
ours; `mlx-grpo metrics --other-names` lists them all, and the dashboard's filter accepts them.
Where no metric can answer (a critic value in a critic-free algorithm, a config key), the note says
why. Imports no mlx.
"""

from __future__ import annotations

from dataclasses import dataclass

from .catalogue import CATALOGUE, find_entry
from .names import (
    ACCEL_ACTIVE_GB,
    ACCEL_LIMIT_GB,
    ACCEL_MEMORY_PERCENT,
    ACCURACY_TRAIN,
    BACKPROP_TOKENS_PER_S,
    CHECKPOINT_SECONDS,
    CLIP_FRAC,
    CPU_PERCENT,
    ELAPSED_SECONDS,
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
    MEMORY_PERCENT,
    MEMORY_USED_GB,
    PROCESS_RSS_GB,
    PROMPT_LENGTH_MEAN,
    PROMPT_TRUNCATED_FRAC,
    REWARD_MEAN,
    REWARD_STD,
    ROLLOUT_SECONDS,
    SAMPLES_TABLE,
    SAMPLING_LOGP_DIFF_MAX,
    SAMPLING_LOGP_DIFF_MEAN,
    SIGNAL_TO_NOISE,
    STEP_SECONDS,
    TOKENS_CUMULATIVE,
    TOKENS_TOTAL,
    TRUNCATED_CORRECT_FRAC,
    TRUNCATED_FRAC,
    UPDATE_SECONDS,
    ZERO_STD_GROUP_FRAC,
)


def _resolves(answer: str) -> bool:
    """An answer names either an entry (pattern text included) or a concrete name an entry covers."""
    return any(spec.name == answer for spec in CATALOGUE) or find_entry(answer) is not None


@dataclass(frozen=True)
class OtherName:
    """A metric name another tool (or guide) uses, the canonical names that answer it, and a note."""

    source: str  # a key of SOURCES
    name: str
    answers: tuple[str, ...]
    note: str = ""


SOURCES = {
    "trl": "TRL's GRPOTrainer logs",
    "tunix": "the Tunix / W&B GRPO metrics guide",
    "wandb-guide": "the W&B visualization guide for GRPO",
    "verl": "TinyZero / verl",
    "reward-monitor": "the reward-monitoring system (RewardMonitor-style dashboards)",
    "tensorboard-guide": "the TensorBoard GRPO metrics guide",
}

NOT_A_METRIC_CONFIG = ("a run setting, not a metric: the resolved config is in run.json `config`, the W&B run "
                       "config and TensorBoard hparams")
STEP_AXIS = ("not a metric: every metrics.jsonl record carries `step`; it is the global step in TensorBoard and "
             "the step axis in W&B")
CRITIC_FREE = "GRPO has no critic (value network): there are no value predictions, value losses or critic updates"


def _m(source: str, name: str, *answers: str, note: str = "") -> OtherName:
    return OtherName(source, name, tuple(answers), note)


def _trl() -> list[OtherName]:
    s = "trl"
    return [
        _m(s, "reward", REWARD_MEAN),
        _m(s, "reward_std", REWARD_STD),
        _m(s, "rewards/{fn}/mean", "rewards/<fn>/mean"),
        _m(s, "rewards/{fn}/std", "rewards/<fn>/std"),
        _m(s, "frac_reward_zero_std", ZERO_STD_GROUP_FRAC),
        _m(s, "kl", KL),
        _m(s, "entropy", ENTROPY),
        _m(s, "loss", LOSS),
        _m(s, "grad_norm", GRAD_NORM),
        _m(s, "learning_rate", LEARNING_RATE),
        _m(s, "num_tokens", TOKENS_CUMULATIVE, note="tokens/total is the step's own count"),
        _m(s, "completions/mean_terminated_length", "completions/terminated_length/mean"),
        _m(s, "completions/min_terminated_length", "completions/terminated_length/min"),
        _m(s, "completions/max_terminated_length", "completions/terminated_length/max"),
        _m(s, "clip_ratio/low_min", "policy/clip_frac_low_min",
           note="the lowest per-completion share; TRL's is the lowest rank mean"),
        _m(s, "clip_ratio/high_max", "policy/clip_frac_high_max",
           note="the highest per-completion share; TRL's is the highest rank mean"),
        _m(s, "completions/mean_length", LENGTH_MEAN),
        _m(s, "completions/min_length", "completions/length/min"),
        _m(s, "completions/max_length", "completions/length/max"),
        _m(s, "completions/clipped_ratio", TRUNCATED_FRAC,
           note="completions cut by the length budget (truncated), not PPO clipping"),
        _m(s, "clip_ratio/low_mean", "policy/clip_frac_low"),
        _m(s, "clip_ratio/high_mean", "policy/clip_frac_high"),
        _m(s, "clip_ratio/region_mean", CLIP_FRAC),
        _m(s, "sampling/sampling_logp_difference/mean", SAMPLING_LOGP_DIFF_MEAN),
        _m(s, "sampling/sampling_logp_difference/max", SAMPLING_LOGP_DIFF_MAX),
        _m(s, "sampling/importance_sampling_ratio/min", "sampling/importance_ratio/min"),
        _m(s, "sampling/importance_sampling_ratio/mean", "sampling/importance_ratio/mean"),
        _m(s, "sampling/importance_sampling_ratio/max", "sampling/importance_ratio/max"),
    ]


def _tunix() -> list[OtherName]:
    s = "tunix"
    out = [
        _m(s, "rewards/{name}_mean", "rewards/<fn>/mean"),
        _m(s, "rewards/{name}_max", "rewards/<fn>/max"),
        _m(s, "rewards/{name}_min", "rewards/<fn>/min"),
        _m(s, "rewards/{name}_hist", "rewards/<fn>/hist"),
        _m(s, "rewards/{name}_recent_mean", "rewards/<fn>/recent_mean"),
        _m(s, "rewards/total_mean", REWARD_MEAN,
           note="the mean of the weighted total; equals the sum of the function means when every weight is 1 "
                "and no score is missing"),
        _m(s, "train/step", note=STEP_AXIS),
        _m(s, "WANDB_API_KEY", note="the guide turns W&B on whenever this key is set; here W&B is opt-in "
                                    "(--wandb, or wandb: true): the key alone never sends a run anywhere"),
        _m(s, "rewards/rubric_mean", "rewards/rubric/mean"),
        _m(s, "rewards/rubric_max", "rewards/rubric/max"),
        _m(s, "rewards/rubric_min", "rewards/rubric/min"),
        _m(s, "criteria/{rubric_name}/{criterion_name}_mean", "criteria/<rubric>/<criterion>/mean"),
        _m(s, "rubric_criteria_summary", "final/rubric_criteria_summary", "final/criteria/<rubric>/<criterion>/mean",
           "final/criteria/<rubric>/<criterion>/std", "final/criteria/<rubric>/<criterion>/min",
           "final/criteria/<rubric>/<criterion>/max", "final/criteria/<rubric>/<criterion>/total_samples"),
        _m(s, "final/{name}_mean", "final/<fn>/mean"),
        _m(s, "final/{name}_std", "final/<fn>/std"),
        _m(s, "final/{name}_max", "final/<fn>/max"),
        _m(s, "final/{name}_min", "final/<fn>/min"),
        _m(s, "final/{name}_total_samples", "final/<fn>/total_samples"),
        _m(s, "rewards/*_mean", "rewards/<fn>/mean", REWARD_MEAN, note="dashboard panel over all means"),
        _m(s, "rewards/*_hist", "rewards/<fn>/hist", "rewards/total/hist", note="dashboard panel"),
        _m(s, "final/*_mean", "final/<fn>/mean", "charts/reward_breakdown",
           note="the guide's bar chart of final means is charts/reward_breakdown at the end of the run"),
        _m(s, "criteria/*/*_mean", "criteria/<rubric>/<criterion>/mean", note="dashboard panel"),
        _m(s, "system metrics (GPU/TPU utilization, memory)", CPU_PERCENT, MEMORY_PERCENT,
           ACCEL_ACTIVE_GB, "system/gpu_utilization_percent",
           note="W&B's own system charts stay on as well"),
    ]
    config = ("model_id", "num_steps", "learning_rate", "batch_size", "use_lora", "lora_rank", "lora_alpha",
              "num_generations", "beta", "epsilon", "temperature", "max_prompt_length", "max_generation_steps",
              "weight_decay", "max_grad_norm", "warmup_fraction", "rubric_file", "rubric_weight")
    out += [_m(s, key, note=NOT_A_METRIC_CONFIG) for key in config]
    out += [
        _m(s, "num_tpu_cores", note="MLX runs on Apple silicon GPUs and CPUs, never on TPUs; the device actually "
                                    "used is in run.json `device`"),
        _m(s, "has_tpu", note="MLX has no TPU backend; run.json `device` names the backend (gpu or cpu)"),
    ]
    return out


def _wandb_guide() -> list[OtherName]:
    s = "wandb-guide"
    example = "a generic example key in the guide's code, not a metric of its own"
    return [
        _m(s, "train/loss", LOSS),
        _m(s, "train/learning_rate", LEARNING_RATE),
        _m(s, "train/reward", REWARD_MEAN),
        _m(s, "train/grad_norm", GRAD_NORM),
        _m(s, "step", note=STEP_AXIS),
        _m(s, "metric", note=example),
        _m(s, "custom/metric_a", note=example),
        _m(s, "custom/metric_b", note=example),
        _m(s, "custom/metric_c", note=example),
        _m(s, "table", SAMPLES_TABLE, note="the guide's incrementally grown table; ours is the "
                                                   "completions table, whose rows accumulate"),
        _m(s, "rewards/mean", REWARD_MEAN),
        _m(s, "rewards/std", REWARD_STD),
        _m(s, "rewards/min", "rewards/total/min"),
        _m(s, "rewards/max", "rewards/total/max"),
        _m(s, "rewards/median", "rewards/total/median"),
        _m(s, "rewards/q25", "rewards/total/q25"),
        _m(s, "rewards/q75", "rewards/total/q75"),
        _m(s, "rewards/distribution", "rewards/total/hist"),
        _m(s, "rewards/total", REWARD_MEAN),
        _m(s, "rewards/correctness", "rewards/<fn>/mean", note="<fn> = the correctness function, e.g. answer_check"),
        _m(s, "rewards/format", "rewards/<fn>/mean", note="<fn> = a format function, e.g. format_exact"),
        _m(s, "rewards/correctness_mean", "rewards/<fn>/mean", note="<fn> = answer_check"),
        _m(s, "rewards/correctness_rate", "rewards/<fn>/positive_frac", ACCURACY_TRAIN,
           note="fraction of completions with a positive score; accuracy/train counts right answers directly"),
        _m(s, "eval/{k}", EVAL_ACCURACY),
        _m(s, "generations", SAMPLES_TABLE,
           note="columns step, prompt, reasoning, answer, ground truth, per-function rewards, total, advantage"),
        _m(s, "generation/answer_length_dist", "completions/length/hist",
           note="lengths of whole completions in tokens; the length of the extracted answer alone is not measured"),
        _m(s, "generation/length", LENGTH_MEAN),
        _m(s, "generation/quality", REWARD_MEAN,
           note="the guide does not define it; the total reward is this trainer's measure of quality"),
        _m(s, "rewards/breakdown", "charts/reward_breakdown"),
        _m(s, "reward_landscape_3d", "charts/reward_landscape_3d"),
        _m(s, "policy_evolution_3d", "charts/policy_evolution_3d"),
        _m(s, "reward_components_3d", "charts/reward_components_3d", "charts/reward_breakdown",
           note="(step, reward function, score) of every completion as a 3D cloud; the per-function series are "
                "rewards/<fn>/*"),
        _m(s, "reward_surface", "charts/reward_heatmap", "charts/reward_landscape_3d",
           note="the step x example reward surface as a heatmap, and as a 3D point cloud"),
        _m(s, "rl/kl_divergence", KL),
        _m(s, "rl/policy_entropy", ENTROPY),
        _m(s, "rl/value_estimate", note=CRITIC_FREE),
        _m(s, "final_reward", "final/total/mean"),
        _m(s, "run_comparison", note="comparing runs is a command over run directories (mlx-grpo compare), "
                                     "not a metric of one run"),
    ]


def _verl() -> list[OtherName]:
    s = "verl"
    out = _verl_training(s) + _verl_completions(s) + _verl_timing(s)
    for stat in ("mean", "max", "min"):
        out += [
            _m(s, f"critic/score/{stat}", f"rewards/total/{stat}", note="raw task score before any KL shaping"),
            _m(s, f"critic/rewards/{stat}", f"rewards/total/{stat}",
               note="no KL shaping of rewards here (the KL is in the loss), so rewards equal scores"),
            _m(s, f"critic/returns/{stat}", f"advantages/{stat}",
               note="with outcome rewards and no critic, GRPO's returns are its advantages"),
            _m(s, f"critic/values/{stat}", note=CRITIC_FREE),
        ]
    for name in ("current_window", "mean_success_length", "median_success_length", "std_success_length",
                 "p95_success_length", "num_success_samples", "success_rate", "success_rate_ema",
                 "exploration_rate", "epsilon", "cumulative_success_rate", "explored_step"):
        out.append(_m(s, f"adaptive_window/{name}", f"adaptive_window/{name}"))
    return out


def _verl_training(s: str) -> list[OtherName]:
    """verl's actor, critic and length metrics."""
    return [
        _m(s, "actor/entropy_loss", ENTROPY),
        _m(s, "actor/pg_loss", "policy/pg_loss"),
        _m(s, "actor/pg_clipfrac", CLIP_FRAC),
        _m(s, "actor/ppo_kl", "policy/ppo_kl"),
        _m(s, "actor/kl_loss", "policy/kl_penalty", KL),
        _m(s, "actor/kl_coef", "policy/kl_coef"),
        _m(s, "actor/is_ratio/mean", "policy/ratio/mean"),
        _m(s, "actor/is_ratio/std", "policy/ratio/std"),
        _m(s, "actor/is_ratio/p95", "policy/ratio/p95"),
        _m(s, "actor/is_log_ratio/mean", "policy/log_ratio/mean"),
        _m(s, "actor/is_log_ratio/std", "policy/log_ratio/std"),
        _m(s, "actor/is_clip/outside_frac", "policy/outside_frac"),
        _m(s, "actor/grad_norm", GRAD_NORM),
        _m(s, "actor/lr", LEARNING_RATE),
        _m(s, "critic/kl", KL, note="here the KL is a loss term, not reward shaping"),
        _m(s, "critic/kl_coeff", "policy/kl_coef"),
        _m(s, "critic/advantages/mean", "advantages/mean"),
        _m(s, "critic/advantages/max", "advantages/max"),
        _m(s, "critic/advantages/min", "advantages/min"),
        _m(s, "critic/vf_explained_var", note=CRITIC_FREE),
        _m(s, "response_length/mean", LENGTH_MEAN),
        _m(s, "response_length/max", "completions/length/max"),
        _m(s, "response_length/min", "completions/length/min"),
        _m(s, "response_length/clip_ratio", TRUNCATED_FRAC),
        _m(s, "prompt_length/mean", PROMPT_LENGTH_MEAN),
        _m(s, "prompt_length/max", "prompts/length/max"),
        _m(s, "prompt_length/min", "prompts/length/min"),
        _m(s, "prompt_length/clip_ratio", PROMPT_TRUNCATED_FRAC),
        _m(s, "tokens/prompt_total", "tokens/prompt_total"),
        _m(s, "tokens/response_total", "tokens/completion_total"),
        _m(s, "tokens/overall_total", TOKENS_TOTAL),
    ]


def _verl_completions(s: str) -> list[OtherName]:
    """verl's completion, difficulty, adaptive-window and S-GRPO metrics."""
    return [
        _m(s, "completion/truncated_frac", TRUNCATED_FRAC,
           note="truncated means the budget ran out before an end-of-sequence token"),
        _m(s, "completion/finished_frac", FINISHED_FRAC),
        _m(s, "completion/truncated_correct_frac", TRUNCATED_CORRECT_FRAC),
        _m(s, "completion/finished_correct_frac", FINISHED_CORRECT_FRAC),
        _m(s, "completion/correct_mean_length", "completions/correct_length/mean"),
        _m(s, "difficulty/3_acc", "difficulty/<level>/accuracy", note="<level> = 3"),
        _m(s, "difficulty/3_count", "difficulty/<level>/count", note="<level> = 3"),
        _m(s, "difficulty/4_acc", "difficulty/<level>/accuracy", note="<level> = 4"),
        _m(s, "difficulty/4_count", "difficulty/<level>/count", note="<level> = 4"),
        _m(s, "adaptive_window/cumulative_reward", "rewards/cumulative",
           note="one cumulative reward for the run, whether or not the window controller is on"),
        _m(s, "sgrpo/exit_1_accuracy", "sgrpo/exit_<k>/accuracy", note="<k> = 1"),
        _m(s, "sgrpo/exit_2_accuracy", "sgrpo/exit_<k>/accuracy", note="<k> = 2"),
        _m(s, "sgrpo/exit_k_accuracy", "sgrpo/exit_<k>/accuracy"),
        _m(s, "sgrpo/avg_correct_exit_position", "sgrpo/avg_correct_exit_position"),
        _m(s, "sgrpo/overall_accuracy", "sgrpo/overall_accuracy"),
    ]


def _verl_timing(s: str) -> list[OtherName]:
    """verl's timers, and its files that are not metrics."""
    return [
        _m(s, "timing_s/step", STEP_SECONDS),
        _m(s, "timing_s/gen", ROLLOUT_SECONDS),
        _m(s, "timing_s/ref", "timing/ref_s"),
        _m(s, "timing_s/values", note=CRITIC_FREE),
        _m(s, "timing_s/adv", "timing/reward_s", "timing/advantage_s",
           note="rewards and advantages are timed separately here"),
        _m(s, "timing_s/update_critic", note=CRITIC_FREE),
        _m(s, "timing_s/update_actor", UPDATE_SECONDS),
        _m(s, "timing_s/save_checkpoint", CHECKPOINT_SECONDS),
        _m(s, "timing_s/testing", EVAL_SECONDS),
        _m(s, "timing_per_token_ms/gen", GEN_MS_PER_TOKEN),
        _m(s, "timing_per_token_ms/ref", "timing/ref_ms_per_token"),
        _m(s, "timing_per_token_ms/values", note=CRITIC_FREE),
        _m(s, "timing_per_token_ms/adv", "timing/reward_ms_per_token", "timing/advantage_ms_per_token"),
        _m(s, "timing_per_token_ms/update_critic", note=CRITIC_FREE),
        _m(s, "timing_per_token_ms/update_actor", "timing/update_ms_per_token"),
        _m(s, "time/elapsed_s", ELAPSED_SECONDS),
        _m(s, "train/cumulative_reward", "rewards/cumulative"),
        _m(s, "entropy_step_{step:06d}.pt (per-token entropy and varentropy dumps)",
           note="files on disk, not metrics; policy/entropy is the per-step mean"),
    ]


def _reward_monitor() -> list[OtherName]:
    s = "reward-monitor"
    return [
        _m(s, "rewards/mean", REWARD_MEAN, note="mean of the weighted total over completions"),
        _m(s, "rewards/std", REWARD_STD),
        _m(s, "rewards/min", "rewards/total/min"),
        _m(s, "rewards/max", "rewards/total/max"),
        _m(s, "rewards/total", REWARD_MEAN, "rewards/cumulative",
           note="the per-completion sum over functions is the total; its batch mean is rewards/total/mean"),
        _m(s, SIGNAL_TO_NOISE, SIGNAL_TO_NOISE),
        _m(s, "rewards/entropy", "rewards/entropy"),
        _m(s, "rewards/variance", "rewards/total/variance"),
        _m(s, "rewards/functions/{name}", "rewards/<fn>/mean"),
        _m(s, "rewards/functions/{name}_std", "rewards/<fn>/std"),
        _m(s, "contributions/{name}", "rewards/<fn>/contribution_pct"),
        _m(s, "training/kl_divergence", KL),
        _m(s, "training/policy_entropy", ENTROPY),
        _m(s, "training/advantage_mean", "advantages/mean"),
        _m(s, "training/advantage_std", "advantages/std"),
    ]


def _tensorboard_guide() -> list[OtherName]:
    s = "tensorboard-guide"
    pairs = {
        "Train/Loss": LOSS, "Train/PolicyLoss": "policy/pg_loss", "Train/KLPenalty": "policy/kl_penalty",
        "Train/AvgReward": REWARD_MEAN, "Train/RewardStd": REWARD_STD,
        "Train/RewardMin": "rewards/total/min", "Train/RewardMax": "rewards/total/max",
        "Train/RewardVariance": "rewards/total/variance",
        "Epoch/AvgReward": "epoch/reward/mean", "Epoch/AvgLoss": "epoch/loss/mean",
        "Epoch/RewardVariance": "epoch/reward/variance", "Epoch/RewardTrend": "epoch/reward/trend",
        "Epoch/LossTrend": "epoch/loss/trend", "Epoch/APITokens": "epoch/api_tokens",
        "Epoch/NumSamples": "epoch/num_samples",
        "Performance/Generation_TokensPerSec": GEN_TOKENS_PER_S,
        "Performance/Generation_Time": ROLLOUT_SECONDS,
        "Performance/Generation_AvgTokensPerSec": "throughput/gen_tokens_per_s/avg",
        "Performance/Generation_P99TokensPerSec": "throughput/gen_tokens_per_s/p99",
        "Performance/Backprop_TokensPerSec": BACKPROP_TOKENS_PER_S,
        "Performance/Backprop_AvgTokensPerSec": "throughput/backprop_tokens_per_s/avg",
        "Performance/Backprop_P99TokensPerSec": "throughput/backprop_tokens_per_s/p99",
        "System/CPU_Percent": CPU_PERCENT, "System/Memory_Percent": MEMORY_PERCENT,
        "System/Memory_Used_GB": MEMORY_USED_GB, "System/Memory_Available_GB": "system/memory_available_gb",
        "System/Process_Memory_GB": PROCESS_RSS_GB, "System/GPU_Memory_Used_GB": ACCEL_ACTIVE_GB,
        "System/GPU_Memory_Percent": ACCEL_MEMORY_PERCENT,
    }
    out = [_m(s, their_name, answer) for their_name, answer in pairs.items()]
    out += [
        _m(s, "System/GPU_Memory_Total_GB", ACCEL_LIMIT_GB,
           note="the recommended working-set size, the memory MLX may use on the GPU"),
        _m(s, "System/GPU_Utilization", "system/gpu_utilization_percent",
           note="measured (ioreg), not estimated; macOS only"),
    ]
    for criterion in ("Correctness", "CodeQuality", "Efficiency", "Documentation"):
        out.append(_m(s, f"Scoring/{criterion}", "scoring/<criterion>/weight",
                      note="<criterion> = the rubric criterion's name; its score is "
                           "criteria/<rubric>/<criterion>/mean"))
    return out


OTHER_NAMES: tuple[OtherName, ...] = tuple(_trl() + _tunix() + _wandb_guide() + _verl() + _reward_monitor()
                                           + _tensorboard_guide())


def unresolved_answers() -> list[tuple[OtherName, str]]:
    """Answers that name nothing in the catalogue (a bug in this module; tested to be empty)."""
    return [(m, a) for m in OTHER_NAMES for a in m.answers if not _resolves(a)]


def lookup(name: str) -> list[OtherName]:
    """Every entry for `name` as another tool spells it (exact, then case-insensitive)."""
    exact = [m for m in OTHER_NAMES if m.name == name]
    return exact or [m for m in OTHER_NAMES if m.name.lower() == name.lower()]


def other_names_json() -> list[dict]:
    """Every other tool's name and ours as plain data (`mlx-grpo metrics --other-names --json`)."""
    return [{"source": m.source, "tool": SOURCES[m.source], "name": m.name, "answers": list(m.answers),
             "note": m.note} for m in OTHER_NAMES]


def render_markdown() -> list[str]:
    """The METRICS.md section: each tool's names and ours."""
    lines = ["# Other tools' names", "",
             "Metric names of other GRPO trainers and guides, and the canonical metric that answers each, or why",
             "none can. `mlx-grpo metrics NAME` looks one up; the dashboard's `/` filter accepts these names.", ""]
    for source, tool in SOURCES.items():
        lines += [f"## {source}: {tool}", "", "| their name | ours | note |", "|---|---|---|"]
        for m in OTHER_NAMES:
            if m.source == source:
                answers = ", ".join(f"`{a}`" for a in m.answers) or "none"
                name, note = (text.replace("|", chr(92) + "|") for text in (m.name, m.note))
                lines.append(f"| `{name}` | {answers} | {note} |")
        lines.append("")
    return lines


# Names of older versions, read as today's (a run directory written before a rename still charts).
ALIASES: dict[str, str] = {
    "completions/length_mean": LENGTH_MEAN, "completions/length_min": "completions/length/min",
    "completions/length_max": "completions/length/max", "completions/length_hist": "completions/length/hist",
    "completions/correct_length_mean": "completions/correct_length/mean",
    "completions/clip_ratio": TRUNCATED_FRAC,  # truncation, not PPO clipping (policy/clip_frac)
    "prompts/length_mean": PROMPT_LENGTH_MEAN, "prompts/length_min": "prompts/length/min",
    "prompts/length_max": "prompts/length/max", "prompts/clip_ratio": PROMPT_TRUNCATED_FRAC,
    "throughput/gen_tokens_per_s_avg": "throughput/gen_tokens_per_s/avg",
    "throughput/gen_tokens_per_s_p99": "throughput/gen_tokens_per_s/p99",
    "throughput/backprop_tokens_per_s_avg": "throughput/backprop_tokens_per_s/avg",
    "throughput/backprop_tokens_per_s_p99": "throughput/backprop_tokens_per_s/p99",
    "policy/ratio_mean": "policy/ratio/mean", "policy/ratio_std": "policy/ratio/std",
    "policy/ratio_p95": "policy/ratio/p95", "policy/log_ratio_mean": "policy/log_ratio/mean",
    "policy/log_ratio_std": "policy/log_ratio/std",
    "epoch/reward_mean": "epoch/reward/mean", "epoch/reward_variance": "epoch/reward/variance",
    "epoch/reward_trend": "epoch/reward/trend", "epoch/loss_mean": "epoch/loss/mean",
    "epoch/loss_trend": "epoch/loss/trend",
}


def canonical_record(record: dict) -> dict:
    """`record` with old metric names renamed to today's (the same dict when it has none)."""
    if not any(key in ALIASES for key in record):
        return record
    return {ALIASES.get(key, key): value for key, value in record.items()}
