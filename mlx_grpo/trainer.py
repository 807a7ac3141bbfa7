"""The GRPO training loop: rollout -> rewards -> advantages -> update -> metric record -> sinks.

`Trainer` holds what a step needs (policy, reference, rewards, data order, optimiser) and runs a
step as phase methods that return data: `draw_prompts`, `rollout`, `score`, `advantages`,
`reference_logprobs`, `update`. `Trainer.step` strings them together and returns a `StepData` of
raw arrays and timings (gathered over data-parallel ranks); it names no metric. The record is made
from that data by the run's `RunRecorder` (telemetry/recorder.py), which also writes it.

Read `train()` top to bottom: open the run, then per step: step, evaluate when due, record,
checkpoint when due, write.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np

from .checkpoint import PendingCheckpoint, load_checkpoint, prepare_checkpoint
from .config import TrainConfig, config_to_dict
from .console import TrainingConsole
from .data import EncodedPrompt, PromptOrder, encode_prompt, extra_columns, load_datasets
from .distributed import World, init_world
from .errors import UserError
from .evaluate import evaluate
from .extras import entropy_dump
from .extras.adaptive_window import WindowController
from .extras.sgrpo import run_exits
from .machine import accel_memory, describe_device, versions, wire_memory
from .models import ReferencePolicy, apply_adapters, count_parameters, load_policy, make_reference, resolve_dtype
from .resume import last_record, log_positions, resumable_checkpoint, resume_command, truncate_logs
from .rewards import RewardFunction, RewardScores, load_reward_functions, score_completions
from .rollout import Rollout, SamplingSettings, decode_completion, generate
from .signals import StopRequest, report_stop
from .tasks.answer_format import extract_answer, extract_reasoning, is_correct
from .telemetry.alerts.config import load_alert_rules, rules_from_config
from .telemetry.recorder import RunRecorder, StepReport
from .telemetry.rundir.writer import scrub_secrets
from .telemetry.sinks.trackio import TrackioOptions, trackio_store
from .telemetry.sinks.wandb import WandbOptions
from .telemetry.sinks import make_sinks, wandb_enabled
from .telemetry.metrics.step_data import StepData, UpdateStats, eval_record
from .telemetry.metrics.system import SystemSampler
from .telemetry.metrics.names import REDRAWN_PROMPTS
from .plan import fit_run
from .run_lock import RunLock, create_run_dir
from .update import (TrainBatch, UpdateResult, build_train_batch, checkpoint_blocks, make_loss_fn, reference_logprobs,
                     update_policy)


# ----------------------------------------------------------------------------- setup pieces

@dataclass
class Policy:
    model: nn.Module
    tokenizer: Any
    eos_ids: set[int]
    pad_id: int


def load_policy_for_training(config: TrainConfig, base_dir: Path) -> Policy:
    model, tokenizer = load_policy(config, base_dir)
    apply_adapters(model, config)
    eos_ids = set(getattr(tokenizer, "eos_token_ids", None) or [tokenizer.eos_token_id])
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_ids)
    return Policy(model, tokenizer, eos_ids, pad_id)


def make_optimizer(config: TrainConfig) -> optim.Optimizer:
    # The schedule advances once per optimiser update, and a step makes num_iterations of them: measured in
    # steps, a cosine schedule with num_iterations 2 reached 0 halfway and the second half learnt nothing.
    updates = config.num_steps * config.num_iterations
    warmup = int(round(config.warmup_fraction * updates))
    if config.lr_schedule == "cosine":
        main = optim.cosine_decay(config.learning_rate, max(1, updates - warmup))
    else:
        main = lambda step: mx.array(config.learning_rate)  # noqa: E731 - a constant schedule
    schedule = main
    if warmup > 0:
        ramp = optim.linear_schedule(config.learning_rate / warmup, config.learning_rate, warmup)
        schedule = optim.join_schedules([ramp, main], [warmup])
    return optim.AdamW(learning_rate=schedule, weight_decay=config.weight_decay)


def load_rewards(config: TrainConfig, base_dir: Path) -> list[RewardFunction]:
    functions = load_reward_functions([(r.name, r.weight) for r in config.rewards], base_dir)
    if config.rubric_file is not None:
        from .rubric import load_rubric
        from .rubric_reward import RubricReward

        path = Path(config.rubric_file)
        rubric = load_rubric(path if path.is_absolute() else base_dir / path)
        functions.append(RewardFunction("rubric", RubricReward(rubric, criteria_every=config.log_every),
                                        config.rubric_weight))
    return functions


def step_key(seed: int, step: int) -> mx.array:
    """The sampling key of one step: a pure function of (seed, step), so resume replays it exactly."""
    return mx.random.key(seed * 1_000_003 + step)


class PhaseMeter:
    """Seconds and peak MLX memory of each phase of a step (the peak counter is reset per phase)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.peaks: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str, memory: bool = False) -> Iterator[None]:
        if memory:
            mx.reset_peak_memory()
        start = time.perf_counter()
        yield
        # a phase entered again in the same step (dynamic sampling's extra rollouts) adds up
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
        if memory:
            self.peaks[name] = max(self.peaks.get(name, 0.0), float(mx.get_peak_memory()))


# ----------------------------------------------------------------------------- one step, in phases

@dataclass
class Prompts:
    """One step's B prompts: dataset rows, their token ids, and the rows repeated per completion."""

    rows: list[dict]
    encoded: list[EncodedPrompt]
    group_size: int

    @property
    def per_completion(self) -> list[dict]:
        return [row for row in self.rows for _ in range(self.group_size)]

    def take(self, groups: list[int]) -> "Prompts":
        return Prompts([self.rows[g] for g in groups], [self.encoded[g] for g in groups], self.group_size)

    @staticmethod
    def concat(parts: list["Prompts"]) -> "Prompts":
        return Prompts([r for p in parts for r in p.rows], [e for p in parts for e in p.encoded], parts[0].group_size)


@dataclass
class Scored:
    """A rollout's completions as text, their reward scores and correctness."""

    texts: list[str]
    scores: RewardScores
    correct: list[bool]

    def take(self, samples: list[int]) -> "Scored":
        return Scored([self.texts[i] for i in samples], self.scores.take(samples), [self.correct[i] for i in samples])

    @staticmethod
    def concat(parts: list["Scored"]) -> "Scored":
        return Scored([t for p in parts for t in p.texts], RewardScores.concat([p.scores for p in parts]),
                      [c for p in parts for c in p.correct])


@dataclass
class Drawn:
    """Prompts drawn for a step, their rollout and its scores, group by group: what dynamic sampling
    filters and tops up."""

    prompts: Prompts
    rollout: Rollout
    scored: Scored

    def informative_groups(self) -> list[int]:
        """Groups whose completions did not all get the same total reward (the others have no advantage)."""
        totals = self.scored.scores.total.reshape(len(self.prompts.rows), self.prompts.group_size)
        return [g for g, row in enumerate(totals) if row.max() > row.min()]

    def take(self, groups: list[int]) -> "Drawn":
        G = self.prompts.group_size
        samples = [g * G + j for g in groups for j in range(G)]
        return Drawn(self.prompts.take(groups), self.rollout.take(samples), self.scored.take(samples))

    @staticmethod
    def concat(parts: list["Drawn"]) -> "Drawn":
        return Drawn(Prompts.concat([p.prompts for p in parts]), Rollout.concat([p.rollout for p in parts]),
                     Scored.concat([p.scored for p in parts]))


@dataclass
class Trainer:
    """Everything one step needs, built once per run."""

    config: TrainConfig
    policy: Policy
    reference: ReferencePolicy | None
    reward_fns: list[RewardFunction]
    train_rows: list[dict]
    eval_rows: list[dict]
    order: PromptOrder
    optimizer: optim.Optimizer
    loss_and_grad: Any = None
    settings: SamplingSettings = field(default_factory=SamplingSettings)
    world: World = field(default_factory=World)  # data-parallel ranks (size 1: one process)
    window: WindowController | None = None  # adaptive generation window, when enabled

    @classmethod
    def build(cls, config: TrainConfig, base_dir: Path, rows: tuple[list[dict], list[dict]] | None = None,
              stop_at_eos: bool = True) -> "Trainer":
        """`rows`: (train, eval) rows instead of the config's datasets; `stop_at_eos` False makes every
        completion run its whole budget (the benchmark's fixed shapes)."""
        if config.micro_batch_size == "auto":
            config = fit_run(config, base_dir)[0]
        mx.random.seed(config.seed)
        world = init_world()
        policy = load_policy_for_training(config, base_dir)
        if not stop_at_eos:
            policy = dataclasses.replace(policy, eos_ids=set())
        world.broadcast_parameters(policy.model)
        if config.grad_checkpoint:
            checkpoint_blocks(policy.model)
        reward_fns = load_rewards(config, base_dir)
        train_rows, eval_rows = rows if rows is not None else load_datasets(config, base_dir)
        window = (WindowController(config.adaptive_window, config.max_generation_steps, config.seed)
                  if config.adaptive_window.enable else None)
        return cls(config, policy, make_reference(policy.model, config), reward_fns, train_rows,
                   world.shard_rows(eval_rows), world.shard_order(PromptOrder(len(train_rows), config.seed)),
                   make_optimizer(config),
                   loss_and_grad=nn.value_and_grad(policy.model, make_loss_fn(config)),
                   settings=SamplingSettings(config.temperature, config.top_p, config.top_k, config.min_p),
                   world=world, window=window)

    # ------------------------------------------------------------------ phases

    def draw_prompts(self, count: int | None = None) -> Prompts:
        rows = [self.train_rows[i] for i in self.order.next_indices(count or self.config.batch_size)]
        encoded = [encode_prompt(self.policy.tokenizer, row["prompt"], self.config, row.get("messages"))
                   for row in rows]
        return Prompts(rows, encoded, self.config.num_generations)

    def rollout(self, prompts: Prompts, key: mx.array, max_tokens: int) -> Rollout:
        """B prompts x G completions of at most `max_tokens` tokens, over a shared-prefill KV cache."""
        self.policy.model.eval()
        return generate(self.policy.model, [e.tokens for e in prompts.encoded], prompts.group_size, max_tokens,
                        self.policy.eos_ids, self.policy.pad_id, self.settings, key)

    def score(self, prompts: Prompts, rollout: Rollout) -> Scored:
        policy = self.policy
        texts = [decode_completion(policy.tokenizer, c, policy.eos_ids) for c in rollout.completions]
        rows = prompts.per_completion
        answers = [row["answer"] for row in rows]
        scores = score_completions(self.reward_fns, [row["prompt"] for row in rows], texts, answers,
                                   extra_columns(rows))
        return Scored(texts, scores, [is_correct(t, a) for t, a in zip(texts, answers)])

    def refill(self, drawn: Drawn, key: mx.array, max_tokens: int, meter: PhaseMeter) -> tuple[Drawn, int]:
        """Dynamic sampling (DAPO): keep the groups whose rewards differ and draw new prompts for the
        others, up to `dynamic_sampling_max_rounds` times; a batch still short is filled with the
        equal-reward groups drawn first. Returns the batch and how many prompts were drawn again."""
        kept = [drawn.take(drawn.informative_groups())]
        spare = [drawn.take([g for g in range(len(drawn.prompts.rows)) if g not in drawn.informative_groups()])]
        redrawn = 0
        round_keys = mx.random.split(key, self.config.dynamic_sampling_max_rounds + 1)
        for round_key in round_keys[1:]:
            missing = self.config.batch_size - sum(len(part.prompts.rows) for part in kept)
            if missing <= 0:
                break
            prompts = self.draw_prompts(missing)
            with meter.phase("rollout", memory=True):
                rollout = self.rollout(prompts, round_key, max_tokens)
            with meter.phase("reward"):
                more = Drawn(prompts, rollout, self.score(prompts, rollout))
            redrawn += missing
            informative = more.informative_groups()
            kept.append(more.take(informative))
            spare.append(more.take([g for g in range(missing) if g not in informative]))
        missing = self.config.batch_size - sum(len(part.prompts.rows) for part in kept)
        if missing > 0:
            spares = Drawn.concat(spare)
            kept.append(spares.take(list(range(missing))))
        return Drawn.concat(kept), redrawn

    def advantages(self, scored: Scored) -> mx.array:
        advantages = self.world.group_advantages(mx.array(scored.scores.total, dtype=mx.float32),
                                                 self.config.num_generations, self.config.scale_rewards)
        mx.eval(advantages)
        return advantages

    def reference_logprobs(self, batch: TrainBatch) -> mx.array | None:
        """Reference-policy log-probs of the batch, once per rollout (None at beta = 0)."""
        return reference_logprobs(self.reference, batch, self.config)

    def update(self, batch: TrainBatch, advantages: mx.array, ref_logp: mx.array | None) -> UpdateResult:
        return update_policy(self.policy.model, self.optimizer, self.loss_and_grad, batch, advantages, ref_logp,
                             self.config, reduce=self.world)

    # ------------------------------------------------------------------ the step

    def step(self, step: int) -> StepData:
        """One GRPO step; its data is the global batch's (gathered over ranks)."""
        config, policy = self.config, self.policy
        meter = PhaseMeter()
        key = self.world.sample_key(step_key(config.seed, step))
        with meter.phase("step"):
            prompts = self.draw_prompts()
            plan = self.window.plan(step) if self.window is not None else None
            # The window varies the rollout budget only; the dr_grpo denominator stays max_generation_steps.
            rollout_budget = plan.window if plan is not None else config.max_generation_steps
            with meter.phase("rollout", memory=True):
                rollout = self.rollout(prompts, key, rollout_budget)
            with meter.phase("reward"):
                scored = self.score(prompts, rollout)
            component_metrics: dict[str, float] = {}
            if config.dynamic_sampling:
                drawn, redrawn = self.refill(Drawn(prompts, rollout, scored), key, rollout_budget, meter)
                prompts, rollout, scored = drawn.prompts, drawn.rollout, drawn.scored
                component_metrics[REDRAWN_PROMPTS] = float(redrawn)
            with meter.phase("advantage"):
                advantages = group_advantages = self.advantages(scored)
                trained = rollout
                if config.sgrpo.enable:  # the serial groups of early exits replace the parallel group
                    trained = run_exits(policy.model, policy.tokenizer, rollout,
                                        [row["answer"] for row in prompts.per_completion],
                                        num_exits=config.sgrpo.num_exits, decay=config.sgrpo.decay,
                                        max_answer_tokens=config.sgrpo.max_answer_tokens,
                                        scale_rewards=config.scale_rewards, settings=self.settings,
                                        eos_ids=policy.eos_ids, pad_id=policy.pad_id, key=mx.random.split(key)[1])
                    advantages = trained.advantages
                batch = build_train_batch(trained, policy.pad_id, config.mask_truncated_completions)
                mx.eval(advantages)
            with meter.phase("ref", memory=True):
                ref_logp = self.reference_logprobs(batch)
            with meter.phase("update", memory=True):
                update = self.update(batch, advantages, ref_logp)
        lengths = np.array([len(c) for c in rollout.completions], dtype=float)
        if plan is not None:
            component_metrics.update(self.window.update(plan, lengths, scored.correct))
        if config.sgrpo.enable:
            component_metrics.update(trained.metrics())
        data = StepData(
            step=step, group_size=config.num_generations,
            reward_names=scored.scores.names, reward_weights=[f.weight for f in self.reward_fns],
            scores=scored.scores.per_function, total=scored.scores.total, advantages=np.array(group_advantages),
            prompt_lengths=np.array([len(e.tokens) for e in prompts.encoded for _ in range(prompts.group_size)]),
            prompt_truncated=np.array([e.truncated for e in prompts.encoded for _ in range(prompts.group_size)]),
            lengths=lengths, truncated=np.array(rollout.truncated, dtype=bool),
            correct=np.array(scored.correct, dtype=bool),
            difficulty=[row.get("difficulty") for row in prompts.per_completion],
            trained_tokens=batch.num_tokens,
            update=UpdateStats(update.loss, update.grad_norm, update.stats, update.skipped,
                               self.optimizer.learning_rate.item(), config.beta, self.reference is not None),
            seconds={**meter.seconds, "update": update.seconds}, peak_memory=meter.peaks,
            component_metrics=component_metrics,
            samples=self._samples(prompts, scored, np.array(group_advantages), lengths, rollout.truncated),
            new_errors=scored.scores.new_errors,
            entropy_dump=(entropy_dump.build_dump(step, update.token_stats["token_entropy"],
                                                  update.token_stats["token_varentropy"], trained.prompts,
                                                  trained.completions)
                          if update.token_stats and step % config.entropy_logging.every == 0 else None),
        )
        return self.world.gather(data)

    def _samples(self, prompts: Prompts, scored: Scored, adv: np.ndarray, lengths: np.ndarray,
                 truncated: list[bool]) -> list[dict]:
        """One completion from each of the first few groups, for samples.jsonl."""
        G, scores, rows = prompts.group_size, scored.scores, prompts.per_completion
        out = []
        for i in [g * G for g in range(min(self.config.samples_per_step, len(prompts.rows)))]:
            per_fn = {name: (None if np.isnan(scores.per_function[j, i]) else float(scores.per_function[j, i]))
                      for j, name in enumerate(scores.names)}
            out.append({"prompt": rows[i]["prompt"], "completion": scored.texts[i],
                        "reasoning": extract_reasoning(scored.texts[i]),
                        "predicted": extract_answer(scored.texts[i]), "answer": rows[i]["answer"],
                        "rewards": per_fn, "total": float(scores.total[i]), "advantage": float(adv[i]),
                        "length": int(lengths[i]), "truncated": bool(truncated[i]),
                        "correct": bool(scored.correct[i])})
        return out

    def evaluate(self) -> dict[str, float]:
        """Greedy held-out accuracy over every rank's share of the held-out rows."""
        start = time.perf_counter()
        result = evaluate(self.policy.model, self.policy.tokenizer, self.eval_rows, self.config,
                          self.policy.eos_ids, self.policy.pad_id)
        correct, levels = self.world.gather_lists(result.correct, result.levels)
        return eval_record(correct, levels, self.world.slowest(time.perf_counter() - start))

    def adapter_config(self) -> dict | None:
        c = self.config
        if not c.use_lora:
            return None
        num_layers = len(self.policy.model.layers) if c.lora_layers < 0 else c.lora_layers
        return {"fine_tune_type": "dora" if c.use_dora else "lora", "num_layers": num_layers,
                "lora_parameters": {"rank": c.lora_rank, "scale": c.lora_alpha / c.lora_rank,
                                    "dropout": c.lora_dropout, "keys": c.lora_keys}}


# ----------------------------------------------------------------------------- the run

@dataclass
class Run:
    """An opened run: its directory, the trainer, the recorder and where the steps start."""

    run_dir: Path
    trainer: Trainer
    recorder: RunRecorder
    start_step: int
    run_id: str
    last_record: dict[str, Any]
    base_dir: Path  # where the config's relative paths resolve from
    lock: RunLock | None = None  # rank 0's lock on the run directory, released when the run closes


def alert_rules(config: TrainConfig, base_dir: Path) -> list:
    if config.alerts_file is not None:
        path = Path(config.alerts_file)
        return load_alert_rules(path if path.is_absolute() else base_dir / path, defaults=config.enable_alerts)
    return rules_from_config({}, defaults=config.enable_alerts)


def new_run_dir(config: TrainConfig) -> Path:
    """A new run directory, created by this process alone (two runs named alike get two directories).
    Outputs go where the user stands, as with every other trainer: `mlx-grpo train cfg/my.yaml` writes
    to ./runs, where `mlx-grpo watch` and `tensorboard --logdir runs` look. (Inputs named inside a
    config, such as datasets and reward files, resolve against the config file.)"""
    return create_run_dir(Path(config.monitoring_dir).expanduser(),
                          config.run_name or time.strftime("grpo-%Y%m%d-%H%M%S"))


def open_run(config: TrainConfig, base_dir: Path, resume_dir: Path | None) -> Run:
    """Build the trainer, restore a checkpoint when resuming, and assemble the recorder and its sinks."""
    checkpoint = resumable_checkpoint(resume_dir, config.num_steps) if resume_dir is not None else None
    rules = alert_rules(config, base_dir)  # before the model loads: a mistake in the file shows at once
    config, memory_plan = fit_run(config, base_dir)  # refuses a run that cannot fit, before anything loads
    trainer = Trainer.build(config, base_dir)
    world = trainer.world
    # rank 0 owns the run directory: it creates it (or takes the resumed one) and locks it for the run
    run_dir = Path(world.from_main(str(resume_dir or new_run_dir(config)) if world.is_main else ""))
    lock = RunLock(run_dir).acquire() if world.is_main else None
    memory_warning = wire_memory(mx.get_active_memory())  # weights and optimiser state are loaded by now
    saved: dict[str, Any] = {}
    if checkpoint is not None:
        saved = load_checkpoint(checkpoint, trainer.policy.model, trainer.optimizer)
        world.check_resume(saved, checkpoint)
        trainer.order.load_state(saved["order"])
    if resume_dir is not None and world.is_main:
        truncate_logs(run_dir, saved.get("log_positions"), saved.get("step", 0))
    start_step = saved.get("step", 0)

    console = TrainingConsole(config.num_steps, start_step)
    console.console.quiet = not world.is_main  # rank 0 speaks for the run
    wandb = None
    if wandb_enabled(config.wandb):
        wandb = WandbOptions(project=config.wandb_project, entity=config.wandb_entity,
                             name=config.wandb_run_name or run_dir.name, tags=config.wandb_tags,
                             notes=config.wandb_notes, log_checkpoints=config.wandb_log_checkpoints,
                             chart_every=config.wandb_chart_every)
    trackio = TrackioOptions(project=config.trackio_project, name=run_dir.name) if config.trackio else None
    sinks = world.sinks(lambda: make_sinks(
        run_dir, tensorboard=config.tensorboard, tensorboard_dir=config.tensorboard_dir, wandb=wandb,
        trackio=trackio, warn=lambda m: console.message(m, style="yellow"),
        purge_step=start_step + 1 if resume_dir is not None else None), run_dir)
    run_info = sinks.start(run_dir.name, {**config_to_dict(config), "base_dir": str(base_dir)}, versions(),
                           {**describe_device(resolve_dtype(config)), **world.describe()}, config.num_steps,
                           run_id=saved.get("run_id"), resume_step=start_step if resume_dir is not None else None)
    if wandb is not None and config.wandb_log_dataset and resume_dir is None and world.is_main:
        log_dataset(sinks, config, base_dir)
    recorder = RunRecorder(
        [f.name for f in trainer.reward_fns], rules, sinks=sinks, console=console,
        sampler=SystemSampler(accel_memory=accel_memory).start(), reward_fns=trainer.reward_fns,
        components={"adaptive_window": trainer.window} if trainer.window is not None else {},
        hist_every=config.histogram_every, log_every=config.log_every, num_steps=config.num_steps,
        num_iterations=config.num_iterations)
    if "run_state" in saved:
        recorder.load_state_dict(saved["run_state"])
    total_params, trainable_params = count_parameters(trainer.policy.model)
    console.message(f"run {run_dir}  model {config.model_id}: {total_params:,} parameters, "
                    f"{trainable_params:,} trainable; {config.batch_size} prompts x {config.num_generations} "
                    f"completions per step (batch_size counts prompts)")
    console.message(memory_plan)
    if trackio is not None and "trackio" in sinks.active:
        console.message(f"trackio: run {trackio.name} of project {trackio.project}, stored offline in "
                        f"{trackio_store()} (trackio show --project {trackio.project})")
    if memory_warning is not None:
        console.message(memory_warning, style="yellow")
    for fn in trainer.reward_fns:
        if (line := fn.hooks.describe()) is not None:
            console.message(line)
    return Run(run_dir, trainer, recorder, start_step, run_info.run_id,
               last_record(run_dir) if resume_dir is not None else {}, base_dir, lock)


def train(config: TrainConfig, base_dir: Path, resume_dir: Path | None = None) -> dict[str, Any]:
    """Run GRPO; returns the final metrics plus the run directory and status."""
    run = open_run(config, base_dir, resume_dir)
    trainer, recorder, world, run_dir = run.trainer, run.recorder, run.trainer.world, run.run_dir
    step, report, status, stopping, stopped_by = run.start_step, None, "failed", None, None
    stop = StopRequest()
    try:
        with recorder.console, stop:
            for step in range(run.start_step + 1, config.num_steps + 1):
                # rollout, rewards, advantages, reference, update: the global batch's data
                epoch, last = trainer.order.epoch, step == config.num_steps
                data = trainer.step(step)
                evaluation = trainer.evaluate() if eval_due(step, config) else None
                # the step's record, trackers and alerts
                report = recorder.record_step(data, evaluation, epoch_ended=trainer.order.epoch != epoch, last=last)
                if data.entropy_dump is not None and world.is_main:
                    entropy_dump.write_dump(run_dir, data.entropy_dump)
                # repeated non-finite updates: write the step and stop, keeping the last good checkpoint
                if recorder.nonfinite_in_a_row >= config.max_consecutive_nonfinite:
                    recorder.write(report)
                    raise UserError(nonfinite_stop_message(recorder.nonfinite_in_a_row, step, run_dir, config),
                                    exit_code=EXIT_GUARD_STOP)
                # checkpoint when due (timed in this step's record), then write the record;
                # a stop is a signal's name or an alert rule with `action: stop`
                stopping = world.agree(stop.requested or alert_stop_request(report))
                pending = None
                if world.is_main and (due(step, config.checkpoint_every, config.num_steps) or last or stopping):
                    pending = prepare(trainer, recorder, run, step)
                recorder.write(report, checkpoint_s=pending.seconds if pending is not None else None)
                if pending is not None:
                    recorder.sinks.flush()  # the step's TensorBoard events are on disk before the checkpoint is
                    recorder.sinks.log_checkpoint(pending.commit({"log_positions": log_positions(run_dir)}), step)
                # stop when asked (Ctrl-C, SIGTERM), every rank at the same step
                if stopping:
                    # Said now, while nothing can go wrong: a second Ctrl-C during the cleanup ends it at once.
                    stopped_by = stopping.removeprefix(ALERT_STOP) if stopping.startswith(ALERT_STOP) else None
                    if stopped_by is not None:
                        # Plain stderr, one line, like report_stop: the command must paste as is.
                        print(f"mlx-grpo: {alert_stop_message(stopped_by, step, run_dir)}", file=sys.stderr,
                              flush=True)
                    else:
                        report_stop(run_dir, step, checkpoint_saved=True)
                    break
        status = "interrupted" if stopping else "finished"
    except KeyboardInterrupt:
        status = "interrupted"
        report_stop(run_dir, step, checkpoint_saved=False)
        raise
    finally:
        final = finish(run, step, status, report)
    return {**final, "status": status, "run_dir": str(run_dir),
            **({"stopped_by_alert": stopped_by} if stopped_by is not None else {})}


ALERT_STOP = "alert:"  # a stop request from an alert rule: this prefix and the rule's name
EXIT_GUARD_STOP = 3  # the exit code of a run a guard stopped: repeated non-finite updates, an alert's `action: stop`


def alert_stop_request(report: StepReport) -> str | None:
    """The stop request of the first alert of the step whose rule has `action: stop`, if any."""
    return next((ALERT_STOP + alert.rule for alert in report.alerts if alert.action == "stop"), None)


def alert_stop_message(rule: str, step: int, run_dir: Path) -> str:
    return (f"alert rule '{rule}' (action: stop) stopped the run after step {step}, checkpoint saved; "
            f"continue with: {resume_command(run_dir)}")


def log_dataset(sinks: Any, config: TrainConfig, base_dir: Path) -> None:
    """The rows of the run's train and held-out splits, to the sinks that keep datasets (W&B's worker
    thread writes and uploads them; the training thread only hands the lists over)."""
    train_rows, heldout_rows = load_datasets(config, base_dir)
    name = "arithmetic" if config.dataset == "arithmetic" else Path(config.dataset).stem
    sinks.log_dataset(f"{name}-seed{config.seed}" if config.dataset == "arithmetic" else name,
                      {"train": train_rows, "heldout": heldout_rows},
                      {"dataset": config.dataset, "eval_dataset": config.eval_dataset,
                       "dataset_format": config.dataset_format, "prompt_field": config.prompt_field,
                       "answer_field": config.answer_field, "train_size": config.train_size,
                       "eval_size": config.eval_size, "seed": config.seed})


def log_final_model(run: Run, step: int) -> None:
    """With `wandb_log_model`, the final policy as a model directory (adapters fused) in `final_model/` of the
    run directory, logged by W&B as a model artifact. A failure here is a warning: the run is already done."""
    from .export import write_fused

    trainer, recorder = run.trainer, run.recorder
    try:
        path = write_fused(run.run_dir / "final_model", trainer.policy.model, trainer.policy.tokenizer,
                           trainer.config.model_id, run.base_dir)
    except (UserError, OSError, ValueError) as err:
        recorder.message(f"warning: the final model was not logged to W&B: {err}", style="yellow")
        return
    recorder.sinks.log_model(path, step)


def due(step: int, every: int, num_steps: int) -> bool:
    """Every `every` steps (0: never) and at the last step."""
    return bool(every) and (step % every == 0 or step == num_steps)


def eval_due(step: int, config: TrainConfig) -> bool:
    """Every eval_every steps, at the end, and at step 1, so a run's held-out curve starts where the model
    started (one update in, at the first warm-up learning rate)."""
    return due(step, config.eval_every, config.num_steps) or (config.eval_every > 0 and step == 1)


def prepare(trainer: Trainer, recorder: RunRecorder, run: Run, step: int) -> PendingCheckpoint:
    """Everything a resume needs, written but not yet in place: it is committed once the step's record
    is written, with the logs' lengths at that moment (a crash in between leaves the previous one)."""
    state = {"order": trainer.order.state(), "run_id": run.run_id,
             "config": scrub_secrets(dataclasses.asdict(trainer.config)), "run_state": recorder.state_dict(),
             **trainer.world.checkpoint_state()}
    return prepare_checkpoint(run.run_dir / "checkpoints", step, trainer.policy.model, trainer.optimizer, state,
                              trainer.adapter_config(), trainer.config.keep_checkpoints)


def finish(run: Run, step: int, status: str, last_step: StepReport | None) -> dict[str, Any]:
    """Close the run: final metrics, the sinks, and on a finished run the report and its last line."""
    recorder, world = run.recorder, run.trainer.world
    if (status == "finished" and world.is_main and run.trainer.config.wandb_log_model
            and "wandb" in recorder.sinks.active):
        log_final_model(run, step)
    last = last_step.record if last_step is not None else run.last_record
    final = recorder.final_metrics(step, status == "finished", run.run_dir if world.is_main else None, last)
    recorder.close(final, status)
    if run.lock is not None:
        run.lock.release()
    if status == "finished" and world.is_main:
        from .telemetry.analysis.report import write_report

        reward_report = write_report(run.run_dir)
        quality = reward_report.quality.score
        recorder.message(f"finished {step} steps in {recorder.elapsed():.0f} s: {reward_report.outcome.headline()}"
                         + (f"; reward functions' quality {quality:.0f}/100" if quality is not None else "")
                         + f" — run directory: {run.run_dir}")
    return final


def nonfinite_stop_message(count: int, step: int, run_dir: Path, config: TrainConfig) -> str:
    return (f"{count} updates in a row had a NaN or Inf loss or gradient (each was skipped: the weights never "
            f"saw them); stopped at step {step}. Continue from the last checkpoint with a lower learning rate: "
            f"{resume_command(run_dir)} --learning-rate {config.learning_rate / 10:g}")
