"""One GRPO step: rollout -> rewards -> advantages -> reference -> update, as data.

`Trainer` holds what a step needs (policy, reference, rewards, data order, optimiser) and runs a
step as phase methods that return data: `draw_prompts`, `rollout`, `score`, `advantages`,
`reference_logprobs`, `update`; dynamic sampling refills a batch from the groups that teach something.
`Trainer.step` strings them together and returns a `StepData` of raw arrays, texts and timings (gathered
over data-parallel ranks). It shapes no record: metric names are step_data.py's, except what a component
measures about itself (the adaptive window, S-GRPO, dynamic sampling's redrawn prompts), and every
completion's row is the recorder's. The run around the steps (directory, sinks, recorder, checkpoints)
is run.py's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten

from . import frozen_prefix
from .checkpoint import load_checkpoint
from .common.errors import UserError
from .config.train_config import TrainConfig
from .data import EncodedPrompt, PromptOrder, encode_prompt, extra_columns, load_datasets
from .distributed import World, init_world
from .evaluate import evaluate
from .extras import entropy_dump
from .extras.adaptive_window import WindowController
from .extras.sgrpo import run_exits
from .models.families import entropy_stride
from .models.policy import Policy, ReferencePolicy, load_policy_for_training, make_reference
from .multiturn.episodes import MultiTurn, final_turn, load_multiturn, reward_columns, trajectory_records
from .multiturn.metrics import trajectory_metrics
from .multiturn.trajectories import generate_trajectories
from .planning import roofline
from .planning.fitting import fit_run, read_model_shape
from .planning.plan import ModelShape
from .rewards.correctness import Check, load_correctness
from .rewards.loading import load_rewards
from .rewards.scoring import RewardFunction, RewardScores, score_completions
from .rollout import Rollout, decode_completion, generate
from .sampling import SamplingSettings
from .tasks.answer_format import extract_answer, extract_reasoning
from .telemetry.alerts.remedy import Remedy
from .telemetry.metrics.names import REDRAWN_PROMPTS
from .telemetry.metrics.step_data import StepData, UpdateStats, eval_record
from .update import (
    TrainBatch,
    UpdateResult,
    build_train_batch,
    checkpoint_blocks,
    make_loss_fn,
    reference_logprobs,
    sampler_logprobs,
    shares_prompts,
    update_policy,
)

# ----------------------------------------------------------------------------- setup pieces

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
    """A rollout's completions as text, their reward scores and correctness (None: the run has no check)."""

    texts: list[str]
    scores: RewardScores
    correct: list[bool] | None

    def take(self, samples: list[int]) -> "Scored":
        return Scored([self.texts[i] for i in samples], self.scores.take(samples),
                      None if self.correct is None else [self.correct[i] for i in samples])

    @staticmethod
    def concat(parts: list["Scored"]) -> "Scored":
        correct = None if parts[0].correct is None else [c for p in parts for c in p.correct]
        return Scored([t for p in parts for t in p.texts], RewardScores.concat([p.scores for p in parts]), correct)


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
class StepPhases:
    """What one step's phases produced: the prompts, their rollout and scores, what the update trained on
    (the rollout, or S-GRPO's exits) and its result, the phases' timers, and the metrics of the step's parts.
    `Trainer.step_data` builds the step's record from it, in one place."""

    prompts: Prompts
    rollout: Rollout
    scored: Scored
    trained: Any  # the rollout, or S-GRPO's serial groups of early exits
    batch: TrainBatch
    group_advantages: mx.array  # the parallel group's advantages (what the record reports)
    advantages: mx.array  # what the update trained with
    update: UpdateResult
    meter: PhaseMeter
    lengths: np.ndarray
    component_metrics: dict[str, float]


def model_shape(config: TrainConfig, base_dir: Path) -> ModelShape | None:
    """The model's shape from its config.json, for the step's FLOPs; None where it cannot be read."""
    try:
        return read_model_shape(config.model_id, base_dir)
    except UserError:
        return None


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
    correctness: Check | None = None  # which completions are correct; None: accuracy cannot be measured
    shape: ModelShape | None = None  # the model's shape, for the step's FLOPs (None: perf/mfu not computed)
    peak_flops_per_s: float = 0.0  # the machine's measured matmul FLOP/s, set by the run (0: no perf/mfu)
    prefix_note: str | None = None  # why frozen-prefix reuse is off though asked for (said at start)
    multiturn: MultiTurn | None = None  # tools or an environment answer the model's turns (None: one turn)

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
        # the rollout keeps the frozen blocks' output; the reference pass and the update start after them
        prefix_note = frozen_prefix.install(policy.model) if config.use_lora and config.frozen_prefix_reuse else None
        reward_fns = load_rewards(config, base_dir)
        correctness = load_correctness(config.correctness, config.dataset, [r.name for r in config.rewards], base_dir)
        if correctness is None and config.adaptive_window.enable:
            raise UserError("adaptive_window sizes the window on correct completions, and this run has no "
                            "correctness check: set 'correctness' (answer, or file.py:function)")
        train_rows, eval_rows = rows if rows is not None else load_datasets(config, base_dir)
        window = (WindowController(config.adaptive_window, config.max_generation_steps, config.seed)
                  if config.adaptive_window.enable else None)
        return cls(config, policy, make_reference(policy.model, config), reward_fns, train_rows,
                   world.shard_rows(eval_rows), world.shard_order(PromptOrder(len(train_rows), config.seed)),
                   make_optimizer(config),
                   loss_and_grad=nn.value_and_grad(policy.model, make_loss_fn(config)),
                   settings=SamplingSettings(config.temperature, config.top_p, config.top_k, config.min_p),
                   world=world, window=window, correctness=correctness, shape=model_shape(config, base_dir),
                   prefix_note=prefix_note, multiturn=load_multiturn(config, base_dir, policy.tokenizer))

    def step_flops(self, batch: TrainBatch, prompt_length: int) -> float:
        """The step's floating-point work at its padded lengths (mlx_grpo/planning/roofline.py), 0 without a shape."""
        if self.shape is None:
            return 0.0
        config = self.config
        training = roofline.Training(config.use_lora, config.lora_rank, config.lora_layers,
                                     batch.prefix is not None and frozen_prefix.first_block(self.policy.model) > 0)
        rows, width = batch.num_sequences, int(batch.mask.shape[1])
        phases = roofline.step_work(self.shape, training, len(batch.prompts) or rows, rows, prompt_length, width,
                                    -(-width // entropy_stride(config.max_generation_steps)), config.num_iterations,
                                    self.reference is not None, shares_prompts(self.policy.model, batch))
        return sum(work.flops for work in phases.values())

    # ------------------------------------------------------------------ phases

    def draw_prompts(self, count: int | None = None) -> Prompts:
        rows = [self.train_rows[i] for i in self.order.next_indices(count or self.config.batch_size)]
        tools = self.multiturn.tools if self.multiturn is not None else None
        encoded = [encode_prompt(self.policy.tokenizer, row["prompt"], self.config, row.get("messages"), tools)
                   for row in rows]
        return Prompts(rows, encoded, self.config.num_generations)

    def rollout(self, prompts: Prompts, key: mx.array, max_tokens: int) -> Rollout:
        """B prompts x G completions of at most `max_tokens` tokens, over a shared-prefill KV cache."""
        self.policy.model.eval()
        model = self.policy.model
        if self.multiturn is not None:
            budgets = dataclasses.replace(self.multiturn.budgets, trajectory_tokens=max_tokens)
            return generate_trajectories(model, self.policy.tokenizer, [e.tokens for e in prompts.encoded],
                                         prompts.rows, prompts.group_size, budgets, self.policy.eos_ids,
                                         self.policy.pad_id, self.settings, key, self.multiturn.make_env,
                                         self.multiturn.tools, capture=frozen_prefix.first_block(model) > 0)
        return generate(model, [e.tokens for e in prompts.encoded], prompts.group_size, max_tokens,
                        self.policy.eos_ids, self.policy.pad_id, self.settings, key,
                        capture=frozen_prefix.first_block(model) > 0, kv_bits=self.config.kv_cache_bits,
                        lookup=self.config.lookup_decoding)

    def score(self, prompts: Prompts, rollout: Rollout) -> Scored:
        policy = self.policy
        texts = [decode_completion(policy.tokenizer, c, policy.eos_ids) for c in rollout.completions]
        rows = prompts.per_completion
        answers = [row["answer"] for row in rows]
        prompt_texts, columns = [row["prompt"] for row in rows], extra_columns(rows)
        answered = texts
        if rollout.trajectories is not None:  # rewards and the check read the model's last turn
            answered = [final_turn(lambda ids: decode_completion(policy.tokenizer, ids, policy.eos_ids), c, t)
                        for c, t in zip(rollout.completions, rollout.trajectories)]
            columns.update(reward_columns(rollout.trajectories, texts))
        scores = score_completions(self.reward_fns, prompt_texts, answered, answers, columns)
        correct = None if self.correctness is None else self.correctness(prompt_texts, answered, answers, **columns)
        return Scored(texts, scores, correct)

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

    def advantages(self, scored: Scored, group_size: int) -> mx.array:
        """Each completion's advantage within its group of `group_size` (the prompts' G)."""
        advantages = self.world.group_advantages(mx.array(scored.scores.total, dtype=mx.float32), group_size,
                                                 self.config.scale_rewards)
        mx.eval(advantages)
        return advantages

    def reference_logprobs(self, batch: TrainBatch) -> mx.array | None:
        """Reference-policy log-probs of the batch, once per rollout (None at beta = 0)."""
        return reference_logprobs(self.reference, batch, self.config)

    def update(self, batch: TrainBatch, advantages: mx.array, ref_logp: mx.array | None,
               sampler_logp: np.ndarray | None = None) -> UpdateResult:
        return update_policy(self.policy.model, self.optimizer, self.loss_and_grad, batch, advantages, ref_logp,
                             self.config, reduce=self.world, sampler_logp=sampler_logp)

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
            if rollout.trajectories is not None:
                component_metrics.update(trajectory_metrics(rollout.trajectories, rollout.model_mask))
            if config.dynamic_sampling:
                drawn, redrawn = self.refill(Drawn(prompts, rollout, scored), key, rollout_budget, meter)
                prompts, rollout, scored = drawn.prompts, drawn.rollout, drawn.scored
                component_metrics[REDRAWN_PROMPTS] = float(redrawn)
            with meter.phase("advantage"):
                advantages = group_advantages = self.advantages(scored, prompts.group_size)
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
                # the sampler's log-probs of the trained tokens (S-GRPO trains on exits it did not sample)
                sampled = sampler_logprobs(rollout.logprobs, batch.mask.shape[1]) if trained is rollout else None
                update = self.update(batch, advantages, ref_logp, sampled)
        component_metrics.update(update.sampling)
        lengths = np.array([len(c) for c in rollout.completions], dtype=float)
        if plan is not None:
            component_metrics.update(self.window.update(plan, lengths, scored.correct))
        if config.sgrpo.enable:
            component_metrics.update(trained.metrics())
        return self.world.gather(self.step_data(step, StepPhases(
            prompts, rollout, scored, trained, batch, group_advantages, advantages, update, meter, lengths,
            component_metrics)))

    def step_data(self, step: int, phases: StepPhases) -> StepData:
        """The step's record from its phases' results: a new metric is computed where its phase runs and
        reaches the record here (and its row in the metric catalogue)."""
        config, policy = self.config, self.policy
        prompts, rollout, scored, trained, batch, update = (phases.prompts, phases.rollout, phases.scored,
                                                            phases.trained, phases.batch, phases.update)
        return StepData(
            step=step, group_size=prompts.group_size,
            reward_names=scored.scores.names, reward_weights=[f.weight for f in self.reward_fns],
            scores=scored.scores.per_function, total=scored.scores.total,
            advantages=np.array(phases.group_advantages),
            prompt_lengths=np.array([len(e.tokens) for e in prompts.encoded for _ in range(prompts.group_size)]),
            prompt_truncated=np.array([e.truncated for e in prompts.encoded for _ in range(prompts.group_size)]),
            lengths=phases.lengths, truncated=np.array(rollout.truncated, dtype=bool),
            correct=None if scored.correct is None else np.array(scored.correct, dtype=bool),
            difficulty=[row.get("difficulty") for row in prompts.per_completion],
            trained_tokens=batch.num_tokens,
            update=UpdateStats(update.loss, update.grad_norm, update.stats, update.skipped,
                               self.optimizer.learning_rate.item(), config.beta, self.reference is not None),
            seconds={**phases.meter.seconds, "update": update.seconds}, peak_memory=phases.meter.peaks,
            component_metrics=phases.component_metrics,
            update_advantages=np.array(phases.advantages) if config.sgrpo.enable else None,
            new_errors=scored.scores.new_errors,
            texts=scored.texts, reasoning=[extract_reasoning(t) for t in scored.texts],
            predicted=[extract_answer(t) for t in scored.texts], prompt_texts=[row["prompt"] for row in prompts.rows],
            answers=[row["answer"] for row in prompts.rows],
            entropy_dump=(entropy_dump.build_dump(step, update.token_stats["token_entropy"],
                                                  update.token_stats["token_varentropy"], trained.prompts,
                                                  trained.completions)
                          if update.token_stats and step % config.entropy_logging.every == 0 else None),
            flops=self.step_flops(batch, max(len(e.tokens) for e in prompts.encoded)),
            trajectories=None if rollout.trajectories is None else trajectory_records(
                lambda ids: decode_completion(policy.tokenizer, ids, policy.eos_ids), rollout.completions,
                rollout.trajectories),
            peak_flops_per_s=self.peak_flops_per_s,
        )

    def evaluate(self, peaks: dict[str, float] | None = None) -> dict[str, float] | None:
        """Greedy held-out accuracy over every rank's share of the held-out rows (None without a correctness
        check: there is nothing to measure). They are decoded `eval_batch_size` rows at a time (the memory
        plan's choice; the step's B x G without one), and the phase's peak memory goes into `peaks` ("eval") beside
        the step's phases. The buffers MLX cached for the evaluation are released after it: on a Mac they
        would otherwise stay wired until the run ends."""
        if self.correctness is None:
            return None
        start = time.perf_counter()
        meter = PhaseMeter()
        with meter.phase("eval", memory=True):
            result = evaluate(self.policy.model, self.policy.tokenizer, self.eval_rows, self.config,
                              self.policy.eos_ids, self.policy.pad_id, check=self.correctness,
                              batch_size=(self.config.eval_batch_size if isinstance(self.config.eval_batch_size, int)
                                          else self.config.batch_size * self.config.num_generations),
                              samples=self.config.eval_samples, settings=self.settings, multiturn=self.multiturn)
        mx.clear_cache()
        if peaks is not None:
            peaks.update(meter.peaks)
        correct, levels, sampled = self.world.gather_lists(result.correct, result.levels, result.sampled)
        return eval_record(correct, levels, self.world.slowest(time.perf_counter() - start), sampled)

    def roll_back(self, checkpoint: Path, remedy: Remedy) -> None:
        """Restore `checkpoint`'s weights and optimiser state and go on with the learning rate and beta
        multiplied by the remedy's factors (the optimiser and the loss are rebuilt around the new values)."""
        self.config = remedy.applied(self.config)
        self.optimizer = make_optimizer(self.config)
        self.loss_and_grad = nn.value_and_grad(self.policy.model, make_loss_fn(self.config))
        load_checkpoint(checkpoint, self.policy.model, self.optimizer)

    def resident_bytes(self) -> int:
        """What stays in memory all run: the weights in the run's dtype, a frozen reference copy, and AdamW's
        two moments per trainable value. Counted from the arrays' shapes: the moments are built at the first
        update and a dtype cast is still lazy here, so the allocator's counter would read low."""
        def nbytes(tree: Any) -> int:
            return sum(v.nbytes for _, v in tree_flatten(tree))

        model, reference = self.policy.model, self.reference
        copy = nbytes(reference.model.parameters()) if reference is not None and not reference.uses_adapters_off else 0
        return nbytes(model.parameters()) + copy + 2 * nbytes(model.trainable_parameters())

    def adapter_config(self) -> dict | None:
        c = self.config
        if not c.use_lora:
            return None
        num_layers = len(self.policy.model.layers) if c.lora_layers < 0 else c.lora_layers
        return {"fine_tune_type": "dora" if c.use_dora else "lora", "num_layers": num_layers,
                "lora_parameters": {"rank": c.lora_rank, "scale": c.lora_alpha / c.lora_rank,
                                    "dropout": c.lora_dropout, "keys": c.lora_keys}}

