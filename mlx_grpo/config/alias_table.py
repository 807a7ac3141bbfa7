"""Other tools' names for our config keys (TRL, mlx-lm), as a table: `ALIASES` renames a key, `TRANSLATED`
names keys whose value needs converting (TRL's `report_to`, `per_device_train_batch_size`, ...), and
`NO_EQUIVALENT` explains the common names that have no counterpart here, so that they get a true sentence
instead of a spelling guess, and `IGNORED` lists the keys of those tools that change nothing in a run here
(hub, logging and launcher settings). The table is printed by `mlx-grpo train --help` and in README.md;
aliases.py reads a mapping through it. Imports no mlx.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass


@dataclass(frozen=True)
class Alias:
    tool: str  # "TRL", "mlx-lm" or "TRL, mlx-lm"
    ours: str  # what it sets, as shown in the table


# Plain renames: the value is used as it is.
ALIASES: dict[str, Alias] = {
    "max_completion_length": Alias("TRL", "max_generation_steps"),
    "iters": Alias("mlx-lm", "num_steps"),
    "warmup_ratio": Alias("TRL", "warmup_fraction"),
    "reward_funcs": Alias("TRL", "rewards"),
    "logging_steps": Alias("TRL", "log_every"),
    "steps_per_report": Alias("mlx-lm", "log_every"),
    "save_steps": Alias("TRL", "checkpoint_every"),
    "save_every": Alias("mlx-lm", "checkpoint_every"),
    "eval_steps": Alias("TRL", "eval_every"),
    "steps_per_eval": Alias("mlx-lm", "eval_every"),
    "save_total_limit": Alias("TRL", "keep_checkpoints"),
    "lr": Alias("short form", "learning_rate"),
    "gradient_checkpointing": Alias("TRL", "grad_checkpoint"),
    "model": Alias("mlx-lm", "model_id"),
    "model_name_or_path": Alias("TRL", "model_id"),
    "data": Alias("mlx-lm", "dataset"),
    "dataset_name": Alias("TRL", "dataset"),
    "num_layers": Alias("mlx-lm", "lora_layers"),
    "logging_dir": Alias("TRL", "tensorboard_dir"),
    "num_train_epochs": Alias("TRL", "epochs"),
    "dataset_prompt_column": Alias("TRL", "prompt_field"),
    "use_peft": Alias("TRL", "use_lora"),
    "lora_r": Alias("TRL", "lora_rank"),
    "group_size": Alias("mlx-lm-lora", "num_generations"),
    "grpo_loss_type": Alias("mlx-lm-lora", "loss_type"),
    "reward_functions": Alias("mlx-lm-lora", "rewards"),
}

# Names whose value is converted; the text says how (the conversion is in `translate`).
TRANSLATED: dict[str, Alias] = {
    "report_to": Alias("TRL", "tensorboard, wandb, trackio (each true when listed; all / none)"),
    "reward_weights": Alias("TRL", "the weights of rewards"),
    "per_device_train_batch_size": Alias("TRL", "batch_size = completions / num_generations"),
    "output_dir": Alias("TRL", "the run directory: monitoring_dir (its parent) and run_name"),
    "adapter_path": Alias("mlx-lm", "the run directory: monitoring_dir (its parent) and run_name"),
    "bf16": Alias("TRL", "dtype: auto (TRL's bf16 is mixed precision over float32 weights)"),
    "fp16": Alias("TRL", "dtype: auto (TRL's fp16 is mixed precision over float32 weights)"),
    "lr_scheduler_type": Alias("TRL", "lr_schedule: cosine (cosine, cosine_with_min_lr) or constant (constant, "
                                      "constant_with_warmup)"),
    "lora_parameters": Alias("mlx-lm", "{rank, scale, dropout, keys}: lora_rank, lora_alpha = scale x rank, "
                                       "lora_dropout, lora_keys"),
    "optimizer_config": Alias("mlx-lm", "its weight_decay (the rest is ignored)"),
    "gradient_accumulation_steps": Alias("TRL", "batch_size = per_device_train_batch_size x "
                                                "gradient_accumulation_steps / num_generations"),
    "eval_strategy": Alias("TRL", "no: eval_every: 0; steps: eval_steps"),
    "evaluation_strategy": Alias("TRL", "no: eval_every: 0; steps: eval_steps"),
    "save_strategy": Alias("TRL", "no: checkpoint_every: 0 (the end only); steps: save_steps"),
    "logging_strategy": Alias("TRL", "steps: logging_steps (no, epoch: ignored)"),
    "max_steps": Alias("TRL", "num_steps (-1: num_train_epochs decides, as in TRL)"),
    "dataset_config": Alias("TRL", "the hub dataset's subset: dataset: NAME:CONFIG"),
    "train_type": Alias("mlx-lm-lora", "lora, dora or full: use_lora and use_dora"),

    "fine_tune_type": Alias("mlx-lm", "lora, dora or full: use_lora and use_dora"),
    "log_distributions": Alias("monitoring API", "histogram_every (true: every logged step; a number: "
                                                         "every that many; false: unchanged)"),
}

# Our own keys in another tool's form of value, read as ours (the conversion is in `translate`).
VALUE_FORMS: dict[str, Alias] = {
    "lr_schedule": Alias("mlx-lm", "a mapping {name: cosine_decay, warmup: N, arguments: [lr, ...]}: lr_schedule: "
                                   "cosine, warmup_fraction = N / num_steps, learning_rate"),
    "scale_rewards": Alias("TRL", "true: group, false: none"),
}

# Common names with no counterpart: what to do instead.
NO_EQUIVALENT: dict[str, str] = {
    "per_device_eval_batch_size": "evaluation batches itself (eval_batch_size: auto, the memory plan's choice); "
                                  "eval_size sets how many held-out prompts",
    "use_vllm": "rollouts run in MLX on this machine; there is no vLLM server",
    "resume_from_checkpoint": "use `mlx-grpo train --resume RUN_DIR`",
    "resume_adapter_file": "use `mlx-grpo train --resume RUN_DIR`",
    "optimizer": "the optimiser is AdamW (adam and adamw are read as it)",
    "optim": "the optimiser is AdamW (TRL's adamw_torch, adamw_torch_fused and the like are read as it)",
    "train": "mlx-grpo train always trains (train: true)",
    "train_mode": "mlx-grpo trains GRPO (train_mode: grpo)",
    "grad_accumulation_steps": "there is no accumulation across steps; micro_batch_size splits each step's "
                               "batch into passes for memory, with the same gradient",
    "repetition_penalty": "sampling has no repetition penalty here (1.0)",
    "max_seq_length": "a GRPO sequence is a prompt cut to max_prompt_length tokens plus a completion of at most "
                      "max_generation_steps tokens: set those two",
    "val_batches": "eval_size sets how many held-out prompts each evaluation scores",
    "mask_prompt": "GRPO never trains on prompt tokens; only completions carry a loss",
}
NO_EQUIVALENT_TOOL = {"max_seq_length": "mlx-lm", "val_batches": "mlx-lm", "mask_prompt": "mlx-lm",
                      "resume_adapter_file": "mlx-lm", "optimizer": "mlx-lm", "train": "mlx-lm",
                      "train_mode": "mlx-lm-lora", "grad_accumulation_steps": "mlx-lm"}  # else TRL

# Keys that change nothing in a run here (the hub, logging verbosity, hardware and launcher settings, what
# mlx-lm's test pass reads): dropped, all named on one warning line. Any `vllm_*` key is one of them too.
IGNORED: dict[str, str] = {
    **dict.fromkeys(["model_revision", "torch_dtype", "attn_implementation", "trust_remote_code", "do_train",
                     "do_eval", "do_predict", "overwrite_output_dir", "push_to_hub", "hub_model_id", "hub_strategy",
                     "hub_private_repo", "hub_revision", "log_level", "log_level_replica", "logging_first_step",
                     "log_on_each_node", "disable_tqdm", "gradient_checkpointing_kwargs", "dataloader_num_workers",
                     "dataloader_pin_memory", "ddp_find_unused_parameters", "ddp_timeout", "tf32", "use_liger_kernel",
                     "log_completions", "num_completions_to_print", "wandb_log_unique_prompts", "save_only_model",
                     "save_safetensors", "remove_unused_columns", "ds3_gather_for_generation", "local_rank",
                     "dataset_train_split", "dataset_test_split", "lr_scheduler_kwargs", "chat_template", "callbacks",
                     "benchmarks", "lora_target_modules", "dataset_num_proc"], "TRL"),
    **dict.fromkeys(["test", "test_batches", "steps_per_generation"], "mlx-lm"),
}


def _ignored(key: str) -> str | None:
    """The tool whose key this is when it changes nothing here, else None."""
    return "TRL" if key.startswith("vllm_") else IGNORED.get(key)


def _harmless(key: str, value: object, mapping: dict) -> bool:
    """A no-equivalent key whose value changes nothing here (or is overridden by a key that is set): ignored with
    a warning instead of refused, so a config copied from TRL or mlx-lm runs on its first try."""
    if key in ("resume_from_checkpoint", "resume_adapter_file"):
        return value in (False, None)
    if key == "optimizer":
        return isinstance(value, str) and value.lower() in ("adam", "adamw")
    if key == "optim":
        return isinstance(value, str) and value.lower().startswith("adamw")
    if key == "train":
        return value is True
    if key == "train_mode":
        return value == "grpo"
    if key == "grad_accumulation_steps":
        return value == 1
    if key == "repetition_penalty":
        return value == 1 or value == 1.0
    return key in ("per_device_eval_batch_size", "max_seq_length", "val_batches", "mask_prompt", "use_vllm")


def all_names() -> list[str]:
    """Every alias, renamed or translated."""
    return [*ALIASES, *TRANSLATED]


def table_rows() -> list[tuple[str, str, str]]:
    """(their name, tool, what it sets here) for the docs and `train --help`, sorted by name."""
    rows = [(name, a.tool, a.ours) for name, a in {**ALIASES, **TRANSLATED, **VALUE_FORMS}.items()]
    rows += [(name, NO_EQUIVALENT_TOOL.get(name, "TRL"), "no equivalent: " + why)
             for name, why in NO_EQUIVALENT.items()]
    rows += [(name, tool, "ignored (changes nothing here)") for name, tool in IGNORED.items()]
    rows.append(("vllm_*", "TRL", "ignored (rollouts run in MLX here)"))
    return sorted(rows)


def markdown_table() -> str:
    lines = ["| their name (YAML key, or `--flag-form`) | tool | read here as |", "|---|---|---|"]
    lines += [f"| `{name}` | {tool} | {ours} |" for name, tool, ours in table_rows()]
    return "\n".join(lines)


def help_text() -> str:
    width = max(len(name) for name, _, _ in table_rows())
    lines = ["other tools' names (YAML keys, and flags with dashes), each read as ours with a note:"]
    lines += [f"  {name.ljust(width)}  {tool}: {ours}" for name, tool, ours in table_rows()]
    return "\n".join(lines)


def unknown_key_hint(key: str, names) -> str:
    """' (did you mean ...?)' for an unknown key: the closest real key, or alias at the top level; or ''.
    The cut-off is strict: a wrong guess (num_train_epochs -> num_iterations) misleads more than none."""
    names = list(names)
    top_level = "num_steps" in names
    candidates = names + (all_names() if top_level else [])
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.75)
    if not close:
        return ""
    alias = {**ALIASES, **TRANSLATED}.get(close[0])
    if alias is not None and close[0] not in names:
        return f" (did you mean '{close[0]}', {alias.tool}'s name for {alias.ours}?)"
    return f" (did you mean '{close[0]}'?)"
