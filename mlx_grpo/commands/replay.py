"""`mlx-grpo replay RUN_DIR --rewards ... [--rubric-file FILE]`: re-score a run's kept completions under other
reward functions, weights or rubric, without a model, and print what would change (replay.py)."""

from __future__ import annotations

import argparse
import time


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory with completions/ (kept by default)")
    parser.add_argument("--rewards", nargs="+", metavar="SPEC[=WEIGHT]",
                        help="the reward set to replay: built-in names or file.py:function, each with an optional "
                             "weight (answer_check=2); default: the run's own built-in ones (a run's "
                             "file.py:function rewards are imported only when named here)")
    parser.add_argument("--without", nargs="+", default=[], metavar="NAME",
                        help="drop these reward functions from the set (e.g. --without digit_match)")
    parser.add_argument("--rubric-file", metavar="FILE",
                        help="add (or replace) the rubric reward with this rubric; a run's own rubric is used only "
                             "when named here (a rubric can name code)")
    parser.add_argument("--rubric-weight", type=float, metavar="W", help="the rubric's weight (default: the run's)")
    parser.add_argument("--steps", metavar="A:B", help="only steps A to B (inclusive), e.g. 150:200")
    parser.add_argument("--limit", type=int, default=10, help="changed groups and sign flips listed (default 10)")


def _spec(text: str) -> tuple[str, float]:
    from ..common.errors import UserError

    name, sep, weight = text.rpartition("=")
    if not sep:
        return text, 1.0
    try:
        return name, float(weight)
    except ValueError:
        raise UserError(f"--rewards {text}: the weight after '=' must be a number") from None


def _steps(text: str | None, available: list[int]) -> list[int] | None:
    from ..common.errors import UserError

    if text is None:
        return None
    first, sep, last = text.partition(":")
    try:
        lo = int(first) if first else min(available, default=0)
        hi = int(last) if sep and last else (max(available, default=0) if sep else lo)
    except ValueError:
        raise UserError(f"--steps {text}: expected A:B with whole numbers") from None
    return [s for s in available if lo <= s <= hi]


def run(args: argparse.Namespace) -> int:
    import shlex
    from pathlib import Path

    from ..common.errors import UserError
    from ..common.terminal import terminal_safe
    from ..config.run_code import is_user_code, named_file, refuse_named_code, spec_text
    from ..rewards.loading import load_reward_functions
    from ..rewards.scoring import RewardFunction
    from ..run.replay import render, replay, run_settings
    from ..telemetry.analysis.report import load_run
    from ..telemetry.reward_names import reward_name
    from ..telemetry.rundir.completions import completion_steps

    start = time.perf_counter()
    run_dir = Path(args.run_dir)
    _, metrics, _, _ = load_run(run_dir)
    rewards, rubric_file, rubric_weight, group_size, scale, base_dir = run_settings(run_dir)
    specs = [_spec(s) for s in args.rewards] if args.rewards else rewards
    # a reward's one name (reward_names.py): a built-in's name, or the function's name
    names = [reward_name(n) for n, _ in specs]
    unknown = [name for name in args.without if name not in {*names, "rubric"}]
    if unknown:
        raise UserError(f"--without {' '.join(unknown)}: not in the reward set ({', '.join(names)})")
    specs = [(n, w) for n, w in specs if reward_name(n) not in args.without]
    if not args.rewards:  # the run's own set: built-ins by name; its user files only when named here
        for name, _ in specs:
            if is_user_code(name):
                kept = " ".join(spec_text(n, w, base_dir) for n, w in specs)
                raise refuse_named_code(run_dir, "replay", "reward", name, base_dir,
                                        f"--rewards {kept}, or leave it out: --without {reward_name(name)}")
    functions = load_reward_functions(specs, Path.cwd())
    if args.rubric_file is None and rubric_file is not None and "rubric" not in args.without:
        # a rubric can import python scorers and send an API key to its judge's url: the run's is not read
        raise UserError(f"{run_dir}: the run scored with the rubric {terminal_safe(rubric_file)} "
                        f"({named_file(rubric_file, base_dir, spec=False)}), which can name python code and a judge "
                        "endpoint; "
                        "replay reads no rubric a run directory names. To use it, name it on the command line: "
                        f"--rubric-file {shlex.quote(named_file(rubric_file, base_dir, spec=False))}, or leave it out: "
                        "--without rubric")
    if args.rubric_file is not None:
        from ..rewards.rubric import load_rubric
        from ..rewards.rubric_reward import RubricReward

        weight = args.rubric_weight if args.rubric_weight is not None else rubric_weight
        functions.append(RewardFunction("rubric", RubricReward(load_rubric(Path(args.rubric_file))), weight))
    if not functions:
        raise UserError("the replayed reward set is empty: name at least one reward function")
    steps = _steps(args.steps, completion_steps(run_dir))
    result = replay(run_dir, functions, group_size, scale, steps, metrics, weights_before=dict(rewards))
    print(render(result, args.limit))
    print(f"({time.perf_counter() - start:.1f} s, no model loaded)")
    return 0
