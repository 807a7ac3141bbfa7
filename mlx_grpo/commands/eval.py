"""`mlx-grpo eval RUN_DIR|MODEL [--dataset FILE]`: held-out accuracy of a run's checkpoint or of a model.

Greedy decoding, the same correctness check and held-out rows as the trainer's `eval/accuracy` (so on a
run's own held-out split the two agree), and the mean score of each of the run's reward functions. A
progress bar on stderr; `--json` prints one JSON object on stdout.

A run directory is data (run_code.py): its built-in rewards and checks are used by name; a `file.py:function`
or rubric it names is imported only when given here with --correctness / --rewards / --rubric-file.
"""

from __future__ import annotations

import argparse

from ..common.errors import UserError

USES_MLX = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="RUN_DIR|MODEL",
                        help="a run directory (its latest checkpoint, its config's prompt format and reward "
                             "functions) or a model: a local directory (an `mlx-grpo export` one too) or a hub id")
    parser.add_argument("--dataset", metavar="FILE",
                        help=".jsonl, .parquet or .csv rows to evaluate (the run's dataset format and fields); "
                             "default: the run's own held-out split")
    parser.add_argument("--step", type=int, default=None, metavar="N", help="RUN_DIR: the checkpoint of step N")
    parser.add_argument("--config", metavar="FILE",
                        help="MODEL: the run config whose prompt format and reward functions to use "
                             "(default: the built-in default run's)")
    parser.add_argument("--limit", type=int, default=None, metavar="N", help="evaluate only the first N rows")
    parser.add_argument("--batch-size", type=int, default=100, metavar="N",
                        help="held-out prompts decoded together, for speed (default: 100; not train's --batch-size, "
                             "which counts prompts per step)")
    parser.add_argument("--correctness", metavar="CHECK",
                        help="answer, last_number or file.py:function; default: the run's (or --config's) own. "
                             "A run's file.py:function check is imported only when named here")
    parser.add_argument("--rewards", nargs="+", metavar="SPEC[=WEIGHT]",
                        help="reward functions to score with; default: the run's built-in ones (its file.py:function "
                             "rewards only when named here)")
    parser.add_argument("--rubric-file", metavar="FILE",
                        help="score with this rubric too (a run's own only when named here)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")


def run(args: argparse.Namespace) -> int:
    import json
    import sys
    import time

    import numpy as np
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from ..data import extra_columns
    from ..evaluate import evaluate
    from ..models.policy import stop_ids
    from ..rewards.scoring import score_completions
    from ..telemetry.metrics.names import EVAL_ACCURACY
    from ..telemetry.metrics.step_data import eval_record

    if args.limit is not None and args.limit < 1:
        raise UserError(f"--limit {args.limit}: must be at least 1")
    if args.batch_size < 1:
        raise UserError(f"--batch-size {args.batch_size}: must be at least 1")
    model, tokenizer, config, base_dir, source = load_target(args)
    rows = _rows(args, config, base_dir)

    check, functions, notes = checks_and_rewards(args, config, base_dir)
    eos_ids, pad_id = stop_ids(tokenizer, config.stop_at_newline)
    start = time.perf_counter()
    with Progress(TextColumn("eval"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=Console(stderr=True), transient=True, disable=not sys.stderr.isatty()) as bar:
        task = bar.add_task("eval", total=len(rows))
        result = evaluate(model, tokenizer, rows, config, eos_ids, pad_id, batch_size=args.batch_size,
                          progress=lambda n: bar.advance(task, n), check=check)
    seconds = time.perf_counter() - start
    scores = score_completions(functions, [r["prompt"] for r in rows], result.completions,
                               [r["answer"] for r in rows], extra_columns(rows))
    rewards = {name: float(np.nanmean(scores.per_function[i])) for i, name in enumerate(scores.names)}
    if functions and not notes:  # a total of part of the run's reward set would not be the run's total
        rewards["total"] = float(np.mean(scores.total))
    out = {"target": source, "dataset": args.dataset or config.eval_dataset or f"{config.dataset} (held-out split)",
           "rows": len(rows), "correct": int(sum(result.correct)), **eval_record(result.correct, result.levels,
                                                                                seconds),
           "rewards": rewards}
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"{source}: held-out accuracy {out[EVAL_ACCURACY]:.1%} ({out['correct']}/{len(rows)}) on "
          f"{out['dataset']}, greedy, {seconds:.1f} s")
    for key, value in out.items():
        if key.startswith("eval/difficulty/") and key.endswith("/accuracy"):
            level = key.split("/")[2]
            print(f"  difficulty {level}: {value:.1%} of {int(out[f'eval/difficulty/{level}/count'])}")
    if rewards:
        print("  mean reward: " + ", ".join(f"{name} {value:+.3f}" for name, value in rewards.items()))
    return 0


def _rows(args: argparse.Namespace, config, base_dir) -> list[dict]:
    """The rows to evaluate: `--dataset`'s file, else the run config's held-out split; `--limit` of them."""
    from pathlib import Path

    from ..data import load_datasets, read_dataset_file

    if args.dataset is not None:
        path = Path(args.dataset)
        if not path.is_file():
            raise UserError(f"--dataset {path}: file not found")
        rows = read_dataset_file(path, config.dataset_format, config.prompt_field, config.answer_field)
    else:
        rows = load_datasets(config, base_dir)[1]
    rows = rows[: args.limit] if args.limit is not None else rows
    if not rows:
        raise UserError(f"--dataset {args.dataset or config.dataset}: no rows to evaluate")
    return rows


def checks_and_rewards(args: argparse.Namespace, config, base_dir):
    """(correctness check, reward functions, notes) for the evaluation. From a run directory: its built-in
    check and rewards by name; a user file it names is refused (the check: accuracy needs it) or left out with
    a note (a reward), each naming the file and the flag that passes it. From --config (a file the user named):
    everything it names, as training does."""
    from pathlib import Path

    from ..config.run_code import is_user_code, named_file, refuse_named_code, spec_text
    from ..rewards.correctness import load_correctness
    from ..rewards.loading import load_reward_functions
    from ..rewards.scoring import RewardFunction
    from ..telemetry.rundir.layout import RunPaths

    from_run = RunPaths(args.target).run_json.is_file()
    reward_names = [r.name for r in config.rewards]
    setting, where = (args.correctness, Path.cwd()) if args.correctness else (config.correctness, base_dir)
    if from_run and not args.correctness and is_user_code(setting):
        raise refuse_named_code(Path(args.target), "eval", "correctness check", setting, base_dir,
                                f"--correctness {spec_text(setting, 1, base_dir).rpartition('=')[0]}")
    check = load_correctness(setting, config.dataset, reward_names, where)
    if check is None:
        raise UserError(f"{args.target}: the {'run' if from_run else 'config'} has no correctness check "
                        f"(correctness: {setting}), so accuracy cannot be measured; pass --correctness answer, "
                        "last_number or file.py:function")
    notes = []
    if args.rewards:
        from .replay import _spec

        functions = load_reward_functions([_spec(s) for s in args.rewards], Path.cwd())
    else:
        specs = [(r.name, r.weight) for r in config.rewards]
        if from_run:
            left_out = [(n, w) for n, w in specs if is_user_code(n)]
            specs = [(n, w) for n, w in specs if not is_user_code(n)]
            notes += [f"the run's reward {n} is user code ({named_file(n, base_dir)}) and was not scored: eval imports "
                      f"no code a run directory names; pass --rewards {spec_text(n, w, base_dir)} to score it"
                      for n, w in left_out]
        functions = load_reward_functions(specs, base_dir)
    rubric = args.rubric_file or (config.rubric_file if not from_run else None)
    if from_run and not args.rubric_file and config.rubric_file:
        notes.append(f"the run's rubric ({named_file(config.rubric_file, base_dir, spec=False)}) was not scored: "
                     "eval reads no rubric a run directory names; pass --rubric-file FILE to score it")
    if rubric is not None:
        from ..rewards.rubric import load_rubric
        from ..rewards.rubric_reward import RubricReward

        path = Path(rubric)
        path = path if path.is_absolute() or args.rubric_file else base_dir / path
        functions.append(RewardFunction("rubric", RubricReward(load_rubric(path)), config.rubric_weight))
    return check, functions, notes


def load_target(args: argparse.Namespace):
    """(model, tokenizer, config, base_dir, description) of a run directory's checkpoint or of a model."""
    from pathlib import Path

    from ..config.train_config import load_config
    from ..models.policy import dequantize_base, load_policy
    from ..run.export import ADAPTER_FILES, load_trained
    from ..telemetry.rundir.layout import RunPaths

    target = Path(args.target)
    if RunPaths(target).run_json.is_file():
        if args.config is not None:
            raise UserError(f"--config {args.config}: a run directory keeps its own config")
        trained = load_trained(target, args.step)
        return (trained.model, trained.tokenizer, trained.config, trained.base_dir,
                f"{target} ({trained.checkpoint.name})")
    if args.step is not None:
        raise UserError(f"--step {args.step}: only for a run directory; {target} has no run.json")
    config = load_config(args.config, {"model_id": args.target})
    base_dir = Path(args.config).resolve().parent if args.config else Path.cwd()
    model, tokenizer = load_policy(config, base_dir)
    dequantize_base(model, config)  # as training does: quantized matmul is slow on the CPU backend
    if all((target / name).is_file() for name in ADAPTER_FILES):  # an unfused `mlx-grpo export`
        from mlx_lm.tuner.utils import load_adapters

        model = load_adapters(model, str(target))
    model.eval()
    return model, tokenizer, config, base_dir, args.target

