"""`mlx-grpo sweep SWEEP.yaml`: grid or random search over config keys, one run per trial, then a comparison."""

from __future__ import annotations

import argparse

USES_MLX = True  # the trials train; they inherit the preloaded BLAS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sweep", metavar="SWEEP.yaml", help="sweep file (see docs/SWEEPS.md)")
    parser.add_argument("--parallel", type=int, default=1, metavar="N",
                        help="trials trained at once, each in its own process (default 1)")
    parser.add_argument("--dry-run", action="store_true", help="check the sweep and list its trials; train nothing")


def run(args: argparse.Namespace) -> int:
    from ..common.errors import UserError
    from ..common.terminal import terminal_safe
    from ..measuring.sweep import describe, load_sweep, plan_trials, run_sweep, trial_config, trial_state
    from ..telemetry.analysis.compare import comparison_table, expand_run_dirs, load_summary, table_console
    from ..telemetry.rundir.layout import RunPaths

    if args.parallel < 1:
        raise UserError(f"--parallel {args.parallel}: expected at least 1")
    console = table_console()
    spec = load_sweep(args.sweep)
    trials = plan_trials(spec)
    for trial in trials:
        trial_config(spec, trial)  # a mistake in any trial stops the sweep before anything is printed or run
    if args.dry_run:
        for trial in trials:
            state = trial_state(spec.directory / trial.name)
            console.print(terminal_safe(f"{trial.name}  {describe(trial.params)}  ({state})"))
        console.print(terminal_safe(f"{len(trials)} trials of sweep '{spec.name}' ({spec.method}) in {spec.directory}"))
        return 0
    console.print(terminal_safe(f"sweep '{spec.name}': {len(trials)} trials ({spec.method}), {args.parallel} at a "
                                f"time, in {spec.directory}"))
    outcomes = run_sweep(spec, parallel=args.parallel, say=console.print)
    done = [spec.directory / t.name for t in trials if RunPaths(spec.directory / t.name).run_json.is_file()]
    if done:
        console.print(comparison_table([load_summary(p) for p in expand_run_dirs(done)]))
    failed = [o.trial.name for o in outcomes if o.status == "failed"]
    elsewhere = [o.trial.name for o in outcomes if o.status == "elsewhere"]
    if elsewhere:
        console.print(f"{len(elsewhere)} trial(s) still being trained by another process (an earlier sweep that "
                      f"was killed): {', '.join(elsewhere)}; run the sweep again once they end", style="yellow")
    if failed or elsewhere:
        if failed:
            console.print(f"{len(failed)} trial(s) failed: {', '.join(failed)} (logs in {spec.directory / 'logs'}); "
                          f"run the sweep again to retry them", style="yellow")
        return 1
    return 0
