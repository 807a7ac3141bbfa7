"""Reading other tools' config keys as ours (TRL, mlx-lm), by the table in alias_table.py.

`translate(mapping, source)` rewrites a mapping into our names, printing at most one note line (what was read as
what) and one warning line (what was ignored); a key that cannot be read is refused with the reason. Imports no mlx.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from ..common.errors import UserError
from ..telemetry.reward_names import translate_reward
from .alias_table import ALIASES, NO_EQUIVALENT, NO_EQUIVALENT_TOOL, TRANSLATED, _harmless, _ignored, unknown_key_hint


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
    for step in (_reward_weights, _report_to, _batch, _run_directory, _precision, _lr_schedule, _fine_tune_type,
                 _value_forms, _log_distributions):
        step(out, source, said)
    said.print(source)
    return out


def _reward_weights(out: dict, source: str, said: _Said) -> None:
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


def _report_to(out: dict, source: str, said: _Said) -> None:
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


def _run_directory(out: dict, source: str, said: _Said) -> None:
    for theirs in ("output_dir", "adapter_path"):
        if theirs in out:
            parent, name = _run_dir_parts(out.pop(theirs), theirs, source)
            out["monitoring_dir"], out["run_name"] = parent, name
            said.note(TRANSLATED[theirs].tool, f"{theirs} as the run directory (monitoring_dir: {parent}, "
                                               f"run_name: {name})")


def _precision(out: dict, source: str, said: _Said) -> None:
    for theirs in ("bf16", "fp16"):
        if theirs in out:
            value = out.pop(theirs)
            if not isinstance(value, bool):
                raise UserError(f"{source}: key '{theirs}' is {value!r}; expected true/false")
            if value:  # mixed precision keeps float32 master weights: our auto does what suits the device
                said.note("TRL", f"{theirs}: true as dtype: auto (mixed precision over float32 weights)")
            else:
                said.ignore("TRL", f"{theirs}: false")


def _lr_schedule(out: dict, source: str, said: _Said) -> None:
    if "lr_scheduler_type" in out:
        kind = out.pop("lr_scheduler_type")
        if kind not in LR_SCHEDULES:
            raise UserError(f"{source}: key 'lr_scheduler_type' (TRL) is {kind!r}; expected one of "
                            f"{', '.join(LR_SCHEDULES)} (read as lr_schedule: cosine or constant)")
        if "lr_schedule" in out:
            raise UserError(f"{source}: both 'lr_scheduler_type' (TRL) and 'lr_schedule' are set; keep one")
        out["lr_schedule"] = LR_SCHEDULES[kind]
        said.note("TRL", f"lr_scheduler_type as lr_schedule: {LR_SCHEDULES[kind]}")


def _fine_tune_type(out: dict, source: str, said: _Said) -> None:
    for theirs in ("fine_tune_type", "train_type"):
        if theirs in out:
            kind = out.pop(theirs)
            if kind not in ("lora", "dora", "full"):
                raise UserError(f"{source}: key '{theirs}' is {kind!r}; expected lora, dora or full")
            out["use_lora"], out["use_dora"] = kind != "full", kind == "dora"
            said.note(TRANSLATED[theirs].tool, f"{theirs}: {kind} as use_lora: {str(kind != 'full').lower()}, "
                                               f"use_dora: {str(kind == 'dora').lower()}")


def _value_forms(out: dict, source: str, said: _Said) -> None:
    """Keys of ours that TRL writes in another form: scale_rewards as true/false, a hub dataset's subset apart."""
    if isinstance(out.get("scale_rewards"), bool):
        out["scale_rewards"] = "group" if out["scale_rewards"] else "none"
        said.note("TRL", f"scale_rewards as {out['scale_rewards']}")
    if "dataset_config" in out:
        subset = out.pop("dataset_config")
        if not isinstance(out.get("dataset"), str) or not isinstance(subset, str):
            raise UserError(f"{source}: key 'dataset_config' (TRL) needs dataset_name, a hub dataset")
        out["dataset"] = f"{out['dataset']}:{subset}"
        said.note("TRL", f"dataset_config as dataset: {out['dataset']}")


def _log_distributions(out: dict, source: str, said: _Said) -> None:
    if "log_distributions" in out:
        # Histograms cost little and are always on here, so `false` leaves histogram_every as it is.
        value = out.pop("log_distributions")
        if value is True or (isinstance(value, int) and not isinstance(value, bool)):
            if "histogram_every" in out:
                raise UserError(f"{source}: both 'log_distributions' and 'histogram_every' are set; keep one")
            out["histogram_every"] = 1 if value is True else value
            said.note("monitoring API", f"log_distributions as histogram_every: {out['histogram_every']}")
        elif value not in (False, None):
            raise UserError(f"{source}: key 'log_distributions' is {value!r}; expected true, false or a number "
                            "of steps")
