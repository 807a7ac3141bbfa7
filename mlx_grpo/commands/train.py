"""`mlx-grpo train`: run GRPO from a YAML config, with any key overridable by a flag."""

from __future__ import annotations

import argparse
import types
import typing

from ..config import key_help, parse_override, top_level_fields

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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", help="YAML run config (default: the built-in default run)")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last checkpoint")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override any config key, nested ones too (e.g. --set adaptive_window.enable=true)")
    parser.add_argument("--alerts", dest="alerts_file", default=argparse.SUPPRESS, metavar="FILE",
                        help="YAML file of alert rules (added to the built-in ones)")
    parser.add_argument("--no-alerts", dest="enable_alerts", action="store_false", default=argparse.SUPPRESS,
                        help="turn the built-in alert rules off")
    parser.add_argument("--log-distributions", dest="histogram_every", nargs="?", const=1, type=int,
                        default=argparse.SUPPRESS, metavar="N",
                        help="alias of --histogram-every (the reward monitoring system's flag): reward and advantage "
                             "histograms every N logged steps, every step without N")
    group = parser.add_argument_group("config keys (each overrides the YAML file)")
    helps = key_help()
    for name, tp in top_level_fields().items():
        flag = "--" + name.replace("_", "-")
        kind = _flag_kind(tp)
        text = helps.get(name, "").replace("%", "%%") or None  # argparse formats help with %
        if kind == "bool":
            group.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                               help=text)
        elif kind == "list":
            group.add_argument(flag, dest=name, nargs="*", default=argparse.SUPPRESS, metavar="VALUE", help=text)
        else:
            # Read as YAML so types are checked by the config loader, not argparse.
            group.add_argument(flag, dest=name, default=argparse.SUPPRESS, metavar="VALUE", help=text)


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
    for text in args.overrides:
        key, value = parse_override(text)
        overrides[key] = value
    return overrides


def train_from_cli(config_path: str | None, overrides: dict, resume: str | None = None) -> int:
    """Train from a config file (or the built-in default) or resume a run; returns the exit code."""
    from pathlib import Path

    from ..config import load_config
    from ..errors import UserError
    from ..resume import config_for_resume
    from ..signals import EXIT_INTERRUPTED
    from ..run import EXIT_GUARD_STOP, train

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
