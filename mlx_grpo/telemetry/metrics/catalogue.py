"""The metric catalogue: every name the trainer and its sinks emit, with its meaning, unit and group.

One canonical namespace (lowercase, slash-grouped) is shared by `metrics.jsonl`, TensorBoard and
W&B. Names that vary per run carry a placeholder, filled with the user's own names as written:

- `<fn>` a reward function name (never `total`, which is the weighted sum of all functions)
- `<level>` a difficulty label from the data
- `<rubric>`, `<criterion>` a rubric and one of its criteria
- `<k>` a positive integer (an exit position of S-GRPO)
- `<tool>` a tool's name (`malformed` counts calls that could not be read)

Public API:

- `MetricSpec`: one catalogue entry (name or pattern, description, unit, group, when, kind).
- `CATALOGUE`: tuple of every `MetricSpec`.
- `find_entry(name) -> MetricSpec | None`: the entry a concrete name belongs to (exact names win
  over patterns); `None` means the name is not catalogued.
- `render_markdown() -> list[str]`: the catalogue's part of METRICS.md (other tools' names follow it).
- `catalogue_json() -> list[dict]`: plain data for `mlx-grpo metrics --json`.

Other tools' names for the same quantities (TRL, verl, Tunix, the TensorBoard guide) are in
`other_names.py`.

`mlx-grpo metrics --write METRICS.md` regenerates the repository's METRICS.md.
Kinds: `scalar` (a number per record), `histogram` (an array per record, TensorBoard and W&B only),
`summary` (end of run: final_metrics.json and each sink's summary), `chart` / `table` / `text`
(rich W&B or TensorBoard media, not in metrics.jsonl).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from functools import lru_cache

from .names import (
    ACCEL_ACTIVE_GB,
    ACCEL_HELD_PERCENT,
    ACCEL_LIMIT_GB,
    ACCEL_MEMORY_PERCENT,
    ACCEL_PEAK_GB,
    ACCURACY_TRAIN,
    ACCURACY_TRAIN_STDERR,
    CHECKPOINT_SECONDS,
    CLIP_FRAC,
    CPU_PERCENT,
    CPU_SPEED_LIMIT,
    ELAPSED_SECONDS,
    ENTROPY,
    EVAL_ACCURACY,
    EVAL_NUM_SAMPLES,
    EVAL_SECONDS,
    FINISHED_CORRECT_FRAC,
    FINISHED_FRAC,
    GEN_MS_PER_TOKEN,
    GRAD_NORM,
    KL,
    LEARNING_RATE,
    LENGTH_MEAN,
    LOSS,
    LOW_POWER_MODE,
    MEMORY_PERCENT,
    MEMORY_PRESSURE_LEVEL,
    MEMORY_USED_GB,
    MFU,
    ON_BATTERY,
    PROCESS_RSS_GB,
    PROMPT_LENGTH_MEAN,
    PROMPT_TRUNCATED_FRAC,
    REDRAWN_PROMPTS,
    REPETITION_RATE,
    REWARD_BIMODALITY,
    REWARD_MEAN_STDERR,
    REWARD_RECENT_MEAN,
    SAMPLES_TABLE,
    SAMPLING_LOGP_DIFF_MAX,
    SAMPLING_LOGP_DIFF_MEAN,
    SIGNAL_TO_NOISE,
    SOLVED_GROUP_FRAC,
    STEP_SECONDS,
    STEP_TOKENS_PER_S,
    SWAP_USED_GB,
    THERMAL_WARNING_LEVEL,
    TOKENS_CUMULATIVE,
    TOKENS_TOTAL,
    TOOL_CALL_FREQUENCY,
    TOOL_CALLED_FRAC,
    TOOL_FAILURE_FREQUENCY,
    TRUNCATED_CORRECT_FRAC,
    TRUNCATED_FRAC,
    ZERO_STD_GROUP_FRAC,
)

# ----------------------------------------------------------------------------- entries


@dataclass(frozen=True)
class MetricSpec:
    """One catalogue entry: a name (or a pattern with placeholders), its meaning, unit, group, when and kind."""

    name: str
    description: str
    unit: str
    group: str
    when: str
    kind: str = "scalar"

    @property
    def is_pattern(self) -> bool:
        """True when the name holds a placeholder such as `<fn>`."""
        return "<" in self.name


# Phrases reused by many entries, so the catalogue reads consistently.
EVERY_STEP = "every logged step"
HIST = "every hist_every logged steps, once at least 10 values have accumulated"
EPOCH = "end of each pass over the training data"
FINAL = "end of run (final_metrics.json and each sink's summary)"
RUBRIC = "every logged step, when a rubric is configured"
ADAPTIVE = "every logged step, when adaptive window scheduling is enabled"
SGRPO = "every logged step, when S-GRPO is enabled"
EVAL = "before the first update (step 0), every eval_every steps and at the end"
CRITERIA = "first logged step and every criteria_every steps, when a rubric is configured"
JUDGE = "every logged step, when a rubric has a judge criterion"
DYNAMIC = "every logged step, when dynamic_sampling is on"
MULTITURN = "every logged step, when tools or an environment answer the model's turns"

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
        MetricSpec(REWARD_MEAN_STDERR, "Standard error of rewards/total/mean over the step's prompts: the "
                   "standard deviation of the groups' mean rewards over the square root of their number. How far "
                   "the batch mean moves between steps from which prompts were drawn alone; the collapse rule "
                   "needs a fall larger than that. Left out with a single group.", "reward", "rewards", EVERY_STEP),
        MetricSpec(REWARD_BIMODALITY, "Sarle's bimodality coefficient of the step's total rewards over its "
                   "completions: ~1/3 for one bell-shaped cluster, above 5/9 (a uniform spread) for two clusters, "
                   "~1 for a reward with two values (right or wrong). Left out without spread.", "coefficient",
                   "rewards", EVERY_STEP),
        MetricSpec("rewards/total/variance", "Batch variance of the weighted total reward (std squared).",
                   "reward^2", "rewards", EVERY_STEP),
        MetricSpec(REWARD_RECENT_MEAN, "Mean of rewards/total/mean over the last 10 logged steps "
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
        MetricSpec(SIGNAL_TO_NOISE, "|rewards/total/mean| / rewards/total/std. Left out when the std "
                   "is 0.", "ratio", "rewards", EVERY_STEP),
        MetricSpec("rewards/entropy", "Shannon entropy (bits) of the batch's total rewards binned into 10 "
                   "equal-width bins spanning the batch's min..max; 0 when all totals are equal, at most "
                   "log2(10) = 3.32. Higher means rewards spread over more distinct values.", "bits", "rewards",
                   EVERY_STEP),
        MetricSpec(ZERO_STD_GROUP_FRAC, "Fraction of prompt groups whose G completions all got the "
                   "same total reward: their advantages are 0 and they teach nothing.", "fraction", "rewards",
                   EVERY_STEP),
        MetricSpec(REDRAWN_PROMPTS, "Prompts drawn again this step by dynamic sampling to replace groups "
                   "whose completions all got the same reward (0: the first draw was all informative).",
                   "prompts", "rewards", DYNAMIC),
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
    return _loss_entries(p) + _sampling_mismatch_entries(p) + _ratio_entries(p)


def _loss_entries(p: str) -> list[MetricSpec]:
    """The loss, the KL term, entropy and clipping."""
    return [
        MetricSpec(LOSS, "The loss that was minimised: policy-gradient loss plus the KL penalty; with "
                   "num_iterations > 1, the mean over the step's update passes, like every policy/ statistic "
                   "(with the token-level loss types bnpo and dapo it is policy/pg_loss + policy/kl_penalty).", "",
                   p, EVERY_STEP),
        MetricSpec("policy/pg_loss", "Clipped policy-gradient (surrogate) loss alone.", "", p, EVERY_STEP),
        MetricSpec(KL, "Mean per-token KL divergence of the policy from the reference model (k3 "
                   "estimator), over completion tokens. Left out when beta is 0 (no reference model is kept).",
                   "nats", p, EVERY_STEP),
        MetricSpec("policy/kl_penalty", "The KL term as added to the loss: beta * policy/kl.", "", p, EVERY_STEP),
        MetricSpec("policy/kl_coef", "beta, the coefficient of the KL term.", "", p, EVERY_STEP),
        MetricSpec(ENTROPY, "Mean per-token entropy of the policy's next-token distribution over "
                   "completion tokens, on a sample of positions: every k-th completion position, k = "
                   "ceil(max_generation_steps / 32), so at most 32 per completion (every position up to 32-token "
                   "completions). Monitoring only: over a 152k vocabulary at every position it cost as much as "
                   "the update's log-probs (issue 28). entropy_logging's dumps keep every position.", "nats", p,
                   EVERY_STEP),
        MetricSpec("policy/clip_frac_low", "Fraction of completion tokens where the lower clip bound was active "
                   "(ratio < 1 - epsilon with a negative advantage).", "fraction", p, EVERY_STEP),
        MetricSpec("policy/clip_frac_high", "Fraction of completion tokens where the upper clip bound was active "
                   "(ratio > 1 + epsilon_high with a positive advantage).", "fraction", p, EVERY_STEP),
        MetricSpec(CLIP_FRAC, "Fraction of completion tokens where clipping was active on either side "
                   "(clip_frac_low + clip_frac_high).", "fraction", p, EVERY_STEP),
    ]


def _sampling_mismatch_entries(p: str) -> list[MetricSpec]:
    """The sampler's log-probs against the update's first pass over the same tokens."""
    return [
        MetricSpec(SAMPLING_LOGP_DIFF_MEAN, "Mean over the completion tokens of |log-prob the update's first pass "
                   "gives a sampled token - log-prob the sampler gave it|: the same weights scored the same tokens "
                   "twice, so this is the numerical mismatch of the two code paths (incremental vs batched "
                   "attention, precision). Left out under S-GRPO (it trains on exits it did not sample).", "nats", p,
                   EVERY_STEP),
        MetricSpec(SAMPLING_LOGP_DIFF_MAX, "The largest such difference of any token of the step.", "nats", p,
                   EVERY_STEP),
        MetricSpec("sampling/importance_ratio/min", "Smallest exp(update's first-pass log-prob - sampler's log-prob) "
                   "of any completion token: 1 when the two agree.", "ratio", p, EVERY_STEP),
        MetricSpec("sampling/importance_ratio/mean", "Mean of that ratio over the completion tokens.", "ratio", p,
                   EVERY_STEP),
        MetricSpec("sampling/importance_ratio/max", "Largest of that ratio over the completion tokens.", "ratio", p,
                   EVERY_STEP),
    ]


def _ratio_entries(p: str) -> list[MetricSpec]:
    """The importance ratio and the update's size: per-completion clipping, ratios, gradient, learning rate."""
    return [
        MetricSpec("policy/clip_frac_low_min", "The lowest share of low-clipped tokens of any one completion of "
                   "the batch (completions with no token to train left out), over the update's passes after the "
                   "first (the first never clips).", "fraction", p, EVERY_STEP),
        MetricSpec("policy/clip_frac_high_max", "The highest share of high-clipped tokens of any one completion "
                   "of the batch, over every pass of the update: one completion pushed far past the trust region "
                   "shows here before the mean moves.", "fraction", p, EVERY_STEP),
        MetricSpec("policy/outside_frac", "Fraction of completion tokens whose importance ratio lies outside "
                   "[1 - epsilon, 1 + epsilon_high], whether or not clipping changed the loss.", "fraction", p,
                   EVERY_STEP),
        MetricSpec("policy/ppo_kl", "Approximate KL(pi_old || pi_new) of this update: mean of "
                   "log pi_old - log pi_new over completion tokens. 0 on the first pass over a rollout.",
                   "nats", p, EVERY_STEP),
        MetricSpec("policy/ratio/mean", "Mean importance ratio pi_new / pi_old over completion tokens (1 when "
                   "the update is on-policy).", "ratio", p, EVERY_STEP),
        MetricSpec("policy/ratio/std", "Standard deviation of the importance ratio.", "ratio", p, EVERY_STEP),
        MetricSpec("policy/ratio/p95", "95th percentile of the importance ratio.", "ratio", p, EVERY_STEP),
        MetricSpec("policy/log_ratio/mean", "Mean log importance ratio.", "nats", p, EVERY_STEP),
        MetricSpec("policy/log_ratio/std", "Standard deviation of the log importance ratio.", "nats", p,
                   EVERY_STEP),
        MetricSpec(GRAD_NORM, "Global L2 norm of the gradient before clipping; with num_iterations > 1, "
                   "the mean over the step's update passes.", "", p, EVERY_STEP),
        MetricSpec(LEARNING_RATE, "Learning rate used by this step's update.", "", p, EVERY_STEP),
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
        MetricSpec(LENGTH_MEAN, "Mean completion length.", "tokens", c, EVERY_STEP),
        MetricSpec("completions/length/min", "Shortest completion.", "tokens", c, EVERY_STEP),
        MetricSpec("completions/length/max", "Longest completion.", "tokens", c, EVERY_STEP),
        MetricSpec(TRUNCATED_FRAC, "Fraction of completions truncated: they reached the generation "
                   "budget without an end-of-sequence token.", "fraction", c, EVERY_STEP),
        MetricSpec(FINISHED_FRAC, "Fraction of completions that ended with an end-of-sequence "
                   "token within the budget (1 - truncated_frac).", "fraction", c, EVERY_STEP),
        MetricSpec(TRUNCATED_CORRECT_FRAC, "Among truncated completions, the fraction with the "
                   "right answer. Left out when none was truncated.", "fraction", c, EVERY_STEP),
        MetricSpec(FINISHED_CORRECT_FRAC, "Among finished completions, the fraction with the right "
                   "answer. Left out when none finished.", "fraction", c, EVERY_STEP),
        MetricSpec("completions/terminated_length/mean", "Mean length of the completions that ended by "
                   "themselves (end-of-sequence within the budget); truncated ones, whose length is the budget, "
                   "left out. Left out when none finished.", "tokens", c, EVERY_STEP),
        MetricSpec("completions/terminated_length/min", "Shortest completion that ended by itself.", "tokens", c,
                   EVERY_STEP),
        MetricSpec("completions/terminated_length/max", "Longest completion that ended by itself.", "tokens", c,
                   EVERY_STEP),
        MetricSpec(REPETITION_RATE, "Mean over the step's completions of the share of each completion's 3-word "
                   "n-grams (words and punctuation marks) that repeat one earlier in it: ~0 for ordinary text, "
                   "rising toward 1 as completions loop. Left out when no completion has 4 words.", "fraction", c,
                   EVERY_STEP),
        MetricSpec("completions/correct_length/mean", "Mean length of the completions with the right answer. "
                   "Left out when none was right.", "tokens", c, EVERY_STEP),
        MetricSpec("completions/length/hist", "Distribution of completion lengths since the previous "
                   "histogram.", "tokens", c, HIST, "histogram"),
        MetricSpec(PROMPT_LENGTH_MEAN, "Mean prompt length (after truncation).", "tokens", pr, EVERY_STEP),
        MetricSpec("prompts/length/min", "Shortest prompt.", "tokens", pr, EVERY_STEP),
        MetricSpec("prompts/length/max", "Longest prompt.", "tokens", pr, EVERY_STEP),
        MetricSpec(PROMPT_TRUNCATED_FRAC, "Fraction of prompts cut to max_prompt_length.", "fraction", pr,
                   EVERY_STEP),
        MetricSpec("tokens/prompt_total", "Prompt tokens in the batch, counted once per completion.", "tokens", t,
                   EVERY_STEP),
        MetricSpec("tokens/completion_total", "Completion tokens generated in the batch.", "tokens", t,
                   EVERY_STEP),
        MetricSpec(TOKENS_TOTAL, "tokens/prompt_total + tokens/completion_total.", "tokens", t, EVERY_STEP),
        MetricSpec(TOKENS_CUMULATIVE, "tokens/total summed over every step so far (TRL's num_tokens), kept "
                   "across a resume.", "tokens", t, EVERY_STEP),
    ]


def _outcome_entries() -> list[MetricSpec]:
    return [
        MetricSpec(ACCURACY_TRAIN, "Fraction of this step's sampled completions with the right answer (the "
                   "config's `correctness` check). Left out, with every other accuracy figure and the held-out "
                   "evaluation, when the run has no correctness check: n/a, never 0%.",
                   "fraction", "accuracy", EVERY_STEP),
        MetricSpec(ACCURACY_TRAIN_STDERR, "Standard error of accuracy/train over the step's prompts (as "
                   "rewards/total/mean_stderr): with 4 prompts a policy that answers each the same way every time "
                   "moves it by 0.25 a prompt.", "fraction", "accuracy", EVERY_STEP),
        MetricSpec(SOLVED_GROUP_FRAC, "Fraction of this step's groups whose every completion is right: prompts "
                   "the policy has solved, which give no learning signal any more. When most flat groups "
                   "(rewards/zero_std_group_frac) are solved ones, the run has learnt what these prompts teach; "
                   "the zero-gradient, flat-group and entropy alerts then report it as info, not as a fault.",
                   "fraction", "accuracy", EVERY_STEP),
        MetricSpec(EVAL_ACCURACY, "Held-out accuracy: greedy completions of the evaluation prompts with the "
                   "right answer; the first is measured before the first update (step 0).", "fraction", "eval",
                   EVAL),
        MetricSpec(EVAL_NUM_SAMPLES, "Held-out prompts evaluated (each one greedy completion).", "count", "eval",
                   EVAL),
        MetricSpec("eval/mean@<k>", "With eval_samples k: the share of right answers among k completions sampled "
                   "per held-out prompt at the run's temperature (verl's mean@N).", "fraction", "eval",
                   EVAL + ", with eval_samples"),
        MetricSpec("eval/pass@<k>", "With eval_samples k: the share of held-out prompts with at least one right "
                   "answer among their k samples (pass@k, verl's best@N for a right/wrong check).", "fraction",
                   "eval", EVAL + ", with eval_samples"),
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
                       ("backprop", "Completion tokens trained on by the policy update (the tokens the loss "
                        "covers: prompts are read but not counted; under S-GRPO the K exit sequences), times update "
                        "passes (num_iterations), per second of update")):
        out += [
            MetricSpec(f"throughput/{key}_tokens_per_s", f"{words}, this step.", "tokens/s", th, EVERY_STEP),
            MetricSpec(f"throughput/{key}_tokens_per_s/avg", f"{words}, since the start: total tokens / total "
                       "seconds (so long steps weigh more than short ones).", "tokens/s", th, EVERY_STEP),
            MetricSpec(f"throughput/{key}_tokens_per_s/p99", f"{words}: 99th percentile of the per-step values "
                       "so far.", "tokens/s", th, EVERY_STEP),
        ]
    out.append(MetricSpec(STEP_TOKENS_PER_S, "tokens/total / timing/step_s: end-to-end tokens per "
                          "second of the whole step.", "tokens/s", th, EVERY_STEP))
    out.append(MetricSpec(MFU, "Model FLOPs utilisation: the step's floating-point work counted from the model's "
                          "shape (rollout, reference and update matmuls, 2 per multiply-add; "
                          "mlx_grpo/planning/roofline.py; with "
                          "frozen_prefix_reuse the reference and update count the blocks they run, from the first "
                          "adapted one on) "
                          "per second of timing/step_s, over the fp32 matmul FLOP/s measured at the start of the run. "
                          "`mlx-grpo bench` gives it per phase.", "fraction", th, EVERY_STEP))
    phases = {
        "rollout": "generating the completions",
        "ref": "reference-model log-probs",
        "reward": "scoring completions with the reward functions",
        "advantage": "computing group advantages",
        "update": "the policy update (all passes)",
    }
    out.append(MetricSpec(STEP_SECONDS, "Wall-clock seconds of the whole step.", "s", ti, EVERY_STEP))
    for phase, words in phases.items():
        out.append(MetricSpec(f"timing/{phase}_s", f"Seconds spent on {words}.", "s", ti, EVERY_STEP))
    out += [
        MetricSpec(CHECKPOINT_SECONDS, "Seconds spent saving a checkpoint.", "s", ti,
                   "steps that save a checkpoint"),
        MetricSpec(EVAL_SECONDS, "Seconds spent on held-out evaluation.", "s", ti, "steps that evaluate"),
        MetricSpec(ELAPSED_SECONDS, "Wall-clock seconds since training started.", "s", ti, EVERY_STEP),
        MetricSpec(GEN_MS_PER_TOKEN, "timing/rollout_s in milliseconds per completion token.",
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
        MetricSpec(CPU_PERCENT, "Machine-wide CPU use over the last sampling interval (~1 s).", "%", s,
                   EVERY_STEP),
        MetricSpec(MEMORY_PERCENT, "Machine memory in use.", "%", s, EVERY_STEP),
        MetricSpec(MEMORY_USED_GB, "Machine memory in use (total - available).", "GB", s, EVERY_STEP),
        MetricSpec("system/memory_available_gb", "Machine memory available to new allocations.", "GB", s,
                   EVERY_STEP),
        MetricSpec(PROCESS_RSS_GB, "Resident set size of the training process.", "GB", s, EVERY_STEP),
        MetricSpec(ACCEL_ACTIVE_GB, "MLX memory held by live arrays (mx.get_active_memory).", "GB", s,
                   accel),
        MetricSpec(ACCEL_PEAK_GB, "Peak MLX memory since the last phase began (mx.get_peak_memory; the counter is "
                   "reset per phase, see memory/*_peak_gb).", "GB", s,
                   accel),
        MetricSpec("system/accel_cache_gb", "MLX buffer cache: freed memory kept for reuse (mx.get_cache_memory).",
                   "GB", s, accel),
        MetricSpec(ACCEL_LIMIT_GB, "The device's recommended working-set size (Metal), divided by the "
                   "number of trainers sharing the machine (a parallel sweep, mlx.launch ranks on one host); left "
                   "out where the backend reports none.", "GB", s, accel),
        MetricSpec(ACCEL_MEMORY_PERCENT, "accel_active_gb as a percentage of accel_limit_gb.", "%", s,
                   accel),
        MetricSpec(ACCEL_HELD_PERCENT, "accel_active_gb + accel_cache_gb as a percentage of accel_limit_gb: "
                   "on a Mac the cache stays wired, so it crowds the machine as active memory does.", "%", s,
                   accel),
        MetricSpec(SWAP_USED_GB, "Swap in use on this machine (psutil.swap_memory): grows when memory runs "
                   "short.", "GB", s, EVERY_STEP),
        MetricSpec(MEMORY_PRESSURE_LEVEL, "macOS's memory-pressure level (kern.memorystatus_vm_pressure_level: "
                   "1 normal, 2 warning, 4 critical), as Activity Monitor shows it.", "", s,
                   "every logged step, on macOS"),
        MetricSpec(THERMAL_WARNING_LEVEL, "macOS's thermal warning level (`pmset -g therm`; 0 when none is "
                   "recorded): above 0 the machine is throttling to cool down, and steps slow.", "", s,
                   "every logged step, on macOS (read every 30 s)"),
        MetricSpec(CPU_SPEED_LIMIT, "The CPU speed limit macOS set for heat (`pmset -g therm`'s CPU_Speed_Limit; 100: "
                   "none), on the Macs that report one.", "%", s, "every logged step, on macOS (read every 30 s)"),
        MetricSpec(ON_BATTERY, "1 when the Mac draws from its battery, 0 on AC power (`pmset -g batt`): on "
                   "battery a laptop may run slower, and a long run can drain it.", "", s,
                   "every logged step, on macOS (read every 30 s)"),
        MetricSpec(LOW_POWER_MODE, "1 when Low Power Mode is on (`pmset -g`'s lowpowermode), which caps the "
                   "chip's speed.", "", s, "every logged step, on macOS 12 and later (read every 30 s)"),
        *(MetricSpec(f"memory/{phase}_peak_gb", f"Peak MLX memory during this step's {words} (the counter is "
                     "reset before the phase): what the phase needs, KV cache and activations included.", "GB",
                     "memory", EVERY_STEP)
          for phase, words in (("rollout", "rollout"), ("ref", "reference pass"), ("update", "update"),
                               ("eval", "held-out evaluation (steps that evaluate)"))),
        MetricSpec("memory/peak_percent", "This step's highest phase peak (memory/*_peak_gb) as a percentage of "
                   "the device's recommended working set (system/accel_limit_gb): the memory-pressure alert "
                   "watches it, since memory read after the step misses the KV cache and activations.", "%",
                   "memory", "every logged step, where the device reports a working set (Metal)"),
        MetricSpec("system/gpu_utilization_percent", "GPU 'Device Utilization %' of the Apple GPU as reported by "
                   "ioreg (no sudo). Left out on machines without it.", "%", s, "every logged step, on macOS"),
    ]


def _epoch_entries() -> list[MetricSpec]:
    e = "epoch"
    return [
        MetricSpec("epoch/index", "Number of the pass over the training data that just ended (1-based).", "count",
                   e, EPOCH),
        MetricSpec("epoch/reward/mean", "Mean total reward over every completion of the epoch.", "reward", e,
                   EPOCH),
        MetricSpec("epoch/loss/mean", "Mean of policy/loss over the epoch's steps.", "", e, EPOCH),
        MetricSpec("epoch/reward/variance", "Variance of the total reward over every completion of the epoch.",
                   "reward^2", e, EPOCH),
        MetricSpec("epoch/reward/trend", "epoch/reward/mean minus the previous epoch's (positive = improving). "
                   "Left out after the first epoch.", "reward", e, EPOCH),
        MetricSpec("epoch/loss/trend", "Previous epoch's epoch/loss/mean minus this one's (positive = loss went "
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
        MetricSpec("sgrpo/zero_std_group_frac", "Fraction of serial groups (one sampled path's K exits) whose "
                   "exits all scored the same: their advantages are 0 and the update learns nothing from them "
                   "(1.0: the update did nothing).", "fraction", "sgrpo", SGRPO),
    ]
    return out


def _multiturn_entries() -> list[MetricSpec]:
    return [
        MetricSpec(TOOL_CALL_FREQUENCY, "Tool calls per trajectory, mean over the step's trajectories (TRL's "
                   "name and meaning). Falling to 0 after rising: the model stopped calling its tools.", "calls",
                   "tools", MULTITURN),
        MetricSpec(TOOL_FAILURE_FREQUENCY, "Share of the step's tool calls that failed: raised, timed out, "
                   "named no such tool, or could not be read (malformed); 0 without calls (TRL's name).",
                   "fraction", "tools", MULTITURN),
        MetricSpec(TOOL_CALLED_FRAC, "Share of trajectories that called at least one tool.", "fraction", "tools",
                   MULTITURN),
        MetricSpec("tools/<tool>/calls", "Calls of this tool in the step (`malformed`: calls that could not be "
                   "read).", "calls", "tools", MULTITURN),
        MetricSpec("tools/<tool>/failures", "Failed calls of this tool in the step.", "calls", "tools", MULTITURN),
        MetricSpec("multiturn/turns_mean", "Model turns per trajectory, mean.", "turns", "multiturn", MULTITURN),
        MetricSpec("multiturn/model_tokens_mean", "The model's own tokens per trajectory, mean: the only ones "
                   "sampled and trained.", "tokens", "multiturn", MULTITURN),
        MetricSpec("multiturn/environment_tokens_mean", "Tool-result and template tokens per trajectory, mean: "
                   "read by the model, masked out of the loss, the KL term and the entropy.", "tokens", "multiturn",
                   MULTITURN),
        MetricSpec("multiturn/environment_reward_mean", "The environment's rewards per trajectory (summed over "
                   "its turns), mean; 0 for tools.", "reward", "multiturn", MULTITURN),
        MetricSpec("multiturn/ended_frac", "Share of trajectories the environment ended (an answer without a "
                   "tool call, a game won) rather than the turn or token budget.", "fraction", "multiturn",
                   MULTITURN),
    ]


def _media_entries() -> list[MetricSpec]:
    w = "logged steps that write samples"
    charts = "every wandb_chart_every logged steps (default: about ten times per run) and the last, W&B only"
    return [
        MetricSpec(SAMPLES_TABLE, "Completions of the step: prompt, reasoning, answer, ground truth, "
                   "per-function rewards, total, advantage (W&B table whose rows accumulate over the run; "
                   "TensorBoard text as a markdown table; samples.jsonl).", "", "samples", w, "table"),
        MetricSpec("alerts", "Alert messages (TensorBoard text; W&B alerts).", "", "alerts", "when an alert fires",
                   "text"),
        MetricSpec("charts/reward_breakdown", "W&B bar chart of each reward function's mean score (unweighted) in "
                   "the batch; at the end, of the whole-run means.", "reward", "charts",
                   "every wandb_chart_every logged steps and at the end, W&B only", "chart"),
        MetricSpec("charts/reward_landscape_3d", "W&B 3D point cloud of (step, example index, total reward) over "
                   "the run, axes scaled to comparable ranges, colour from low (blue) to high (red) reward.",
                   "", "charts", charts, "chart"),
        MetricSpec("charts/reward_components_3d", "W&B 3D point cloud of (step, reward function, score) of every "
                   "completion over the run, a colour per reward function (named in the caption).", "", "charts",
                   charts, "chart"),
        MetricSpec("charts/policy_evolution_3d", "W&B 3D point cloud of (policy/kl, rewards/total/mean, step) "
                   "over the run.", "", "charts", charts, "chart"),
        MetricSpec("charts/reward_heatmap", "W&B HTML heatmap of every completion's total reward, step (columns, "
                   "the last 200) x example (rows: the step's groups by mean reward, each group's completions best "
                   "first; a group that taught nothing is one colour). Also in `report --html` and the dashboard's "
                   "Samples view, from completions/.", "reward", "charts", charts, "chart"),
        MetricSpec("charts/criteria_heatmap", "W&B HTML heatmap of each rubric criterion's mean score (rows) per "
                   "logged step (columns), the last 200 steps.", "score", "charts", f"{charts}, with a rubric",
                   "chart"),
        MetricSpec("charts/criteria_over_time", "W&B table (step, criterion, mean) the criteria heatmap is drawn "
                   "from.", "score", "charts", f"{charts}, with a rubric", "table"),
    ]


CATALOGUE: tuple[MetricSpec, ...] = tuple(
    _reward_entries() + _outcome_entries() + _rubric_entries() + _policy_entries() + _advantage_entries()
    + _length_entries() + _performance_entries() + _system_entries() + _epoch_entries() + _final_entries()
    + _extension_entries() + _multiturn_entries() + _media_entries()
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
    "<tool>": _NAME,
}


def name_pattern(name: str) -> re.Pattern:
    """The regex a catalogue name stands for, its placeholders filled (`<fn>` never matches total)."""
    regex = re.escape(name)
    for placeholder, part in _PLACEHOLDERS.items():
        regex = regex.replace(re.escape(placeholder), part)
    return re.compile(regex + r"\Z")


@lru_cache(maxsize=1)
def _index() -> tuple[dict[str, MetricSpec], list[tuple[re.Pattern, MetricSpec]]]:
    exact = {spec.name: spec for spec in CATALOGUE if not spec.is_pattern}
    patterns = [(name_pattern(spec.name), spec) for spec in CATALOGUE if spec.is_pattern]
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


# ----------------------------------------------------------------------------- output


def catalogue_json() -> list[dict]:
    """Every entry as plain data (`mlx-grpo metrics --json`)."""
    return [asdict(spec) for spec in CATALOGUE]


def groups() -> list[str]:
    """The catalogue's groups, in order of first appearance."""
    return list(dict.fromkeys(spec.group for spec in CATALOGUE))


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_markdown() -> list[str]:
    """The catalogue's part of METRICS.md, a table per group."""
    lines = [
        "# Metric catalogue",
        "",
        "Generated by `mlx-grpo metrics --write METRICS.md` from `mlx_grpo/telemetry/metrics/catalogue.py` and",
        "`other_names.py`; do not edit by hand. `mlx-grpo metrics` prints the same catalogue.",
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
        "Units: GB is 10^9 bytes in every `*_gb` metric, as in `mlx-grpo plan` and `mlx-grpo bench`",
        "(mlx_grpo/common/units.py; runs recorded before issue 28 wrote GiB, 2^30 bytes, under the same names).",
        "",
    ]
    for group in groups():
        lines += [f"## {group}", "", "| name | unit | kind | when | description |", "|---|---|---|---|---|"]
        for spec in CATALOGUE:
            if spec.group == group:
                lines.append(f"| `{spec.name}` | {_cell(spec.unit)} | {spec.kind} | {_cell(spec.when)} | "
                             f"{_cell(spec.description)} |")
        lines.append("")
    return lines
