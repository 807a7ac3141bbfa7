"""Other tools' names for our config keys (TRL, mlx-lm), as YAML keys and as command-line flags.

One table, kept apart from the key definitions in config.py: `ALIASES` renames a key, `TRANSLATED`
names keys whose value needs converting (TRL's `report_to`, `per_device_train_batch_size`, ...), and
`NO_EQUIVALENT` explains the common names that have no counterpart here, so that they get a true
sentence instead of a spelling guess. `translate(mapping, source)` rewrites a mapping into our names,
printing one note per name. The table is printed by `mlx-grpo train --help` and in README.md.
Imports no mlx.
"""

from __future__ import annotations

import difflib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from .common.errors import UserError
from .telemetry.reward_names import translate_reward


@dataclass(frozen=True)
class Alias:
    tool: str  # "TRL", "mlx-lm" or "TRL, mlx-lm"
    ours: str  # what it sets, as shown in the table


# Plain renames: the value is used as it is.
ALIASES: dict[str, Alias] = {
    "max_completion_length": Alias("TRL", "max_generation_steps"),
    "max_steps": Alias("TRL", "num_steps"),
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
    "lr_scheduler_type": Alias("TRL", "lr_schedule"),
    "lr": Alias("short form", "learning_rate"),
    "gradient_checkpointing": Alias("TRL", "grad_checkpoint"),
    "model": Alias("mlx-lm", "model_id"),
    "model_name_or_path": Alias("TRL", "model_id"),
    "data": Alias("mlx-lm", "dataset"),
    "dataset_name": Alias("TRL", "dataset"),
    "num_layers": Alias("mlx-lm", "lora_layers"),
    "logging_dir": Alias("TRL", "tensorboard_dir"),
}

# Names whose value is converted; the text says how (the conversion is in `translate`).
TRANSLATED: dict[str, Alias] = {
    "report_to": Alias("TRL", "tensorboard, wandb, trackio (each true when listed; all / none)"),
    "reward_weights": Alias("TRL", "the weights of rewards"),
    "per_device_train_batch_size": Alias("TRL", "batch_size = completions / num_generations"),
    "output_dir": Alias("TRL", "the run directory: monitoring_dir (its parent) and run_name"),
    "adapter_path": Alias("mlx-lm", "the run directory: monitoring_dir (its parent) and run_name"),
    "bf16": Alias("TRL", "dtype: bfloat16 (true) or auto (false)"),
    "fine_tune_type": Alias("mlx-lm", "lora, dora or full: use_lora and use_dora"),
    "log_distributions": Alias("monitoring API", "histogram_every (true: every logged step; a number: "
                                                         "every that many; false: unchanged)"),
}

# Common names with no counterpart: what to do instead.
NO_EQUIVALENT: dict[str, str] = {
    "num_train_epochs": "training length is counted in steps: set num_steps (each step draws batch_size "
                        "prompts, so one pass over N prompts is N / batch_size steps)",
    "gradient_accumulation_steps": "there is no accumulation across steps; micro_batch_size splits each step's "
                                   "batch into passes for memory, with the same gradient",
    "per_device_eval_batch_size": "evaluation batches itself; eval_size sets how many held-out prompts",
    "use_vllm": "rollouts run in MLX on this machine; there is no vLLM server",
    "resume_from_checkpoint": "use `mlx-grpo train --resume RUN_DIR`",
    "fp16": "set dtype: float16 (with use_lora: true)",
    "max_seq_length": "a GRPO sequence is a prompt cut to max_prompt_length tokens plus a completion of at most "
                      "max_generation_steps tokens: set those two",
    "val_batches": "eval_size sets how many held-out prompts each evaluation scores",
    "mask_prompt": "GRPO never trains on prompt tokens; only completions carry a loss",
}
NO_EQUIVALENT_TOOL = {"max_seq_length": "mlx-lm", "val_batches": "mlx-lm", "mask_prompt": "mlx-lm"}  # else TRL


def _harmless(key: str, value: object, mapping: dict) -> bool:
    """A no-equivalent key whose value changes nothing here (or is overridden by a key that is set): ignored with
    a warning instead of refused, so a config copied from TRL or mlx-lm runs on its first try."""
    if key == "num_train_epochs":
        return any(k in mapping for k in ("num_steps", "max_steps", "iters"))  # TRL too: max_steps wins
    if key == "gradient_accumulation_steps":
        return value == 1
    if key in ("use_vllm", "fp16", "resume_from_checkpoint"):
        return value in (False, None)
    return key in ("per_device_eval_batch_size", "max_seq_length", "val_batches", "mask_prompt")


def all_names() -> list[str]:
    """Every alias, renamed or translated."""
    return [*ALIASES, *TRANSLATED]


def table_rows() -> list[tuple[str, str, str]]:
    """(their name, tool, what it sets here) for the docs and `train --help`, sorted by name."""
    rows = [(name, a.tool, a.ours) for name, a in {**ALIASES, **TRANSLATED}.items()]
    rows += [(name, NO_EQUIVALENT_TOOL.get(name, "TRL"), "no equivalent: " + why) for name, why in NO_EQUIVALENT.items()]
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


def _note(source: str, theirs: str, tool: str, ours: str) -> None:
    print(f"mlx-grpo: note: {source}: '{theirs}' ({tool}) is read as {ours}", file=sys.stderr)


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
    "output_dir": ("monitoring_dir", "run_name", "adapter_path"),
    "adapter_path": ("monitoring_dir", "run_name"),
    "bf16": ("dtype",),
    "fine_tune_type": ("use_lora", "use_dora"),
}


def _unreadable_keys(out: dict, source: str, known: Iterable[str] | None) -> list[str]:
    """Every key that cannot be read, one line each; harmless no-equivalent keys are dropped from `out` with a
    warning instead."""
    problems = []
    for theirs in [k for k in out if k in NO_EQUIVALENT]:
        tool = NO_EQUIVALENT_TOOL.get(theirs, "TRL")
        if _harmless(theirs, out[theirs], out):
            print(f"mlx-grpo: warning: {source}: '{theirs}' ({tool}) is ignored, it has no equivalent here: "
                  f"{NO_EQUIVALENT[theirs]}", file=sys.stderr)
            del out[theirs]
        else:
            problems.append(f"key '{theirs}' ({tool}) has no equivalent: {NO_EQUIVALENT[theirs]}")
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


def _translate_rewards(out: dict, source: str) -> None:
    """TRL's reward spellings in `rewards` (its built-in names, `module.function`) as ours, with a note each."""
    if not isinstance(out.get("rewards"), list):
        return
    translated = []
    for item in out["rewards"]:
        name = item.get("name") if isinstance(item, dict) else item
        if isinstance(name, str):
            ours, note = translate_reward(name)
            if note is not None:
                print(f"mlx-grpo: note: {source}: reward {note}", file=sys.stderr)
                item = {**item, "name": ours} if isinstance(item, dict) else ours
        translated.append(item)
    out["rewards"] = translated


def translate(mapping: dict, source: str, known: Iterable[str] | None = None) -> dict:
    """`mapping` with other tools' key names turned into ours (one note on stderr per name). Every key that
    cannot be read is listed in one error: those with no equivalent, and, when `known` (our top-level key
    names) is given, unknown ones; a no-equivalent key whose value changes nothing is dropped with a warning.
    A translated name that would set a key the mapping also gives is refused, naming both."""
    out = dict(mapping)
    problems = _unreadable_keys(out, source, known)
    if len(problems) == 1:
        raise UserError(f"{source}: {problems[0]}")
    if problems:
        raise UserError(f"{source}: {len(problems)} keys cannot be read here:\n  " + "\n  ".join(problems))
    _refuse_clashes(out, source)
    for theirs, alias in ALIASES.items():
        if theirs in out:
            out[alias.ours] = out.pop(theirs)
            _note(source, theirs, alias.tool, f"'{alias.ours}'")
    _translate_rewards(out, source)
    if "reward_weights" in out:
        weights = out.pop("reward_weights")
        rewards = out.get("rewards")
        if not isinstance(weights, list) or not isinstance(rewards, list) or len(weights) != len(rewards):
            raise UserError(f"{source}: key 'reward_weights' needs one weight per reward function "
                            f"(reward_funcs / rewards), got {weights!r}")
        out["rewards"] = [{"name": name if isinstance(name, str) else name.get("name"), "weight": weight}
                          for name, weight in zip(rewards, weights)]
        _note(source, "reward_weights", "TRL", "the weights of 'rewards'")
    if "report_to" in out:
        targets = out.pop("report_to")
        targets = [targets] if isinstance(targets, str) else targets
        if not isinstance(targets, list) or not set(targets) <= {"tensorboard", "wandb", "trackio", "all", "none"}:
            raise UserError(f"{source}: key 'report_to' is {targets!r}; expected tensorboard, wandb, trackio, all "
                            "or none (the run directory is always written)")
        for sink in ("tensorboard", "wandb", "trackio"):
            out[sink] = bool({sink, "all"} & set(targets))
        _note(source, "report_to", "TRL", "'tensorboard', 'wandb' and 'trackio'")
    if "per_device_train_batch_size" in out:
        completions = out.pop("per_device_train_batch_size")
        group = out.get("num_generations", 8)
        if not isinstance(completions, int) or not isinstance(group, int) or completions % group:
            raise UserError(f"{source}: key 'per_device_train_batch_size' ({completions!r} completions) must be a "
                            f"multiple of num_generations ({group!r})")
        out["batch_size"] = completions // group
        _note(source, "per_device_train_batch_size", "TRL", f"'batch_size: {completions // group}' (prompts per "
                                                            f"step: {completions} completions / {group} per prompt)")
    for theirs in ("output_dir", "adapter_path"):
        if theirs in out:
            parent, name = _run_dir_parts(out.pop(theirs), theirs, source)
            out["monitoring_dir"], out["run_name"] = parent, name
            _note(source, theirs, TRANSLATED[theirs].tool, f"monitoring_dir: {parent}, run_name: {name} (the run "
                                                           "directory)")
    if "bf16" in out:
        value = out.pop("bf16")
        if not isinstance(value, bool):
            raise UserError(f"{source}: key 'bf16' is {value!r}; expected true/false")
        out["dtype"] = "bfloat16" if value else "auto"
        _note(source, "bf16", "TRL", f"'dtype: {out['dtype']}'")
    if "fine_tune_type" in out:
        kind = out.pop("fine_tune_type")
        if kind not in ("lora", "dora", "full"):
            raise UserError(f"{source}: key 'fine_tune_type' is {kind!r}; expected lora, dora or full")
        out["use_lora"], out["use_dora"] = kind != "full", kind == "dora"
        _note(source, "fine_tune_type", "mlx-lm", f"'use_lora: {str(kind != 'full').lower()}', "
                                                  f"'use_dora: {str(kind == 'dora').lower()}'")
    if "log_distributions" in out:
        # Histograms cost little and are always on here, so `false` leaves histogram_every as it is.
        value = out.pop("log_distributions")
        if value is True or (isinstance(value, int) and not isinstance(value, bool)):
            if "histogram_every" in out:
                raise UserError(f"{source}: both 'log_distributions' and 'histogram_every' are set; keep one")
            out["histogram_every"] = 1 if value is True else value
            _note(source, "log_distributions", "monitoring API", f"'histogram_every: {out['histogram_every']}'")
        elif value not in (False, None):
            raise UserError(f"{source}: key 'log_distributions' is {value!r}; expected true, false or a number of steps")
    return out
