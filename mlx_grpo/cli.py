"""The `mlx-grpo` command: one entry point, one module per subcommand.

Each subcommand module has `add_arguments(parser)` and `run(args) -> int`, and sets
`USES_MLX = True` when it computes with MLX (those get OpenBLAS preloaded on Linux).
Heavy imports live in `run()`, so `mlx-grpo watch` never loads mlx.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import sys

from .common.errors import UserError
from .common.terminal import open_standard_streams, terminal_safe
from .config.alias_table import NO_EQUIVALENT
from .config.name_clash import clash_message, clashing_packages
from .planning.blas import reexec_with_openblas

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("mlx_grpo.commands.train", "train a model with GRPO"),
    "watch": ("mlx_grpo.commands.watch", "live dashboard of one or more run directories (terminal or --web)"),
    "report": ("mlx_grpo.commands.report", "reward report of a run: quality score, reward functions, hacking check"),
    "replay": ("mlx_grpo.commands.replay", "re-score a run's kept completions under edited rewards: what would change"),
    "metrics": ("mlx_grpo.commands.metrics", "print the metric catalogue, and other tools' names for each metric"),
    "bench": ("mlx_grpo.commands.bench", "measure tokens/s of rollout, update and whole step against baselines"),
    "plan": ("mlx_grpo.commands.plan", "predict each phase's peak memory for a config, and the settings that fit"),
    "doctor": ("mlx_grpo.commands.doctor", "check backend, device, BLAS, dtype and memory, and say what to fix"),
    "selftest": ("mlx_grpo.commands.selftest",
                 "prove the product on this machine in a few minutes: one report to send back"),
    "sweep": ("mlx_grpo.commands.sweep", "grid or random search over config keys: one run per trial, resumable"),
    "compare": ("mlx_grpo.commands.compare", "table of several runs: config differences and final metrics"),
    "export": ("mlx_grpo.commands.export", "write a run's checkpoint as a Hugging Face model directory for mlx-lm"),
    "eval": ("mlx_grpo.commands.eval",
             "held-out accuracy of a run's checkpoint or a model (greedy, the run's rewards)"),
    "mcp": ("mlx_grpo.commands.mcp",
            "MCP server on stdio for coding agents: read runs; with --allow-control, steer them"),
}


def build_parser() -> argparse.ArgumentParser:
    # allow_abbrev=False: a prefix is never read as a longer flag (`--lr` must not become `--lr-schedule`)
    parser = argparse.ArgumentParser(prog="mlx-grpo", description="GRPO on MLX with local-first monitoring",
                                     allow_abbrev=False)
    parser.add_argument("--debug", action="store_true", help="show tracebacks for user errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text, allow_abbrev=False)
        sub_parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                                help="show tracebacks for user errors")
        sub_parser.set_defaults(_module=module_name)
        # Argument definitions are cheap to import; heavy imports live in run().
        importlib.import_module(module_name).add_arguments(sub_parser)
    parser.set_defaults(_subparsers=sub.choices)
    return parser


def _unknown_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace, extras: list[str]) -> int:
    """One line for arguments the command does not take, with the closest real flag (or alias) if any."""
    command = args.command
    options = [o for action in args._subparsers[command]._actions for o in action.option_strings]
    first = extras[0].split("=", 1)[0]
    close = difflib.get_close_matches(first, options, n=1, cutoff=0.75) if first.startswith("--") else []
    hint = f" (did you mean {close[0]}?)" if close else ""
    theirs = first.lstrip("-").replace("-", "_")
    if command == "train" and theirs in NO_EQUIVALENT:
        hint = f": it has no equivalent here: {NO_EQUIVALENT[theirs]}"
    print(f"usage: mlx-grpo {command} --help\nmlx-grpo {command}: error: unrecognized argument"
          f"{'s' if len(extras) > 1 else ''}: {' '.join(extras)}{hint}", file=sys.stderr)
    return 2


def _dashed_flags(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """`--learning_rate 1e-5` read as `--learning-rate 1e-5`, as TRL's HfArgumentParser reads both spellings;
    only a flag the command has with dashes is rewritten, and nothing after a bare `--`."""
    commands = parser.get_default("_subparsers")
    at = next((i for i, arg in enumerate(argv) if arg in commands), None)
    if at is None:
        return argv
    options = {o for action in commands[argv[at]]._actions for o in action.option_strings}
    out = argv[:at + 1]
    for i, arg in enumerate(argv[at + 1:], at + 1):
        if arg == "--":
            return out + argv[i:]
        name, eq, value = arg.partition("=")
        dashed = name.replace("_", "-")
        out.append(dashed + eq + value if name.startswith("--") and dashed in options else arg)
    return out


def main(argv: list[str] | None = None) -> int:
    open_standard_streams()
    parser = build_parser()
    real_command_line = argv is None
    argv = _dashed_flags(parser, sys.argv[1:] if argv is None else list(argv))
    args, extras = parser.parse_known_args(argv)
    if extras and args.command is not None:
        return _unknown_arguments(parser, args, extras)
    if extras:
        parser.parse_args(argv)  # argparse's own message and exit
    if args.command is None:
        parser.print_help()
        return 0
    for package in clashing_packages():
        print(f"mlx-grpo: warning: {clash_message(package)}", file=sys.stderr)
    module = importlib.import_module(args._module)
    # Only a real command line re-executes; in-process calls (tests, scripts) keep their process.
    if real_command_line and getattr(module, "USES_MLX", False):
        reexec_with_openblas()
    try:
        return int(module.run(args) or 0)
    except UserError as err:
        if args.debug:
            raise
        print(f"mlx-grpo {args.command}: error: {terminal_safe(str(err))}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print(f"mlx-grpo {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
