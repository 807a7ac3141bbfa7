"""Opening a run: resume point, run directory, sinks, recorder and the first lines said, each a part of
`open_run`. What it returns, a `Run`, is what run.py's loop drives. This module is the assembly, as mlx-lm's
lora.py is beside its tuner; it decides nothing after the start."""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..checkpoint import load_checkpoint, read_state
from ..common.terminal import terminal_safe
from ..config.train_config import TrainConfig, config_to_dict
from ..data import epoch_steps, load_datasets
from ..distributed import init_world
from ..extras.entropy_dump import EntropyDumpWriter
from ..models.policy import chunk_ignored, count_parameters, resolve_dtype
from ..planning.fitting import fit_run
from ..planning.machine import (
    accel_memory,
    describe_device,
    matmul_peak_flops,
    share_memory_with,
    versions,
    wire_memory,
)
from ..planning.tf32 import float32_state
from ..telemetry.alerts.config import check_rule_metrics, load_alert_rules, rules_from_config, with_on_alert
from ..telemetry.alerts.remedy import Remedy
from ..telemetry.events import Artifact, Start
from ..telemetry.metrics.system import SystemSampler
from ..telemetry.recorder import RunRecorder, StepReport
from ..telemetry.rundir.completions import truncate_completions
from ..telemetry.rundir.writer import RunInfo, new_run_info
from ..telemetry.sinks import SinkSet, make_sinks
from ..telemetry.sinks.notify import NotifySink, channels_from_env
from ..telemetry.sinks.trackio import TrackioOptions, trackio_store
from ..telemetry.sinks.wandb import WandbOptions
from ..trainer import Trainer
from .console import TrainingConsole
from .resume import last_record, resumable_checkpoint, truncate_logs
from .run_lock import RunLock, create_run_dir


@dataclass
class Run:
    """An opened run: its directory, the trainer, the recorder, where the steps start, and where they are."""

    run_dir: Path
    trainer: Trainer
    recorder: RunRecorder
    start_step: int
    run_id: str
    last_record: dict[str, Any]
    base_dir: Path  # where the config's relative paths resolve from
    lock: RunLock | None = None  # rank 0's lock on the run directory, released when the run closes
    rollbacks: int = 0  # rollbacks made so far (alert rules with action rollback)
    remedy: Remedy = Remedy()  # their factors, multiplied: learning_rate 0.25 after two halvings
    step: int = 0  # the step under way (or the last one done)
    report: StepReport | None = None  # the last step's record
    # (step, held-out accuracy) of the run's best evaluation so far, step 0's included: each new best is
    # checkpointed, and that checkpoint is kept whatever keep_checkpoints prunes (a run can end below it)
    best_eval: tuple[int, float] | None = None

    @property
    def config(self) -> TrainConfig:
        return self.trainer.config

    @property
    def writes(self) -> bool:
        """Whether this process writes the run's files and speaks for it: rank 0 of a data-parallel run."""
        return self.trainer.world.is_main


def open_run(config: TrainConfig, base_dir: Path, resume_dir: Path | None) -> Run:
    """Build the trainer, restore a checkpoint when resuming, and assemble the recorder and its sinks."""
    if config.epochs is not None:  # a length in epochs (TRL's num_train_epochs) is a step count from here on
        config = epoch_steps(config, base_dir)
    # refuse early: a resume with nothing to resume, a mistake in the alert file, a run that cannot fit
    checkpoint = resumable_checkpoint(resume_dir, config.num_steps) if resume_dir is not None else None
    rules = alert_rules(config, base_dir)
    channels_from_env(config.notify)  # a notify channel without its URL in the environment
    share_memory_with(init_world().ranks_on_this_host())  # before the plan: ranks on one Mac share it
    config, memory_plan, planned_peak = fit_run(config, base_dir)
    remedy = saved_remedy(checkpoint)  # rollbacks before the checkpoint changed the learning rate and beta
    trainer = Trainer.build(remedy.applied(config), base_dir)
    run_dir, lock = open_directory(trainer, resume_dir)
    memory_warning = wire_memory(trainer.resident_bytes(), planned_peak)
    trainer.peak_flops_per_s = matmul_peak_flops()  # perf/mfu's denominator
    saved = resume_point(trainer, checkpoint, run_dir, resume_dir)
    sinks, console, run_info = open_sinks(trainer, run_dir, base_dir, saved, resume_dir)
    recorder = open_recorder(trainer, rules, sinks, console, saved)
    start_step = saved.get("step", 0)
    run = Run(run_dir, trainer, recorder, start_step, run_info.run_id,
              last_record(run_dir) if resume_dir is not None else {}, base_dir, lock,
              rollbacks=int(saved.get("rollbacks", 0)), remedy=remedy, step=start_step,
              best_eval=saved_best(saved))
    announce(run, memory_plan, memory_warning)
    return run


def alert_rules(config: TrainConfig, base_dir: Path) -> list:
    """The run's alert rules: the built-in ones (unless turned off) and those of the config's alerts file."""
    if config.alerts_file is not None:
        path = Path(config.alerts_file)
        path = path if path.is_absolute() else base_dir / path
        rules = load_alert_rules(path, defaults=config.enable_alerts)
        for warning in check_rule_metrics(rules, str(path)):  # a rule on a metric no run logs never fires
            print(f"mlx-grpo: warning: {terminal_safe(warning)}", file=sys.stderr, flush=True)
    else:
        rules = rules_from_config({}, defaults=config.enable_alerts)
    return with_on_alert(rules, config.on_alert)


def saved_best(saved: dict) -> tuple[int, float] | None:
    """The best evaluation a resumed run had reached, from its checkpoint's state (checked: it is data)."""
    best = saved.get("best_eval")
    if (isinstance(best, list) and len(best) == 2 and isinstance(best[0], int) and not isinstance(best[0], bool)
            and isinstance(best[1], (int, float)) and not isinstance(best[1], bool) and math.isfinite(best[1])):
        return best[0], float(best[1])
    return None


def saved_remedy(checkpoint: Path | None) -> Remedy:
    """The rollbacks' factors a checkpoint kept (none for a new run; read_state checked them)."""
    if checkpoint is None:
        return Remedy()
    return Remedy.from_state(read_state(checkpoint).get("remedy", {}))


def open_directory(trainer: Trainer, resume_dir: Path | None) -> tuple[Path, RunLock | None]:
    """The run directory: rank 0 creates it (or takes the resumed one) and locks it for the run; the other
    ranks learn its path."""
    world, main_dir, lock = trainer.world, None, None
    if world.is_main:
        main_dir, lock = (resume_dir, RunLock(resume_dir).acquire()) if resume_dir else new_run_dir(trainer.config)
    return Path(world.from_main(str(main_dir) if world.is_main else "")), lock


def new_run_dir(config: TrainConfig) -> tuple[Path, RunLock]:
    """A new run directory, created by this process alone (two runs named alike get two directories).
    Outputs go where the user stands, as with every other trainer: `mlx-grpo train cfg/my.yaml` writes
    to ./runs, where `mlx-grpo watch` and `tensorboard --logdir runs` look. (Inputs named inside a
    config, such as datasets and reward files, resolve against the config file.)"""
    return create_run_dir(Path(config.monitoring_dir).expanduser(),
                          config.run_name or time.strftime("grpo-%Y%m%d-%H%M%S"))


def resume_point(trainer: Trainer, checkpoint: Path | None, run_dir: Path, resume_dir: Path | None) -> dict[str, Any]:
    """On resume: the checkpoint's weights, optimiser and data order, and the logs cut back to it. Returns
    the checkpoint's state ({} for a new run)."""
    saved: dict[str, Any] = {}
    if checkpoint is not None:
        saved = load_checkpoint(checkpoint, trainer.policy.model, trainer.optimizer)
        trainer.world.check_resume(saved, checkpoint)
        trainer.order.load_state(saved["order"])
    if resume_dir is not None and trainer.world.is_main:
        truncate_logs(run_dir, saved.get("log_positions"), saved.get("step", 0))
        truncate_completions(run_dir, saved.get("step", 0))
    return saved


def open_sinks(trainer: Trainer, run_dir: Path, base_dir: Path, saved: dict[str, Any],
               resume_dir: Path | None) -> tuple[SinkSet, TrainingConsole, RunInfo]:
    """The console and the sinks: the run directory always, TensorBoard, W&B, Trackio, every completion and
    the entropy dumps as configured. Only rank 0 writes: the other ranks get a set without sinks."""
    config, writes, start_step = trainer.config, trainer.world.is_main, saved.get("step", 0)
    console = TrainingConsole(config.num_steps, start_step)
    console.console.quiet = not writes  # rank 0 speaks for the run
    info = RunInfo(name=run_dir.name, run_id=saved.get("run_id"))
    device = {**describe_device(resolve_dtype(config)), **trainer.world.describe()}  # every rank: a collective
    sinks = SinkSet(None)
    if writes:
        sinks = make_sinks(run_dir, tensorboard=config.tensorboard, tensorboard_dir=config.tensorboard_dir,
                           wandb=wandb_options(config, run_dir), trackio=trackio_options(config, run_dir),
                           warn=lambda m: console.message(m, style="yellow"),
                           purge_step=start_step + 1 if resume_dir is not None else None,
                           completions_max_mb=config.completions_max_mb if config.keep_completions else None,
                           extra=[EntropyDumpWriter(run_dir), *notify_sinks(config, console)])
        info = new_run_info(run_dir, run_dir.name, {**config_to_dict(config), "base_dir": str(base_dir)},
                            versions(), device, config.num_steps, run_id=saved.get("run_id"),
                            resume_step=start_step if resume_dir is not None else None)
    sinks.handle(Start(info, run_dir))
    if config.wandb and config.wandb_log_dataset and resume_dir is None and writes:
        log_dataset(sinks, config, base_dir)
    return sinks, console, info


def wandb_options(config: TrainConfig, run_dir: Path) -> WandbOptions | None:
    """W&B's options; opt-in only: an API key in the environment is not a request to log."""
    if not config.wandb:
        return None
    return WandbOptions(project=config.wandb_project, entity=config.wandb_entity,
                        name=config.wandb_run_name or run_dir.name, tags=config.wandb_tags, notes=config.wandb_notes,
                        log_checkpoints=config.wandb_log_checkpoints, chart_every=config.wandb_chart_every)


def notify_sinks(config: TrainConfig, console: TrainingConsole) -> list[NotifySink]:
    """One sink per channel of `notify`, its URL from the environment (never from the config)."""
    channels, warnings = channels_from_env(config.notify)
    for warning in warnings:
        console.message(f"mlx-grpo: warning: {warning}", style="yellow")
    return [NotifySink(c, config.notify_level, config.notify_repeat_minutes) for c in channels]


def trackio_options(config: TrainConfig, run_dir: Path) -> TrackioOptions | None:
    return TrackioOptions(project=config.trackio_project, name=run_dir.name) if config.trackio else None


def open_recorder(trainer: Trainer, rules: list, sinks: SinkSet, console: TrainingConsole,
                  saved: dict[str, Any]) -> RunRecorder:
    """The recorder: trackers, alerts, the system sampler, the console; a resume restores their state."""
    config = trainer.config
    recorder = RunRecorder(
        [f.name for f in trainer.reward_fns], rules, sinks=sinks, console=console,
        sampler=SystemSampler(accel_memory=accel_memory).start(), reward_fns=trainer.reward_fns,
        components={"adaptive_window": trainer.window} if trainer.window is not None else {},
        hist_every=config.histogram_every, log_every=config.log_every, num_steps=config.num_steps,
        num_iterations=config.num_iterations, samples_per_step=config.samples_per_step)
    if "run_state" in saved:
        recorder.load_state_dict(saved["run_state"])
        for rule in recorder.engine.rules:  # a collapse stop is not carried over: a policy still broken stops again
            if rule.action == "stop" and rule.remedy:
                rule.latches.clear()
    return recorder


def announce(run: Run, memory_plan: str, memory_warning: str | None) -> None:
    """Say what runs: the model and batch, the memory plan, what loading changed, where Trackio stores,
    warnings, and the reward functions' own lines."""
    trainer, config, say = run.trainer, run.config, run.recorder.message
    total_params, trainable_params = count_parameters(trainer.policy.model)
    say(f"run {run.run_dir}  model {config.model_id}: {total_params:,} parameters, {trainable_params:,} "
        f"trainable; {config.batch_size} prompts x {config.num_generations} completions per step (batch_size "
        f"counts prompts)")
    say(memory_plan)
    if (float32 := float32_state()).accelerators is not None:  # a Metal GPU: is its float32 TF32 (an M5)?
        say(f"float32 here: {float32.describe()}")
    if trainer.policy.load_note is not None:
        say(trainer.policy.load_note)
    if trainer.prefix_note is not None:
        say(trainer.prefix_note)
    if config.trackio and "trackio" in run.recorder.sinks.active:
        say(f"trackio: run {run.run_dir.name} of project {config.trackio_project}, stored offline in "
            f"{trackio_store()} (trackio show --project {config.trackio_project})")
    for warning in (memory_warning, chunk_ignored(trainer.policy.model, config)):
        if warning is not None:
            say(warning, style="yellow")
    for fn in trainer.reward_fns:
        if (line := fn.hooks.describe()) is not None:
            say(line)


def log_dataset(sinks: SinkSet, config: TrainConfig, base_dir: Path) -> None:
    """The rows of the run's train and held-out splits, to the sinks that keep datasets (W&B's worker
    thread writes and uploads them; the training thread only hands the lists over)."""
    train_rows, heldout_rows = load_datasets(config, base_dir)
    name = "arithmetic" if config.dataset == "arithmetic" else Path(config.dataset).stem
    sinks.handle(Artifact(
        "dataset", name=f"{name}-seed{config.seed}" if config.dataset == "arithmetic" else name,
        splits={"train": train_rows, "heldout": heldout_rows},
        metadata={"dataset": config.dataset, "eval_dataset": config.eval_dataset,
                  "dataset_format": config.dataset_format, "prompt_field": config.prompt_field,
                  "answer_field": config.answer_field, "train_size": config.train_size,
                  "eval_size": config.eval_size, "seed": config.seed}))
