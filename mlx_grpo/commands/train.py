"""`mlx-grpo train`: run GRPO from a YAML config, with any key overridable by a flag."""

from __future__ import annotations

import argparse
import types
import typing

from ..config.alias_table import ALIASES, TRANSLATED, help_text
from ..config.train_config import CHOICES, TrainConfig, key_help, top_level_fields
from ..config.typed_yaml import parse_override

USES_MLX = True


def _flag_kind(tp: typing.Any) -> str:
    # unwrap Optional[X] / X | None only: list[X]'s own argument is its item type, not an alternative
    union = typing.get_origin(tp) in (typing.Union, types.UnionType)
    base = next(a for a in typing.get_args(tp) if a is not type(None)) if union else tp
    if base is bool:
        return "bool"
    if typing.get_origin(base) is list:
        return "list"
    return "scalar"


# Kinds of the translated names' flags (the plain renames take their key's kind).
TRANSLATED_KINDS = {"report_to": "list", "reward_weights": "list", "per_device_train_batch_size": "scalar",
                    "output_dir": "text", "adapter_path": "text", "bf16": "bool", "fine_tune_type": "text",
                    "fp16": "bool", "max_steps": "scalar", "gradient_accumulation_steps": "scalar",
                    "lr_scheduler_type": "text", "eval_strategy": "text", "evaluation_strategy": "text",
                    "save_strategy": "text", "logging_strategy": "text", "dataset_config": "text",
                    "train_type": "text"}


def _alias_kinds() -> dict[str, str]:
    fields = top_level_fields()
    kinds = {name: _flag_kind(fields[alias.ours]) for name, alias in ALIASES.items()}
    kinds = {name: "text" if kind == "scalar" and fields[ALIASES[name].ours] is str else kind
             for name, kind in kinds.items()}
    # log_distributions has its own flag (--log-distributions takes an optional N), added in add_arguments.
    return {**kinds, **{name: TRANSLATED_KINDS[name] for name in TRANSLATED if name in TRANSLATED_KINDS}}


# What a string key's value is, shown as its flag's metavar.
TEXT_METAVARS = {"model_id": "MODEL", "dataset": "DATASET", "eval_dataset": "DATASET", "rubric_file": "FILE",
                 "alerts_file": "FILE", "monitoring_dir": "DIR", "tensorboard_dir": "DIR", "correctness": "CHECK",
                 "rewards": "REWARD", "lora_keys": "MODULE", "wandb_tags": "TAG", "micro_batch_size": "N|auto",
                 "output_dir": "DIR", "adapter_path": "DIR", "report_to": "SINK", "reward_weights": "W",
                 "per_device_train_batch_size": "N", "notify": "CHANNEL"}


def _metavar(name: str, tp: typing.Any) -> str:
    """N, FLOAT, {a,b} or what the text names (MODEL, FILE, ...), so `--help` says what a flag takes."""
    if name in CHOICES:
        return "{" + ",".join(CHOICES[name]) + "}"
    if name in TEXT_METAVARS:
        return TEXT_METAVARS[name]
    args = [a for a in (typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,))
            if a is not type(None)]
    return {int: "N", float: "FLOAT"}.get(args[0] if args else tp, "TEXT")


def _default_text(value: typing.Any) -> str:
    """A key's default as `--help` shows it: as it would be written in the YAML file."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list):
        return " ".join(getattr(v, "name", str(v)) for v in value) or "none"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _add_flag(parser: typing.Any, name: str, kind: str, text: str | None, tp: typing.Any = str) -> None:
    flag = "--" + name.replace("_", "-")
    if text not in (None, argparse.SUPPRESS):
        default = getattr(TrainConfig(), name, None)
        if default is not None:
            text = f"{text} (default: {_default_text(default)})"
        text = text.replace("%", "%%")  # argparse %-formats help
    if kind == "bool":
        parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                            help=text)
    elif kind == "list":
        parser.add_argument(flag, dest=name, nargs="*", default=argparse.SUPPRESS, metavar=_metavar(name, tp),
                            help=text)
    else:
        # Read as YAML so types are checked by the config loader, not argparse.
        parser.add_argument(flag, dest=name, default=argparse.SUPPRESS, metavar=_metavar(name, tp), help=text)


# The flags are generated from the config dataclass here rather than by tyro, jsonargparse or TRL's
# HfArgumentParser: those parse the command line well, but not our YAML (checked key by key with one line
# naming the file and key, TRL/mlx-lm names read with a note, paths resolved per source), so a second
# parser would have to agree with config.py on every key. argparse with allow_abbrev=False (cli.py) and
# the dataclass's own types give the same flags without a dependency.
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter  # keeps the alias table's lines
    parser.usage = "mlx-grpo train [CONFIG] [--resume RUN_DIR] [--KEY VALUE ...] [--set KEY=VALUE ...]"
    parser.epilog = help_text()
    parser.add_argument("config", nargs="?", metavar="CONFIG",
                        help="YAML run config (default: the built-in default run)")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last checkpoint")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override any config key, nested ones too (e.g. --set adaptive_window.enable=true)")
    parser.add_argument("--alerts", dest="alerts_file", default=argparse.SUPPRESS, metavar="FILE",
                        help="YAML file of alert rules (added to the built-in ones)")
    parser.add_argument("--no-alerts", dest="enable_alerts", action="store_false", default=argparse.SUPPRESS,
                        help="turn the built-in alert rules off")
    parser.add_argument("--log-distributions", dest="histogram_every", nargs="?", const=1, type=int,
                        default=argparse.SUPPRESS, metavar="N",
                        help="alias of --histogram-every (the name other GRPO monitoring tools use): reward and "
                             "advantage histograms every N logged steps, every step without N")
    group = parser.add_argument_group("config keys (each overrides the YAML file)")
    helps = key_help()
    for name, tp in top_level_fields().items():
        # --alerts and --no-alerts above say the same as --alerts-file and --no-enable-alerts: listed once
        shown = argparse.SUPPRESS if name in ("alerts_file", "enable_alerts") else helps.get(name) or None
        _add_flag(group, name, _flag_kind(tp), shown, tp)
    for name, kind in _alias_kinds().items():  # listed once, in the table below the flags (the epilog)
        _add_flag(parser, name, kind, argparse.SUPPRESS)


def collect_overrides(args: argparse.Namespace) -> dict[str, typing.Any]:
    overrides: dict[str, typing.Any] = {}
    for name, tp in top_level_fields().items():
        if name in vars(args):
            value = getattr(args, name)
            # A string key keeps its text as typed ("--run-name 007" stays "007"); a key that is a string or
            # something else (micro_batch_size: auto or a number) is read as YAML.
            other_types = [a for a in (typing.get_args(tp) or (tp,)) if a not in (str, type(None))]
            if isinstance(value, str) and (tp is not str and other_types):
                value = parse_override(f"{name}={value}")[1]
            elif isinstance(value, list):
                value = [parse_override(f"x={v}")[1] for v in value]
            overrides[name] = value
    for name, kind in _alias_kinds().items():  # other tools' names: aliases.translate reads them
        if name in vars(args):
            value = getattr(args, name)
            if kind == "list":
                value = [parse_override(f"x={v}")[1] for v in value]
            elif kind == "scalar":
                value = parse_override(f"{name}={value}")[1]
            overrides[name] = value
    for text in args.overrides:
        key, value = parse_override(text)
        overrides[key] = value
    return overrides


def train_from_cli(config_path: str | None, overrides: dict, resume: str | None = None) -> int:
    """Train from a config file (or the built-in default) or resume a run; returns the exit code."""
    from pathlib import Path

    from ..common.errors import UserError
    from ..config.train_config import load_config
    from ..run.loop import EXIT_GUARD_STOP, train
    from ..run.resume import config_for_resume
    from ..run.signals import EXIT_INTERRUPTED

    if resume is not None:
        if config_path is not None:
            raise UserError(f"--resume {resume}: the run keeps its own config; give changes as flags "
                            f"(e.g. --num-steps 500), not a config file ({config_path})")
        config, base_dir = config_for_resume(Path(resume), overrides)
        result = train(config, base_dir, resume_dir=Path(resume))
    else:
        config = load_config(config_path, overrides)
        base_dir = Path(config_path).resolve().parent if config_path else Path.cwd()
        result = train(config, base_dir)
    if "stopped_by_alert" in result:
        return EXIT_GUARD_STOP
    return {"finished": 0, "interrupted": EXIT_INTERRUPTED}.get(result.get("status"), 1)


def run(args: argparse.Namespace) -> int:
    return train_from_cli(args.config, collect_overrides(args), resume=args.resume)
