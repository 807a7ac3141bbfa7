"""Other tools' names for our config keys (TRL, mlx-lm), as YAML keys and as command-line flags.

One table, kept apart from the key definitions in config.py: `ALIASES` renames a key, `TRANSLATED`
names keys whose value needs converting (TRL's `report_to`, `per_device_train_batch_size`, ...), and
`NO_EQUIVALENT` explains the common names that have no counterpart here, so that they get a true
sentence instead of a spelling guess, and `IGNORED` lists the keys of those tools that change nothing in a run
here (hub, logging and launcher settings). `translate(mapping, source)` rewrites a mapping into our names,
printing at most one note line (what was read as what) and one warning line (what was ignored). The table is printed by `mlx-grpo train --help` and in README.md.
Imports no mlx.
"""

from __future__ import annotations

import difflib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from ..common.errors import UserError
from ..telemetry.reward_names import translate_reward


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
    "per_device_eval_batch_size": "evaluation batches itself; eval_size sets how many held-out prompts",
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
    rows += [(name, NO_EQUIVALENT_TOOL.get(name, "TRL"), "no equivalent: " + why) for name, why in NO_EQUIVALENT.items()]
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


@dataclass
class _Said:
    """What reading one mapping says: what was read as what (one note line) and what was ignored (one
    warning line), so that a copied config prints two lines at most, not one per key."""

    notes: dict[str, list[str]] = field(default_factory=dict)  # tool -> ["theirs -> ours", ...]
    ignored: dict[str, list[str]] = field(default_factory=dict)  # tool -> [key, ...]

    def note(self, tool: str, text: str) -> None:
        self.notes.setdefault(tool, []).append(text)

    def ignore(self, tool: str, key: str) -> None:
        self.ignored.setdefault(tool, []).append(key)

    def print(self, source: str) -> None:
        if self.notes:
            said = "; ".join(f"({tool}) {', '.join(items)}" for tool, items in self.notes.items())
            print(f"mlx-grpo: note: {source}: read as ours: {said}", file=sys.stderr)
        if self.ignored:
            said = "; ".join(f"{', '.join(keys)} ({tool})" for tool, keys in self.ignored.items())
            print(f"mlx-grpo: warning: {source}: ignored, as they change nothing here: {said} "
                  "(mlx-grpo train --help lists other tools' names)", file=sys.stderr)


def _run_dir_parts(value: object, key: str, source: str) -> tuple[str, str]:
    if not isinstance(value, str) or not value.strip("/"):
        raise UserError(f"{source}: key '{key}' is {value!r}; expected a directory path")
    path = Path(value.rstrip("/")).expanduser()
    return str(path.parent), path.name


# The keys each translated name sets: giving both in one mapping is refused, as for the plain renames, since the
# translation would silently drop the key written out (`report_to: [wandb]` over `wandb: false`).
TRANSLATED_SETS: dict[str, tuple[str, ...]] = {
    "report_to": ("tensorboard", "wandb", "trackio"),
    "per_device_train_batch_size": ("batch_size",),
    "gradient_accumulation_steps": ("batch_size",),
    "output_dir": ("monitoring_dir", "adapter_path"),
    "adapter_path": ("monitoring_dir", "run_name"),
    "bf16": ("dtype",),
    "fp16": ("dtype",),
    "fine_tune_type": ("use_lora", "use_dora"),
    "train_type": ("use_lora", "use_dora", "fine_tune_type"),
    "lora_parameters": ("lora_rank", "lora_alpha", "lora_dropout", "lora_keys"),
    "optimizer_config": ("weight_decay",),
    "max_steps": ("num_steps", "iters"),
}


def _unreadable_keys(out: dict, source: str, known: Iterable[str] | None, said: _Said) -> list[str]:
    """Every key that cannot be read, one line each; keys that change nothing here are dropped from `out`
    and named in the warning line instead."""
    problems = []
    for theirs in list(out):
        tool = _ignored(str(theirs))
        if tool is not None:
            said.ignore(tool, str(theirs))
            del out[theirs]
    for theirs in [k for k in out if k in NO_EQUIVALENT]:
        tool = NO_EQUIVALENT_TOOL.get(theirs, "TRL")
        if _harmless(theirs, out[theirs], out):
            said.ignore(tool, theirs)
            del out[theirs]
        else:
            problems.append(f"key '{theirs}' ({tool}) is {out[theirs]!r} and has no equivalent: "
                            f"{NO_EQUIVALENT[theirs]}")
    if known is not None:
        names = list(known)
        problems += [f"unknown key '{k}'{unknown_key_hint(str(k), names)}" for k in out
                     if str(k).split(".")[0] not in names and k not in ALIASES and k not in TRANSLATED
                     and k not in NO_EQUIVALENT]
    return problems


def _refuse_clashes(out: dict, source: str) -> None:
    for theirs, alias in ALIASES.items():
        if theirs in out and alias.ours in out:
            raise UserError(f"{source}: both '{theirs}' ({alias.tool}) and '{alias.ours}' are set; keep one")
    for theirs, ours in TRANSLATED_SETS.items():
        given = [k for k in ours if k in out]
        if theirs in out and given:
            raise UserError(f"{source}: both '{theirs}' ({TRANSLATED[theirs].tool}) and '{given[0]}' are set; "
                            f"'{theirs}' sets {', '.join(ours)}: keep one")
    rewards = out.get("rewards", out.get("reward_funcs"))
    if "reward_weights" in out and isinstance(rewards, list) and any(isinstance(r, dict) and "weight" in r
                                                                      for r in rewards):
        raise UserError(f"{source}: both 'reward_weights' (TRL) and weights in 'rewards' are set; keep one")


def _translate_rewards(out: dict, said: _Said) -> None:
    """TRL's and mlx-lm-lora's reward spellings in `rewards` (their built-in names, `module.function`, a
    comma-separated string) as ours."""
    if isinstance(out.get("rewards"), str) and "," in out["rewards"]:  # mlx-lm-lora: "a,b"
        out["rewards"] = [name.strip() for name in out["rewards"].split(",") if name.strip()]
    if isinstance(out.get("reward_weights"), str):  # mlx-lm-lora writes them as a string: "[1.0, 0.5]"
        try:
            out["reward_weights"] = [float(w) for w in out["reward_weights"].strip("[] ").split(",")]
        except ValueError:
            pass  # refused below with the value
    functions_file = out.pop("reward_functions_file", None)  # mlx-lm-lora: the file that defines the names
    if not isinstance(out.get("rewards"), list):
        return
    translated = []
    for item in out["rewards"]:
        name = item.get("name") if isinstance(item, dict) else item
        if isinstance(name, str):
            ours, note = translate_reward(name)
            if note is None and isinstance(functions_file, str) and ":" not in name:
                ours, note = f"{functions_file}:{name}", f"'{name}' as '{functions_file}:{name}'"
            if note is not None:
                said.note("rewards", note.split(": ")[0].replace(" is read as ", " as "))  # `train --help` says how
                item = {**item, "name": ours} if isinstance(item, dict) else ours
        translated.append(item)
    out["rewards"] = translated


def _length(out: dict, said: _Said) -> None:
    """TRL's training length: `max_steps` wins when positive; `max_steps: -1` (or none) leaves it to
    `num_train_epochs` (TRL's default: 3)."""
    steps = out.get("max_steps")
    if steps == -1:
        del out["max_steps"]
        if not any(k in out for k in ("num_train_epochs", "epochs", "num_steps", "iters")):
            out["epochs"] = 3.0
            said.note("TRL", "max_steps: -1 as epochs: 3 (TRL's default num_train_epochs)")
    if "num_train_epochs" in out and any(k in out for k in ("num_steps", "max_steps", "iters")):
        del out["num_train_epochs"]
        said.ignore("TRL", "num_train_epochs (max_steps sets the length)")


def _strategies(out: dict, said: _Said) -> None:
    """TRL's eval/save/logging strategies: `no` turns the thing off, `steps` uses its *_steps key, and
    `epoch` or `best` keep our step counts."""
    for theirs, steps_key, ours, off in (("eval_strategy", "eval_steps", "eval_every", 0),
                                         ("evaluation_strategy", "eval_steps", "eval_every", 0),
                                         ("save_strategy", "save_steps", "checkpoint_every", 0),
                                         ("logging_strategy", "logging_steps", "log_every", None)):
        if theirs not in out:
            continue
        value = out.pop(theirs)
        if value not in ("no", "steps", "epoch", "best"):
            raise UserError(f"key '{theirs}' (TRL) is {value!r}; expected no, steps, epoch or best")
        if value == "no" and off is not None:
            out.pop(steps_key, None)
            if ours in out:
                raise UserError(f"both '{theirs}: no' (TRL) and '{ours}' are set; keep one")
            out[ours] = off
            said.note("TRL", f"{theirs}: no as {ours}: 0" + (" (a checkpoint at the end only)"
                                                             if ours == "checkpoint_every" else ""))
        elif value == "steps":
            said.note("TRL", f"{theirs}: steps as {ours} ({steps_key})" if steps_key in out
                      else f"{theirs}: steps as {ours}'s default")
        else:
            said.ignore("TRL", f"{theirs}: {value}")


def _mlx_lm_mappings(out: dict, source: str, said: _Said) -> None:
    """mlx-lm's nested keys: `lora_parameters`, an `lr_schedule` mapping and `optimizer_config`."""
    lora = out.pop("lora_parameters", None)
    if lora is not None:
        if not isinstance(lora, dict) or not set(lora) <= {"rank", "scale", "dropout", "keys"}:
            raise UserError(f"{source}: key 'lora_parameters' (mlx-lm) is {lora!r}; expected a mapping of rank, "
                            "scale, dropout and keys")
        rank = lora.get("rank", 8)  # mlx-lm's default rank
        out["lora_rank"] = rank
        if "scale" in lora:
            if not isinstance(lora["scale"], (int, float)) or not isinstance(rank, int):
                raise UserError(f"{source}: key 'lora_parameters.scale' is {lora['scale']!r}; expected a number")
            out["lora_alpha"] = float(lora["scale"]) * rank  # ours scales by lora_alpha / lora_rank
        if "dropout" in lora:
            out["lora_dropout"] = lora["dropout"]
        if "keys" in lora:
            out["lora_keys"] = lora["keys"]
        said.note("mlx-lm", "lora_parameters as " + ", ".join(f"{k}: {out[k]}" for k in
                                                              ("lora_rank", "lora_alpha", "lora_dropout", "lora_keys")
                                                              if k in out))
    schedule = out.get("lr_schedule")
    if isinstance(schedule, dict):
        del out["lr_schedule"]
        name = schedule.get("name")
        if name != "cosine_decay":
            raise UserError(f"{source}: key 'lr_schedule' (mlx-lm) has name {name!r}; only cosine_decay has an "
                            "equivalent here (lr_schedule: cosine, or lr_schedule: constant)")
        out["lr_schedule"] = "cosine"
        read = ["lr_schedule: cosine"]
        warmup = schedule.get("warmup", 0)
        steps = next((out[k] for k in ("iters", "num_steps", "max_steps") if isinstance(out.get(k), int)), 200)
        if not isinstance(warmup, int) or warmup < 0:
            raise UserError(f"{source}: key 'lr_schedule.warmup' is {warmup!r}; expected a number of steps")
        if "warmup_fraction" not in out and "warmup_ratio" not in out:
            out["warmup_fraction"] = min(warmup / max(steps, 1), 0.99)
            read.append(f"warmup_fraction: {out['warmup_fraction']:g} ({warmup} of {steps} steps)")
        arguments = schedule.get("arguments")
        if isinstance(arguments, list) and arguments and "learning_rate" not in out and "lr" not in out:
            out["learning_rate"] = arguments[0]
            read.append(f"learning_rate: {arguments[0]}")
        said.note("mlx-lm", "lr_schedule mapping as " + ", ".join(read))
    options = out.pop("optimizer_config", None)
    if options is not None:
        if not isinstance(options, dict):
            raise UserError(f"{source}: key 'optimizer_config' (mlx-lm) is {options!r}; expected a mapping")
        for name, settings in options.items():
            for setting, value in (settings or {}).items() if isinstance(settings, dict) else ():
                if setting == "weight_decay" and str(name).lower() in ("adam", "adamw"):
                    out["weight_decay"] = value
                    said.note("mlx-lm", f"optimizer_config.{name}.weight_decay as weight_decay: {value}")
                else:
                    said.ignore("mlx-lm", f"optimizer_config.{name}.{setting}")


def _batch(out: dict, source: str, said: _Said) -> None:
    """TRL counts completions per device and step, times gradient_accumulation_steps; ours counts prompts."""
    accumulation = out.pop("gradient_accumulation_steps", 1)
    if "per_device_train_batch_size" not in out:
        if accumulation != 1:
            raise UserError(f"{source}: key 'gradient_accumulation_steps' (TRL) multiplies "
                            "per_device_train_batch_size, which is not set: set batch_size (prompts per step)")
        return
    per_device = out.pop("per_device_train_batch_size")
    group = out.get("num_generations", 8)
    if not isinstance(accumulation, int) or accumulation < 1:
        raise UserError(f"{source}: key 'gradient_accumulation_steps' is {accumulation!r}; expected a positive "
                        "integer")
    completions = per_device * accumulation if isinstance(per_device, int) else per_device
    if not isinstance(completions, int) or not isinstance(group, int) or completions % group:
        raise UserError(f"{source}: key 'per_device_train_batch_size' ({per_device!r} completions"
                        + (f" x {accumulation} accumulation steps" if accumulation != 1 else "")
                        + f") must be a multiple of num_generations ({group!r})")
    out["batch_size"] = completions // group
    times = f" x {accumulation}" if accumulation != 1 else ""
    said.note("TRL", f"per_device_train_batch_size{' and gradient_accumulation_steps' if times else ''} as "
                     f"batch_size: {completions // group} ({per_device}{times} completions / {group} per prompt)")


LR_SCHEDULES = {"cosine": "cosine", "cosine_with_min_lr": "cosine", "constant": "constant",
                "constant_with_warmup": "constant"}


def translate(mapping: dict, source: str, known: Iterable[str] | None = None) -> dict:
    """`mapping` with other tools' key names turned into ours, said on one note line and one warning line on
    stderr. Every key that cannot be read is listed in one error: those with no equivalent, and, when `known`
    (our top-level key names) is given, unknown ones; keys that change nothing here are dropped with the
    warning. A translated name that would set a key the mapping also gives is refused, naming both."""
    out, said = dict(mapping), _Said()
    if "output_dir" in out and "run_name" in out:  # TRL's run_name names the run in its trackers
        out["wandb_run_name"] = out.pop("run_name")
        said.note("TRL", "run_name as wandb_run_name (output_dir names the run directory)")
    _length(out, said)
    problems = _unreadable_keys(out, source, known, said)
    if len(problems) == 1:
        raise UserError(f"{source}: {problems[0]}")
    if problems:
        raise UserError(f"{source}: {len(problems)} keys cannot be read here:\n  " + "\n  ".join(problems))
    _refuse_clashes(out, source)
    try:
        _strategies(out, said)
    except UserError as err:
        raise UserError(f"{source}: {err}") from None
    for theirs, alias in ALIASES.items():
        if theirs in out:
            out[alias.ours] = out.pop(theirs)
            said.note(alias.tool, f"{theirs} as {alias.ours}")
    _mlx_lm_mappings(out, source, said)
    _translate_rewards(out, said)
    if "reward_weights" in out:
        weights = out.pop("reward_weights")
        rewards = out.get("rewards")
        if not isinstance(weights, list) or not isinstance(rewards, list) or len(weights) != len(rewards):
            raise UserError(f"{source}: key 'reward_weights' needs one weight per reward function "
                            f"(reward_funcs / rewards), got {weights!r}")
        out["rewards"] = [{"name": name if isinstance(name, str) else name.get("name"), "weight": weight}
                          for name, weight in zip(rewards, weights)]
        said.note("TRL", "reward_weights as the weights of rewards")
    if "max_steps" in out:
        out["num_steps"] = out.pop("max_steps")
        said.note("TRL", "max_steps as num_steps")
    if "report_to" in out:
        targets = out.pop("report_to")
        targets = [targets] if isinstance(targets, str) else targets
        if not isinstance(targets, list) or not set(targets) <= {"tensorboard", "wandb", "trackio", "all", "none"}:
            raise UserError(f"{source}: key 'report_to' is {targets!r}; expected tensorboard, wandb, trackio, all "
                            "or none (the run directory is always written)")
        for sink in ("tensorboard", "wandb", "trackio"):
            out[sink] = bool({sink, "all"} & set(targets))
        said.note("TRL", "report_to as " + ", ".join(f"{sink}: {str(out[sink]).lower()}"
                                                       for sink in ("tensorboard", "wandb", "trackio")))
    _batch(out, source, said)
    for theirs in ("output_dir", "adapter_path"):
        if theirs in out:
            parent, name = _run_dir_parts(out.pop(theirs), theirs, source)
            out["monitoring_dir"], out["run_name"] = parent, name
            said.note(TRANSLATED[theirs].tool, f"{theirs} as the run directory (monitoring_dir: {parent}, "
                                               f"run_name: {name})")
    for theirs in ("bf16", "fp16"):
        if theirs in out:
            value = out.pop(theirs)
            if not isinstance(value, bool):
                raise UserError(f"{source}: key '{theirs}' is {value!r}; expected true/false")
            if value:  # mixed precision keeps float32 master weights: our auto does what suits the device
                said.note("TRL", f"{theirs}: true as dtype: auto (mixed precision over float32 weights)")
            else:
                said.ignore("TRL", f"{theirs}: false")
    if "lr_scheduler_type" in out:
        kind = out.pop("lr_scheduler_type")
        if kind not in LR_SCHEDULES:
            raise UserError(f"{source}: key 'lr_scheduler_type' (TRL) is {kind!r}; expected one of "
                            f"{', '.join(LR_SCHEDULES)} (read as lr_schedule: cosine or constant)")
        if "lr_schedule" in out:
            raise UserError(f"{source}: both 'lr_scheduler_type' (TRL) and 'lr_schedule' are set; keep one")
        out["lr_schedule"] = LR_SCHEDULES[kind]
        said.note("TRL", f"lr_scheduler_type as lr_schedule: {LR_SCHEDULES[kind]}")
    for theirs in ("fine_tune_type", "train_type"):
        if theirs in out:
            kind = out.pop(theirs)
            if kind not in ("lora", "dora", "full"):
                raise UserError(f"{source}: key '{theirs}' is {kind!r}; expected lora, dora or full")
            out["use_lora"], out["use_dora"] = kind != "full", kind == "dora"
            said.note(TRANSLATED[theirs].tool, f"{theirs}: {kind} as use_lora: {str(kind != 'full').lower()}, "
                                               f"use_dora: {str(kind == 'dora').lower()}")
    if isinstance(out.get("scale_rewards"), bool):
        out["scale_rewards"] = "group" if out["scale_rewards"] else "none"
        said.note("TRL", f"scale_rewards as {out['scale_rewards']}")
    if "dataset_config" in out:
        subset = out.pop("dataset_config")
        if not isinstance(out.get("dataset"), str) or not isinstance(subset, str):
            raise UserError(f"{source}: key 'dataset_config' (TRL) needs dataset_name, a hub dataset")
        out["dataset"] = f"{out['dataset']}:{subset}"
        said.note("TRL", f"dataset_config as dataset: {out['dataset']}")
    if "log_distributions" in out:
        # Histograms cost little and are always on here, so `false` leaves histogram_every as it is.
        value = out.pop("log_distributions")
        if value is True or (isinstance(value, int) and not isinstance(value, bool)):
            if "histogram_every" in out:
                raise UserError(f"{source}: both 'log_distributions' and 'histogram_every' are set; keep one")
            out["histogram_every"] = 1 if value is True else value
            said.note("monitoring API", f"log_distributions as histogram_every: {out['histogram_every']}")
        elif value not in (False, None):
            raise UserError(f"{source}: key 'log_distributions' is {value!r}; expected true, false or a number of steps")
    said.print(source)
    return out
