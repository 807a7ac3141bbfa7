"""The metric catalogue: every name the trainer and its sinks emit, and where each seed metric went.

One canonical namespace (lowercase, slash-grouped) is shared by `metrics.jsonl`, TensorBoard and
W&B. Names that vary per run carry a placeholder, filled with the user's own names as written:

- `<fn>` a reward function name (never `total`, which is the weighted sum of all functions)
- `<level>` a difficulty label from the data
- `<rubric>`, `<criterion>` a rubric and one of its criteria
- `<k>` a positive integer (an exit position of S-GRPO)

Public API:

- `MetricSpec`: one catalogue entry (name or pattern, description, unit, group, when, kind).
- `CATALOGUE`: tuple of every `MetricSpec`.
- `find_entry(name) -> MetricSpec | None`: the entry a concrete name belongs to (exact names win
  over patterns); `None` means the name is not catalogued.
- `SeedMapping`: one metric named in a seed document, the canonical names that answer it, a note.
- `SEED_MAP`: tuple of every `SeedMapping` (seeds 000-004).
- `render_markdown() -> str`: the text of METRICS.md.
- `catalogue_json() / seed_map_json() -> list[dict]`: plain data for `mlx-grpo metrics --json`.

`python -m mlx_grpo.telemetry.catalogue --write METRICS.md` regenerates the repository's METRICS.md.
Kinds: `scalar` (a number per record), `histogram` (an array per record, TensorBoard and W&B only),
`summary` (end of run: final_metrics.json and each sink's summary), `chart` / `table` / `text`
(rich W&B or TensorBoard media, not in metrics.jsonl).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

# ----------------------------------------------------------------------------- entries


@dataclass(frozen=True)
class MetricSpec:
    name: str
    description: str
    unit: str
    group: str
    when: str
    kind: str = "scalar"

    @property
    def is_pattern(self) -> bool:
        return "<" in self.name


# Phrases reused by many entries, so the catalogue reads consistently.
EVERY_STEP = "every logged step"
HIST = "every hist_every logged steps, once at least 10 values have accumulated"
EPOCH = "end of each pass over the training data"
FINAL = "end of run (final_metrics.json and each sink's summary)"
RUBRIC = "every logged step, when a rubric is configured"
ADAPTIVE = "every logged step, when adaptive window scheduling is enabled"
SGRPO = "every logged step, when S-GRPO is enabled"
EVAL = "every eval_every steps and at the end"
CRITERIA = "first logged step and every criteria_every steps, when a rubric is configured"
JUDGE = "every logged step, when a rubric has a judge criterion"

_STATS = {
    "mean": "mean",
    "std": "standard deviation (population, ddof 0)",
    "min": "minimum",
    "max": "maximum",
    "median": "median",
    "q25": "25th percentile (linear interpolation)",
    "q75": "75th percentile (linear interpolation)",
}


def _reward_entries() -> list[MetricSpec]:
    out = []
    for stat, words in _STATS.items():
        out.append(MetricSpec(f"rewards/total/{stat}",
                              f"Batch {words} of the weighted total reward of each completion.",
                              "reward", "rewards", EVERY_STEP))
    out += [
        MetricSpec("rewards/total/variance", "Batch variance of the weighted total reward (std squared).",
                   "reward^2", "rewards", EVERY_STEP),
        MetricSpec("rewards/total/recent_mean", "Mean of rewards/total/mean over the last 10 logged steps "
                   "(fewer at the start).", "reward", "rewards", EVERY_STEP),
        MetricSpec("rewards/total/hist", "Distribution of the total reward of every completion since the "
                   "previous histogram.", "reward", "rewards", HIST, "histogram"),
    ]
    for stat, words in _STATS.items():
        out.append(MetricSpec(f"rewards/<fn>/{stat}", f"Batch {words} of reward function <fn>'s unweighted score, "
                              "over the completions it scored.", "reward", "rewards", EVERY_STEP))
    out += [
        MetricSpec("rewards/<fn>/recent_mean", "Mean of rewards/<fn>/mean over the last 10 logged steps in which "
                   "<fn> scored something.", "reward", "rewards", EVERY_STEP),
        MetricSpec("rewards/<fn>/contribution_pct", "Share of <fn> in the batch's absolute weighted reward: "
                   "100 * sum|w_fn * s_fn| / sum over all functions of sum|w * s|. Left out when every score is 0.",
                   "%", "rewards", EVERY_STEP),
        MetricSpec("rewards/<fn>/missing_frac", "Fraction of completions <fn> gave no score for (returned None, "
                   "or raised).", "fraction", "rewards", EVERY_STEP),
        MetricSpec("rewards/<fn>/positive_frac", "Fraction of the completions <fn> scored that got a score "
                   "above 0 (its hit rate).", "fraction", "rewards", EVERY_STEP),
        MetricSpec("rewards/<fn>/hist", "Distribution of <fn>'s scores since the previous histogram.",
                   "reward", "rewards", HIST, "histogram"),
        MetricSpec("rewards/signal_to_noise", "|rewards/total/mean| / rewards/total/std. Left out when the std "
                   "is 0.", "ratio", "rewards", EVERY_STEP),
        MetricSpec("rewards/entropy", "Shannon entropy (bits) of the batch's total rewards binned into 10 "
                   "equal-width bins spanning the batch's min..max; 0 when all totals are equal, at most "
                   "log2(10) = 3.32. Higher means rewards spread over more distinct values.", "bits", "rewards",
                   EVERY_STEP),
        MetricSpec("rewards/zero_std_group_frac", "Fraction of prompt groups whose G completions all got the "
                   "same total reward: their advantages are 0 and they teach nothing.", "fraction", "rewards",
                   EVERY_STEP),
        MetricSpec("rewards/cumulative", "Sum of rewards/total/mean over all steps so far.", "reward",
                   "rewards", EVERY_STEP),
    ]
    return out


def _rubric_entries() -> list[MetricSpec]:
    rubric_words = {"mean": "mean", "min": "minimum", "max": "maximum"}
    out = [MetricSpec(f"rewards/rubric/{stat}", f"Batch {words} of the rubric reward (the weighted criteria "
                      "score of each completion); the rubric is a reward function named `rubric`, so all "
                      "rewards/<fn>/* statistics exist for it too.", "reward", "rubric", RUBRIC)
           for stat, words in rubric_words.items()]
    out += [
        MetricSpec("criteria/<rubric>/<criterion>/mean", "Mean score of one rubric criterion over the "
                   "completions scored since the previous record.", "score", "rubric", CRITERIA),
        MetricSpec("scoring/<criterion>/weight", "Weight of a criterion inside its rubric (constant).", "weight",
                   "rubric", CRITERIA),
        MetricSpec("judge/api_tokens", "Tokens sent to and received from the judge model's API since the "
                   "previous record (retries included).", "tokens", "rubric", JUDGE),
        MetricSpec("judge/api_tokens_total", "Judge API tokens since the start of the run.", "tokens", "rubric",
                   JUDGE),
        MetricSpec("judge/failed_requests", "Judge requests that failed since the previous record (their "
                   "scores are missing).", "count", "rubric", JUDGE),
    ]
    for stat, words in {**{k: _STATS[k] for k in ("mean", "std", "min", "max")},
                        "total_samples": "number of scores"}.items():
        out.append(MetricSpec(f"final/criteria/<rubric>/<criterion>/{stat}", f"Whole-run {words} of one rubric "
                              "criterion's scores.", "count" if stat == "total_samples" else "score", "final",
                              "end of run, when a rubric is configured", "summary"))
    out.append(MetricSpec("final/rubric_criteria_summary", "W&B table: one row per criterion with whole-run mean, "
                          "std, min, max and number of samples.", "", "final",
                          "end of run, when a rubric is configured and W&B is on", "table"))
    return out


def _policy_entries() -> list[MetricSpec]:
    p = "policy"
    return [
        MetricSpec("policy/loss", "The loss that was minimised: policy-gradient loss plus the KL penalty.", "",
                   p, EVERY_STEP),
        MetricSpec("policy/pg_loss", "Clipped policy-gradient (surrogate) loss alone.", "", p, EVERY_STEP),
        MetricSpec("policy/kl", "Mean per-token KL divergence of the policy from the reference model (k3 "
                   "estimator), over completion tokens. Left out when beta is 0 (no reference model is kept).",
                   "nats", p, EVERY_STEP),
        MetricSpec("policy/kl_penalty", "The KL term as added to the loss: beta * policy/kl.", "", p, EVERY_STEP),
        MetricSpec("policy/kl_coef", "beta, the coefficient of the KL term.", "", p, EVERY_STEP),
        MetricSpec("policy/entropy", "Mean per-token entropy of the policy's next-token distribution over "
                   "completion tokens.", "nats", p, EVERY_STEP),
        MetricSpec("policy/clip_frac_low", "Fraction of completion tokens where the lower clip bound was active "
                   "(ratio < 1 - epsilon with a negative advantage).", "fraction", p, EVERY_STEP),
        MetricSpec("policy/clip_frac_high", "Fraction of completion tokens where the upper clip bound was active "
                   "(ratio > 1 + epsilon_high with a positive advantage).", "fraction", p, EVERY_STEP),
        MetricSpec("policy/clip_frac", "Fraction of completion tokens where clipping was active on either side "
                   "(clip_frac_low + clip_frac_high).", "fraction", p, EVERY_STEP),
        MetricSpec("policy/outside_frac", "Fraction of completion tokens whose importance ratio lies outside "
                   "[1 - epsilon, 1 + epsilon_high], whether or not clipping changed the loss.", "fraction", p,
                   EVERY_STEP),
        MetricSpec("policy/ppo_kl", "Approximate KL(pi_old || pi_new) of this update: mean of "
                   "log pi_old - log pi_new over completion tokens. 0 on the first pass over a rollout.",
                   "nats", p, EVERY_STEP),
        MetricSpec("policy/ratio_mean", "Mean importance ratio pi_new / pi_old over completion tokens (1 when "
                   "the update is on-policy).", "ratio", p, EVERY_STEP),
        MetricSpec("policy/ratio_std", "Standard deviation of the importance ratio.", "ratio", p, EVERY_STEP),
        MetricSpec("policy/ratio_p95", "95th percentile of the importance ratio.", "ratio", p, EVERY_STEP),
        MetricSpec("policy/log_ratio_mean", "Mean log importance ratio.", "nats", p, EVERY_STEP),
        MetricSpec("policy/log_ratio_std", "Standard deviation of the log importance ratio.", "nats", p,
                   EVERY_STEP),
        MetricSpec("policy/grad_norm", "Global L2 norm of the gradient before clipping.", "", p, EVERY_STEP),
        MetricSpec("policy/lr", "Learning rate used by this step's update.", "", p, EVERY_STEP),
        MetricSpec("policy/skipped_updates", "Optimizer updates of this step skipped because the loss or "
                   "gradient was not finite (at most num_iterations).", "count", p, EVERY_STEP),
    ]


def _advantage_entries() -> list[MetricSpec]:
    out = [MetricSpec(f"advantages/{stat}", f"Batch {_STATS[stat]} of the per-completion group-relative "
                      "advantage (every token of a completion shares it).", "", "advantages", EVERY_STEP)
           for stat in ("mean", "std", "min", "max")]
    out.append(MetricSpec("advantages/hist", "Distribution of the advantages since the previous histogram.", "",
                          "advantages", HIST, "histogram"))
    return out


def _length_entries() -> list[MetricSpec]:
    c, pr, t = "completions", "prompts", "tokens"
    return [
        MetricSpec("completions/length_mean", "Mean completion length.", "tokens", c, EVERY_STEP),
        MetricSpec("completions/length_min", "Shortest completion.", "tokens", c, EVERY_STEP),
        MetricSpec("completions/length_max", "Longest completion.", "tokens", c, EVERY_STEP),
        MetricSpec("completions/clip_ratio", "Fraction of completions truncated: they reached the generation "
                   "budget without an end-of-sequence token.", "fraction", c, EVERY_STEP),
        MetricSpec("completions/finished_frac", "Fraction of completions that ended with an end-of-sequence "
                   "token within the budget (1 - clip_ratio).", "fraction", c, EVERY_STEP),
        MetricSpec("completions/truncated_correct_frac", "Among truncated completions, the fraction with the "
                   "right answer. Left out when none was truncated.", "fraction", c, EVERY_STEP),
        MetricSpec("completions/finished_correct_frac", "Among finished completions, the fraction with the right "
                   "answer. Left out when none finished.", "fraction", c, EVERY_STEP),
        MetricSpec("completions/correct_length_mean", "Mean length of the completions with the right answer. "
                   "Left out when none was right.", "tokens", c, EVERY_STEP),
        MetricSpec("completions/length_hist", "Distribution of completion lengths since the previous "
                   "histogram.", "tokens", c, HIST, "histogram"),
        MetricSpec("prompts/length_mean", "Mean prompt length (after truncation).", "tokens", pr, EVERY_STEP),
        MetricSpec("prompts/length_min", "Shortest prompt.", "tokens", pr, EVERY_STEP),
        MetricSpec("prompts/length_max", "Longest prompt.", "tokens", pr, EVERY_STEP),
        MetricSpec("prompts/clip_ratio", "Fraction of prompts cut to max_prompt_length.", "fraction", pr,
                   EVERY_STEP),
        MetricSpec("tokens/prompt_total", "Prompt tokens in the batch, counted once per completion.", "tokens", t,
                   EVERY_STEP),
        MetricSpec("tokens/completion_total", "Completion tokens generated in the batch.", "tokens", t,
                   EVERY_STEP),
        MetricSpec("tokens/total", "tokens/prompt_total + tokens/completion_total.", "tokens", t, EVERY_STEP),
    ]


def _outcome_entries() -> list[MetricSpec]:
    return [
        MetricSpec("accuracy/train", "Fraction of this step's sampled completions with the right answer.",
                   "fraction", "accuracy", EVERY_STEP),
        MetricSpec("eval/accuracy", "Held-out accuracy: greedy completions of the evaluation prompts with the "
                   "right answer.", "fraction", "eval", EVAL),
        MetricSpec("eval/num_samples", "Held-out prompts evaluated (each one greedy completion).", "count", "eval",
                   EVAL),
        MetricSpec("eval/difficulty/<level>/accuracy", "eval/accuracy restricted to prompts labelled <level>.",
                   "fraction", "eval", EVAL + ", when the data has a difficulty column"),
        MetricSpec("eval/difficulty/<level>/count", "Held-out prompts labelled <level>.", "count", "eval",
                   EVAL + ", when the data has a difficulty column"),
        MetricSpec("difficulty/<level>/accuracy", "accuracy/train restricted to completions of prompts labelled "
                   "<level>.", "fraction", "difficulty", "every logged step, when the data has a difficulty column"),
        MetricSpec("difficulty/<level>/count", "Completions of prompts labelled <level> in the batch.", "count",
                   "difficulty", "every logged step, when the data has a difficulty column"),
    ]


def _performance_entries() -> list[MetricSpec]:
    th, ti = "throughput", "timing"
    out = []
    for key, words in (("gen", "Completion tokens generated per second of rollout"),
                       ("backprop", "Tokens through the policy update (prompt + completion, times update passes) "
                        "per second of update")):
        out += [
            MetricSpec(f"throughput/{key}_tokens_per_s", f"{words}, this step.", "tokens/s", th, EVERY_STEP),
            MetricSpec(f"throughput/{key}_tokens_per_s_avg", f"{words}, since the start: total tokens / total "
                       "seconds (so long steps weigh more than short ones).", "tokens/s", th, EVERY_STEP),
            MetricSpec(f"throughput/{key}_tokens_per_s_p99", f"{words}: 99th percentile of the per-step values "
                       "so far.", "tokens/s", th, EVERY_STEP),
        ]
    out.append(MetricSpec("throughput/step_tokens_per_s", "tokens/total / timing/step_s: end-to-end tokens per "
                          "second of the whole step.", "tokens/s", th, EVERY_STEP))
    phases = {
        "rollout": "generating the completions",
        "ref": "reference-model log-probs",
        "reward": "scoring completions with the reward functions",
        "advantage": "computing group advantages",
        "update": "the policy update (all passes)",
    }
    out.append(MetricSpec("timing/step_s", "Wall-clock seconds of the whole step.", "s", ti, EVERY_STEP))
    for phase, words in phases.items():
        out.append(MetricSpec(f"timing/{phase}_s", f"Seconds spent on {words}.", "s", ti, EVERY_STEP))
    out += [
        MetricSpec("timing/checkpoint_s", "Seconds spent saving a checkpoint.", "s", ti,
                   "steps that save a checkpoint"),
        MetricSpec("timing/eval_s", "Seconds spent on held-out evaluation.", "s", ti, "steps that evaluate"),
        MetricSpec("timing/elapsed_s", "Wall-clock seconds since training started.", "s", ti, EVERY_STEP),
        MetricSpec("timing/gen_ms_per_token", "timing/rollout_s in milliseconds per completion token.",
                   "ms/token", ti, EVERY_STEP),
    ]
    for phase in ("ref", "reward", "advantage", "update", "step"):
        out.append(MetricSpec(f"timing/{phase}_ms_per_token", f"timing/{phase}_s in milliseconds per completion "
                              "token trained on.", "ms/token", ti, EVERY_STEP))
    return out


def _system_entries() -> list[MetricSpec]:
    s = "system"
    accel = "every logged step, when the trainer passes an accelerator-memory reader"
    return [
        MetricSpec("system/cpu_percent", "Machine-wide CPU use over the last sampling interval (~1 s).", "%", s,
                   EVERY_STEP),
        MetricSpec("system/memory_percent", "Machine memory in use.", "%", s, EVERY_STEP),
        MetricSpec("system/memory_used_gb", "Machine memory in use (total - available).", "GB", s, EVERY_STEP),
        MetricSpec("system/memory_available_gb", "Machine memory available to new allocations.", "GB", s,
                   EVERY_STEP),
        MetricSpec("system/process_rss_gb", "Resident set size of the training process.", "GB", s, EVERY_STEP),
        MetricSpec("system/accel_active_gb", "MLX memory held by live arrays (mx.get_active_memory).", "GB", s,
                   accel),
        MetricSpec("system/accel_peak_gb", "Peak MLX memory since the start (mx.get_peak_memory).", "GB", s,
                   accel),
        MetricSpec("system/accel_cache_gb", "MLX buffer cache: freed memory kept for reuse (mx.get_cache_memory).",
                   "GB", s, accel),
        MetricSpec("system/accel_limit_gb", "The device's recommended working-set size (Metal); left out where "
                   "the backend reports none.", "GB", s, accel),
        MetricSpec("system/accel_memory_percent", "accel_active_gb as a percentage of accel_limit_gb.", "%", s,
                   accel),
        *(MetricSpec(f"memory/{phase}_peak_gb", f"Peak MLX memory during this step's {words} (the counter is "
                     "reset before the phase): what the phase needs, KV cache and activations included.", "GB",
                     "memory", EVERY_STEP)
          for phase, words in (("rollout", "rollout"), ("ref", "reference pass"), ("update", "update"))),
        MetricSpec("system/gpu_utilization_percent", "GPU 'Device Utilization %' of the Apple GPU as reported by "
                   "ioreg (no sudo). Left out on machines without it.", "%", s, "every logged step, on macOS"),
    ]


def _epoch_entries() -> list[MetricSpec]:
    e = "epoch"
    return [
        MetricSpec("epoch/index", "Number of the pass over the training data that just ended (1-based).", "count",
                   e, EPOCH),
        MetricSpec("epoch/reward_mean", "Mean total reward over every completion of the epoch.", "reward", e,
                   EPOCH),
        MetricSpec("epoch/loss_mean", "Mean of policy/loss over the epoch's steps.", "", e, EPOCH),
        MetricSpec("epoch/reward_variance", "Variance of the total reward over every completion of the epoch.",
                   "reward^2", e, EPOCH),
        MetricSpec("epoch/reward_trend", "epoch/reward_mean minus the previous epoch's (positive = improving). "
                   "Left out after the first epoch.", "reward", e, EPOCH),
        MetricSpec("epoch/loss_trend", "Previous epoch's epoch/loss_mean minus this one's (positive = loss went "
                   "down). Left out after the first epoch.", "", e, EPOCH),
        MetricSpec("epoch/api_tokens", "Judge API tokens used during the epoch.", "tokens", e,
                   "end of each epoch, when a rubric uses a judge"),
        MetricSpec("epoch/num_samples", "Completions scored during the epoch.", "count", e, EPOCH),
        MetricSpec("epoch/partial", "1 when the figures are of the run's last epoch, cut short by the end of the "
                   "run (reported at the last step); 0 for a whole epoch.", "flag", e, EPOCH + ", and the last step"),
    ]


def _final_entries() -> list[MetricSpec]:
    out = []
    words = {**{k: _STATS[k] for k in ("mean", "std", "min", "max")}, "total_samples": "number of scores"}
    for stat, text in words.items():
        unit = "count" if stat == "total_samples" else "reward"
        out.append(MetricSpec(f"final/total/{stat}", f"Whole-run {text} of the total reward of every completion.",
                              unit, "final", FINAL, "summary"))
        out.append(MetricSpec(f"final/<fn>/{stat}", f"Whole-run {text} of reward function <fn>'s scores "
                              "(missing scores excluded).", unit, "final", FINAL, "summary"))
    return out


def _extension_entries() -> list[MetricSpec]:
    a = "adaptive_window"
    out = [
        MetricSpec("adaptive_window/current_window", "Generation budget (max completion tokens) used this step.",
                   "tokens", a, ADAPTIVE),
        MetricSpec("adaptive_window/mean_success_length", "Mean length of the successful completions.", "tokens",
                   a, ADAPTIVE),
        MetricSpec("adaptive_window/median_success_length", "Median length of the successful completions.",
                   "tokens", a, ADAPTIVE),
        MetricSpec("adaptive_window/std_success_length", "Standard deviation of successful completion lengths.",
                   "tokens", a, ADAPTIVE),
        MetricSpec("adaptive_window/p95_success_length", "95th percentile of successful completion lengths.",
                   "tokens", a, ADAPTIVE),
        MetricSpec("adaptive_window/num_success_samples", "Successful completions the window update used.",
                   "count", a, ADAPTIVE),
        MetricSpec("adaptive_window/success_rate", "Fraction of this step's completions counted as successful.",
                   "fraction", a, ADAPTIVE),
        MetricSpec("adaptive_window/success_rate_ema", "Exponential moving average of the success rate.",
                   "fraction", a, ADAPTIVE),
        MetricSpec("adaptive_window/exploration_rate", "Fraction of steps so far on which the controller explored "
                   "(jumped to the maximum budget).", "fraction", a, ADAPTIVE),
        MetricSpec("adaptive_window/epsilon", "Current exploration probability.", "probability", a, ADAPTIVE),
        MetricSpec("adaptive_window/cumulative_success_rate", "Success rate over all steps so far.", "fraction", a,
                   ADAPTIVE),
        MetricSpec("adaptive_window/explored_step", "1 if this step explored, else 0.", "flag", a, ADAPTIVE),
        MetricSpec("sgrpo/exit_<k>/accuracy", "Accuracy of answers taken at exit position <k> (1 = earliest).",
                   "fraction", "sgrpo", SGRPO),
        MetricSpec("sgrpo/avg_correct_exit_position", "Mean exit position among correct answers (lower = "
                   "earlier).", "position", "sgrpo", SGRPO),
        MetricSpec("sgrpo/overall_accuracy", "Accuracy over all exits together.", "fraction", "sgrpo", SGRPO),
    ]
    return out


def _media_entries() -> list[MetricSpec]:
    w = "logged steps that write samples"
    return [
        MetricSpec("samples/completions", "Completions of the step: prompt, reasoning, answer, ground truth, "
                   "per-function rewards, total, advantage (W&B table whose rows accumulate over the run; "
                   "TensorBoard text as a markdown table; samples.jsonl).", "", "samples", w, "table"),
        MetricSpec("alerts", "Alert messages (TensorBoard text; W&B alerts).", "", "alerts", "when an alert fires",
                   "text"),
        MetricSpec("charts/reward_breakdown", "W&B bar chart of each reward function's mean score (unweighted) in "
                   "the batch; at the end, of the whole-run means.", "reward", "charts",
                   "every chart_every logged steps and at the end, W&B only", "chart"),
        MetricSpec("charts/reward_landscape_3d", "W&B 3D point cloud of (step, example index, total reward) over "
                   "the run, axes scaled to comparable ranges, colour from low (blue) to high (red) reward.",
                   "", "charts", "every chart_every logged steps, W&B only", "chart"),
        MetricSpec("charts/policy_evolution_3d", "W&B 3D point cloud of (policy/kl, rewards/total/mean, step) "
                   "over the run.", "", "charts", "every chart_every logged steps, W&B only", "chart"),
    ]


CATALOGUE: tuple[MetricSpec, ...] = tuple(
    _reward_entries() + _outcome_entries() + _rubric_entries() + _policy_entries() + _advantage_entries()
    + _length_entries() + _performance_entries() + _system_entries() + _epoch_entries() + _final_entries()
    + _extension_entries() + _media_entries()
)

# ----------------------------------------------------------------------------- lookup

_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.-]*"
_PLACEHOLDERS = {
    # `total` is the sum over functions and has entries of its own; a function may not take its name.
    "<fn>": rf"(?!total/){_NAME}",
    "<level>": _NAME,
    "<rubric>": _NAME,
    "<criterion>": _NAME,
    "<k>": r"[1-9][0-9]*",
}


def _pattern(name: str) -> re.Pattern:
    regex = re.escape(name)
    for placeholder, part in _PLACEHOLDERS.items():
        regex = regex.replace(re.escape(placeholder), part)
    return re.compile(regex + r"\Z")


@lru_cache(maxsize=1)
def _index() -> tuple[dict[str, MetricSpec], list[tuple[re.Pattern, MetricSpec]]]:
    exact = {spec.name: spec for spec in CATALOGUE if not spec.is_pattern}
    patterns = [(_pattern(spec.name), spec) for spec in CATALOGUE if spec.is_pattern]
    return exact, patterns


def find_entry(name: str) -> MetricSpec | None:
    """The catalogue entry for a concrete metric name, or None when it is not catalogued."""
    exact, patterns = _index()
    if name in exact:
        return exact[name]
    for regex, spec in patterns:
        if regex.match(name):
            return spec
    return None


def _resolves(answer: str) -> bool:
    """A seed answer names either an entry (pattern text included) or a concrete name an entry covers."""
    return any(spec.name == answer for spec in CATALOGUE) or find_entry(answer) is not None


# ----------------------------------------------------------------------------- seed mapping


@dataclass(frozen=True)
class SeedMapping:
    seed: str
    name: str
    answers: tuple[str, ...]
    note: str = ""


SEEDS = {
    "000": "000-wandb-metrics-guide.md",
    "001": "001-wandb-visualization-guide.md",
    "002": "002-tinyzero-verl-metrics.md",
    "003": "003-reward-monitoring-system.md",
    "004": "004-tensorboard-metrics.md",
}

NOT_A_METRIC_CONFIG = ("a run setting, not a metric: the resolved config is in run.json `config`, the W&B run "
                       "config and TensorBoard hparams")
STEP_AXIS = ("not a metric: every metrics.jsonl record carries `step`; it is the global step in TensorBoard and "
             "the step axis in W&B")
CRITIC_FREE = "GRPO has no critic (value network): there are no value predictions, value losses or critic updates"


def _m(seed: str, name: str, *answers: str, note: str = "") -> SeedMapping:
    return SeedMapping(seed, name, tuple(answers), note)


def _seed_000() -> list[SeedMapping]:
    s = "000"
    out = [
        _m(s, "rewards/{name}_mean", "rewards/<fn>/mean"),
        _m(s, "rewards/{name}_max", "rewards/<fn>/max"),
        _m(s, "rewards/{name}_min", "rewards/<fn>/min"),
        _m(s, "rewards/{name}_hist", "rewards/<fn>/hist"),
        _m(s, "rewards/{name}_recent_mean", "rewards/<fn>/recent_mean"),
        _m(s, "rewards/total_mean", "rewards/total/mean",
           note="the mean of the weighted total; equals the sum of the function means when every weight is 1 "
                "and no score is missing"),
        _m(s, "train/step", note=STEP_AXIS),
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
        _m(s, "rewards/*_mean", "rewards/<fn>/mean", "rewards/total/mean", note="dashboard panel over all means"),
        _m(s, "rewards/*_hist", "rewards/<fn>/hist", "rewards/total/hist", note="dashboard panel"),
        _m(s, "final/*_mean", "final/<fn>/mean", "charts/reward_breakdown",
           note="the seed's bar chart of final means is charts/reward_breakdown at the end of the run"),
        _m(s, "criteria/*/*_mean", "criteria/<rubric>/<criterion>/mean", note="dashboard panel"),
        _m(s, "system metrics (GPU/TPU utilization, memory)", "system/cpu_percent", "system/memory_percent",
           "system/accel_active_gb", "system/gpu_utilization_percent",
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


def _seed_001() -> list[SeedMapping]:
    s = "001"
    example = "a generic example key in the guide's code, not a metric of its own"
    return [
        _m(s, "train/loss", "policy/loss"),
        _m(s, "train/learning_rate", "policy/lr"),
        _m(s, "train/reward", "rewards/total/mean"),
        _m(s, "train/grad_norm", "policy/grad_norm"),
        _m(s, "step", note=STEP_AXIS),
        _m(s, "metric", note=example),
        _m(s, "custom/metric_a", note=example),
        _m(s, "custom/metric_b", note=example),
        _m(s, "custom/metric_c", note=example),
        _m(s, "table", "samples/completions", note="the guide's incrementally grown table; ours is the "
                                                   "completions table, whose rows accumulate"),
        _m(s, "rewards/mean", "rewards/total/mean"),
        _m(s, "rewards/std", "rewards/total/std"),
        _m(s, "rewards/min", "rewards/total/min"),
        _m(s, "rewards/max", "rewards/total/max"),
        _m(s, "rewards/median", "rewards/total/median"),
        _m(s, "rewards/q25", "rewards/total/q25"),
        _m(s, "rewards/q75", "rewards/total/q75"),
        _m(s, "rewards/distribution", "rewards/total/hist"),
        _m(s, "rewards/total", "rewards/total/mean"),
        _m(s, "rewards/correctness", "rewards/<fn>/mean", note="<fn> = the correctness function, e.g. answer_check"),
        _m(s, "rewards/format", "rewards/<fn>/mean", note="<fn> = a format function, e.g. format_exact"),
        _m(s, "rewards/correctness_mean", "rewards/<fn>/mean", note="<fn> = answer_check"),
        _m(s, "rewards/correctness_rate", "rewards/<fn>/positive_frac", "accuracy/train",
           note="fraction of completions with a positive score; accuracy/train counts right answers directly"),
        _m(s, "eval/{k}", "eval/accuracy"),
        _m(s, "generations", "samples/completions",
           note="columns step, prompt, reasoning, answer, ground truth, per-function rewards, total, advantage"),
        _m(s, "generation/answer_length_dist", "completions/length_hist",
           note="lengths of whole completions in tokens; the length of the extracted answer alone is not measured"),
        _m(s, "generation/length", "completions/length_mean"),
        _m(s, "generation/quality", "rewards/total/mean",
           note="the guide does not define it; the total reward is this trainer's measure of quality"),
        _m(s, "rewards/breakdown", "charts/reward_breakdown"),
        _m(s, "reward_landscape_3d", "charts/reward_landscape_3d"),
        _m(s, "policy_evolution_3d", "charts/policy_evolution_3d"),
        _m(s, "reward_components_3d", "charts/reward_breakdown", "rewards/<fn>/hist",
           note="per-component values over time are the rewards/<fn>/* series; no separate 3D chart"),
        _m(s, "reward_surface", "charts/reward_landscape_3d",
           note="the same step x example x reward data, drawn as a point cloud instead of a heatmap"),
        _m(s, "rl/kl_divergence", "policy/kl"),
        _m(s, "rl/policy_entropy", "policy/entropy"),
        _m(s, "rl/value_estimate", note=CRITIC_FREE),
        _m(s, "final_reward", "final/total/mean"),
        _m(s, "run_comparison", note="comparing runs is a command over run directories (mlx-grpo compare), "
                                     "not a metric of one run"),
    ]


def _seed_002() -> list[SeedMapping]:
    s = "002"
    out = [
        _m(s, "actor/entropy_loss", "policy/entropy"),
        _m(s, "actor/pg_loss", "policy/pg_loss"),
        _m(s, "actor/pg_clipfrac", "policy/clip_frac"),
        _m(s, "actor/ppo_kl", "policy/ppo_kl"),
        _m(s, "actor/kl_loss", "policy/kl_penalty", "policy/kl"),
        _m(s, "actor/kl_coef", "policy/kl_coef"),
        _m(s, "actor/is_ratio/mean", "policy/ratio_mean"),
        _m(s, "actor/is_ratio/std", "policy/ratio_std"),
        _m(s, "actor/is_ratio/p95", "policy/ratio_p95"),
        _m(s, "actor/is_log_ratio/mean", "policy/log_ratio_mean"),
        _m(s, "actor/is_log_ratio/std", "policy/log_ratio_std"),
        _m(s, "actor/is_clip/outside_frac", "policy/outside_frac"),
        _m(s, "actor/grad_norm", "policy/grad_norm"),
        _m(s, "actor/lr", "policy/lr"),
        _m(s, "critic/kl", "policy/kl", note="here the KL is a loss term, not reward shaping"),
        _m(s, "critic/kl_coeff", "policy/kl_coef"),
        _m(s, "critic/advantages/mean", "advantages/mean"),
        _m(s, "critic/advantages/max", "advantages/max"),
        _m(s, "critic/advantages/min", "advantages/min"),
        _m(s, "critic/vf_explained_var", note=CRITIC_FREE),
        _m(s, "response_length/mean", "completions/length_mean"),
        _m(s, "response_length/max", "completions/length_max"),
        _m(s, "response_length/min", "completions/length_min"),
        _m(s, "response_length/clip_ratio", "completions/clip_ratio"),
        _m(s, "prompt_length/mean", "prompts/length_mean"),
        _m(s, "prompt_length/max", "prompts/length_max"),
        _m(s, "prompt_length/min", "prompts/length_min"),
        _m(s, "prompt_length/clip_ratio", "prompts/clip_ratio"),
        _m(s, "tokens/prompt_total", "tokens/prompt_total"),
        _m(s, "tokens/response_total", "tokens/completion_total"),
        _m(s, "tokens/overall_total", "tokens/total"),
        _m(s, "completion/truncated_frac", "completions/clip_ratio",
           note="truncated means the budget ran out before an end-of-sequence token"),
        _m(s, "completion/finished_frac", "completions/finished_frac"),
        _m(s, "completion/truncated_correct_frac", "completions/truncated_correct_frac"),
        _m(s, "completion/finished_correct_frac", "completions/finished_correct_frac"),
        _m(s, "completion/correct_mean_length", "completions/correct_length_mean"),
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
        _m(s, "timing_s/step", "timing/step_s"),
        _m(s, "timing_s/gen", "timing/rollout_s"),
        _m(s, "timing_s/ref", "timing/ref_s"),
        _m(s, "timing_s/values", note=CRITIC_FREE),
        _m(s, "timing_s/adv", "timing/reward_s", "timing/advantage_s",
           note="rewards and advantages are timed separately here"),
        _m(s, "timing_s/update_critic", note=CRITIC_FREE),
        _m(s, "timing_s/update_actor", "timing/update_s"),
        _m(s, "timing_s/save_checkpoint", "timing/checkpoint_s"),
        _m(s, "timing_s/testing", "timing/eval_s"),
        _m(s, "timing_per_token_ms/gen", "timing/gen_ms_per_token"),
        _m(s, "timing_per_token_ms/ref", "timing/ref_ms_per_token"),
        _m(s, "timing_per_token_ms/values", note=CRITIC_FREE),
        _m(s, "timing_per_token_ms/adv", "timing/reward_ms_per_token", "timing/advantage_ms_per_token"),
        _m(s, "timing_per_token_ms/update_critic", note=CRITIC_FREE),
        _m(s, "timing_per_token_ms/update_actor", "timing/update_ms_per_token"),
        _m(s, "time/elapsed_s", "timing/elapsed_s"),
        _m(s, "train/cumulative_reward", "rewards/cumulative"),
        _m(s, "entropy_step_{step:06d}.pt (per-token entropy and varentropy dumps)",
           note="files on disk, not metrics; policy/entropy is the per-step mean"),
    ]
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


def _seed_003() -> list[SeedMapping]:
    s = "003"
    return [
        _m(s, "rewards/mean", "rewards/total/mean", note="mean of the weighted total over completions"),
        _m(s, "rewards/std", "rewards/total/std"),
        _m(s, "rewards/min", "rewards/total/min"),
        _m(s, "rewards/max", "rewards/total/max"),
        _m(s, "rewards/total", "rewards/total/mean", "rewards/cumulative",
           note="the per-completion sum over functions is the total; its batch mean is rewards/total/mean"),
        _m(s, "rewards/signal_to_noise", "rewards/signal_to_noise"),
        _m(s, "rewards/entropy", "rewards/entropy"),
        _m(s, "rewards/variance", "rewards/total/variance"),
        _m(s, "rewards/functions/{name}", "rewards/<fn>/mean"),
        _m(s, "rewards/functions/{name}_std", "rewards/<fn>/std"),
        _m(s, "contributions/{name}", "rewards/<fn>/contribution_pct"),
        _m(s, "training/kl_divergence", "policy/kl"),
        _m(s, "training/policy_entropy", "policy/entropy"),
        _m(s, "training/advantage_mean", "advantages/mean"),
        _m(s, "training/advantage_std", "advantages/std"),
    ]


def _seed_004() -> list[SeedMapping]:
    s = "004"
    pairs = {
        "Train/Loss": "policy/loss", "Train/PolicyLoss": "policy/pg_loss", "Train/KLPenalty": "policy/kl_penalty",
        "Train/AvgReward": "rewards/total/mean", "Train/RewardStd": "rewards/total/std",
        "Train/RewardMin": "rewards/total/min", "Train/RewardMax": "rewards/total/max",
        "Train/RewardVariance": "rewards/total/variance",
        "Epoch/AvgReward": "epoch/reward_mean", "Epoch/AvgLoss": "epoch/loss_mean",
        "Epoch/RewardVariance": "epoch/reward_variance", "Epoch/RewardTrend": "epoch/reward_trend",
        "Epoch/LossTrend": "epoch/loss_trend", "Epoch/APITokens": "epoch/api_tokens",
        "Epoch/NumSamples": "epoch/num_samples",
        "Performance/Generation_TokensPerSec": "throughput/gen_tokens_per_s",
        "Performance/Generation_Time": "timing/rollout_s",
        "Performance/Generation_AvgTokensPerSec": "throughput/gen_tokens_per_s_avg",
        "Performance/Generation_P99TokensPerSec": "throughput/gen_tokens_per_s_p99",
        "Performance/Backprop_TokensPerSec": "throughput/backprop_tokens_per_s",
        "Performance/Backprop_AvgTokensPerSec": "throughput/backprop_tokens_per_s_avg",
        "Performance/Backprop_P99TokensPerSec": "throughput/backprop_tokens_per_s_p99",
        "System/CPU_Percent": "system/cpu_percent", "System/Memory_Percent": "system/memory_percent",
        "System/Memory_Used_GB": "system/memory_used_gb", "System/Memory_Available_GB": "system/memory_available_gb",
        "System/Process_Memory_GB": "system/process_rss_gb", "System/GPU_Memory_Used_GB": "system/accel_active_gb",
        "System/GPU_Memory_Percent": "system/accel_memory_percent",
    }
    out = [_m(s, seed_name, answer) for seed_name, answer in pairs.items()]
    out += [
        _m(s, "System/GPU_Memory_Total_GB", "system/accel_limit_gb",
           note="the recommended working-set size, the memory MLX may use on the GPU"),
        _m(s, "System/GPU_Utilization", "system/gpu_utilization_percent",
           note="measured (ioreg), not estimated; macOS only"),
    ]
    for criterion in ("Correctness", "CodeQuality", "Efficiency", "Documentation"):
        out.append(_m(s, f"Scoring/{criterion}", "scoring/<criterion>/weight",
                      note="<criterion> = the rubric criterion's name; its score is "
                           "criteria/<rubric>/<criterion>/mean"))
    return out


SEED_MAP: tuple[SeedMapping, ...] = tuple(_seed_000() + _seed_001() + _seed_002() + _seed_003() + _seed_004())


def unresolved_answers() -> list[tuple[SeedMapping, str]]:
    """Seed answers that name nothing in the catalogue (a bug in this module; tested to be empty)."""
    return [(m, a) for m in SEED_MAP for a in m.answers if not _resolves(a)]


# ----------------------------------------------------------------------------- output


def catalogue_json() -> list[dict]:
    return [asdict(spec) for spec in CATALOGUE]


def seed_map_json() -> list[dict]:
    return [{"seed": m.seed, "document": SEEDS[m.seed], "name": m.name, "answers": list(m.answers), "note": m.note}
            for m in SEED_MAP]


def groups() -> list[str]:
    return list(dict.fromkeys(spec.group for spec in CATALOGUE))


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_markdown() -> str:
    lines = [
        "# Metric catalogue",
        "",
        "Generated by `python -m mlx_grpo.telemetry.catalogue --write METRICS.md` from",
        "`mlx_grpo/telemetry/catalogue.py`; do not edit by hand. `mlx-grpo metrics` prints the same catalogue.",
        "",
        "One namespace, lowercase and slash-grouped, identical in `metrics.jsonl`, TensorBoard and W&B.",
        "Placeholders: `<fn>` a reward function (never `total`), `<level>` a difficulty label, `<rubric>` /",
        "`<criterion>` a rubric and its criterion, `<k>` a positive integer. A metric that cannot be measured",
        "on a machine or in a run is left out of the record, never filled with a made-up value; null means",
        "there was something to measure but no finite value came out (NaN, infinite, nothing scored).",
        "",
        "Kinds: scalar (metrics.jsonl, TensorBoard, W&B), histogram (TensorBoard and W&B), summary",
        "(final_metrics.json and sink summaries), table / chart / text (TensorBoard or W&B media).",
        "",
    ]
    for group in groups():
        lines += [f"## {group}", "", "| name | unit | kind | when | description |", "|---|---|---|---|---|"]
        for spec in CATALOGUE:
            if spec.group == group:
                lines.append(f"| `{spec.name}` | {_cell(spec.unit)} | {spec.kind} | {_cell(spec.when)} | "
                             f"{_cell(spec.description)} |")
        lines.append("")
    lines += [
        "# Seed mapping",
        "",
        "Every metric named in the requirement documents (`seeds/`), and the canonical metric that answers",
        "it, or why none can.",
        "",
    ]
    for seed, document in SEEDS.items():
        lines += [f"## {seed}: {document}", "", "| seed metric | canonical | note |", "|---|---|---|"]
        for m in SEED_MAP:
            if m.seed == seed:
                answers = ", ".join(f"`{a}`" for a in m.answers) or "none"
                lines.append(f"| `{_cell(m.name)}` | {answers} | {_cell(m.note)} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the metric catalogue as markdown.")
    parser.add_argument("--write", metavar="PATH", help="file to write (default: print to stdout)")
    args = parser.parse_args(argv)
    text = render_markdown()
    if args.write:
        Path(args.write).write_text(text, encoding="utf-8")
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
