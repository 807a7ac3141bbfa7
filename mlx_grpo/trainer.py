"""The GRPO training loop: rollout -> rewards -> advantages -> update -> metric record -> sinks.

Read `train()` top to bottom. One step is `train_step()`; the phases it runs are the
small functions above it. Everything the loop measures goes out as one flat record
of canonical metric names (see METRICS.md).
"""

from __future__ import annotations

import dataclasses
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np

from . import __version__
from .checkpoint import load_checkpoint, save_checkpoint
from .config import TrainConfig, config_to_dict, load_config
from .console import TrainingConsole
from .data import PromptOrder, encode_prompt, extra_columns, load_datasets
from .distributed import World, init_world
from .errors import UserError
from .evaluate import evaluate
from .machine import blas_in_use
from .extras import entropy_dump
from .extras.adaptive_window import WindowController
from .extras.sgrpo import run_exits
from .models import ReferencePolicy, apply_adapters, count_parameters, load_policy, make_reference
from .rewards import RewardFunction, is_correct, load_reward_functions, score_completions
from .resume import (config_for_resume, last_record, log_positions, resumable_checkpoint, resume_command,
                     truncate_logs)
from .rollout import SamplingSettings, decode_completion, generate
from .run_state import RunState
from .signals import EXIT_INTERRUPTED, StopRequest, report_stop
from .step_metrics import rollout_metrics
from .telemetry.alert_config import load_alert_rules, rules_from_config
from .telemetry.alert_console import format_alert
from .telemetry.alerts import AlertEngine
from .telemetry.reward_stats import RewardTracker, ThroughputTracker, reward_metrics
from .telemetry.rundir import scrub_secrets
from .telemetry.sinks import SinkSet, WandbOptions, make_sinks, wandb_enabled
from .telemetry.system import SystemSampler
from .update import build_train_batch, make_loss_fn, reference_logprobs, update_policy


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
    warmup = int(round(config.warmup_fraction * config.num_steps))
    if config.lr_schedule == "cosine":
        main = optim.cosine_decay(config.learning_rate, max(1, config.num_steps - warmup))
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


def accel_memory() -> dict[str, float | None]:
    info = mx.device_info()
    return {
        "active": mx.get_active_memory(),
        "peak": mx.get_peak_memory(),
        "cache": mx.get_cache_memory(),
        "limit": info.get("max_recommended_working_set_size"),
    }


def describe_device(config: TrainConfig) -> dict[str, Any]:
    info = mx.device_info()
    device = mx.default_device()
    return {
        "backend": "metal" if device.type == mx.gpu and mx.metal.is_available() else "cpu",
        "device": str(device),
        "device_name": info.get("device_name", platform.processor()),
        "architecture": info.get("architecture", platform.machine()),
        "memory_size_gb": (info["memory_size"] / 2**30) if "memory_size" in info else None,
        "blas": blas_in_use().name,
        "dtype": config.dtype,
        "platform": platform.platform(),
        "num_tpu_cores": 0,  # seed-document config field: MLX has no TPUs
        "has_tpu": False,
    }


def versions() -> dict[str, str]:
    import mlx_lm

    return {"mlx_grpo": __version__, "mlx": mx.__version__, "mlx_lm": mlx_lm.__version__,
            "python": platform.python_version()}


# ----------------------------------------------------------------------------- one step

@dataclass
class StepResult:
    metrics: dict[str, float]
    samples: list[dict]
    rewards_total: np.ndarray
    scores: np.ndarray
    advantages: np.ndarray
    lengths: np.ndarray
    new_errors: list[str]
    skipped_updates: int
    entropy_dump: dict[str, np.ndarray] | None = None  # arrays for entropy/step_<N>.npz, when due


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
    def build(cls, config: TrainConfig, base_dir: Path) -> "Trainer":
        mx.random.seed(config.seed)
        world = init_world()
        policy = load_policy_for_training(config, base_dir)
        world.broadcast_parameters(policy.model)
        reward_fns = load_rewards(config, base_dir)
        train_rows, eval_rows = load_datasets(config, base_dir)
        trainer = cls(config, policy, make_reference(policy.model, config), reward_fns, train_rows, eval_rows,
                      PromptOrder(len(train_rows), config.seed), make_optimizer(config))
        trainer.world = world
        trainer.order, trainer.eval_rows = world.shard_order(trainer.order), world.shard_rows(eval_rows)
        trainer.loss_and_grad = world.wrap_loss_and_grad(nn.value_and_grad(policy.model, make_loss_fn(config)),
                                                         config.loss_type)
        trainer.settings = SamplingSettings(config.temperature, config.top_p, config.top_k, config.min_p)
        if config.adaptive_window.enable:
            trainer.window = WindowController(config.adaptive_window, config.max_generation_steps, config.seed)
        return trainer

    def step(self, step: int) -> StepResult:
        config, policy = self.config, self.policy
        G = config.num_generations
        t_step = time.perf_counter()
        rows = [self.train_rows[i] for i in self.order.next_indices(config.batch_size)]
        encoded = [encode_prompt(policy.tokenizer, row["prompt"], config) for row in rows]

        # rollout: B prompts x G completions over a shared-prefill KV cache
        policy.model.eval()
        plan = self.window.plan(step) if self.window is not None else None
        budget = plan.window if plan is not None else config.max_generation_steps
        rollout = generate(policy.model, [e.tokens for e in encoded], G, budget,
                           policy.eos_ids, policy.pad_id, self.settings,
                           self.world.sample_key(step_key(config.seed, step)))
        texts = [decode_completion(policy.tokenizer, c, policy.eos_ids) for c in rollout.completions]

        # rewards
        t_reward = time.perf_counter()
        group_rows = [row for row in rows for _ in range(G)]
        prompts = [row["prompt"] for row in group_rows]
        answers = [row["answer"] for row in group_rows]
        scores = score_completions(self.reward_fns, prompts, texts, answers, extra_columns(group_rows))
        reward_s = time.perf_counter() - t_reward

        # advantages
        t_adv = time.perf_counter()
        advantages = self.world.group_advantages(mx.array(scores.total, dtype=mx.float32), G, config.scale_rewards)
        sample_adv = advantages  # samples.jsonl shows each completion's own group advantage
        trained = rollout
        if config.sgrpo.enable:  # the serial groups of early exits replace the parallel group in the update
            trained = run_exits(policy.model, policy.tokenizer, rollout, answers, num_exits=config.sgrpo.num_exits,
                                decay=config.sgrpo.decay, max_answer_tokens=config.sgrpo.max_answer_tokens,
                                scale_rewards=config.scale_rewards, settings=self.settings, eos_ids=policy.eos_ids,
                                pad_id=policy.pad_id,
                                key=mx.random.split(self.world.sample_key(step_key(config.seed, step)))[1])
            advantages = trained.advantages
        batch = build_train_batch(trained, policy.pad_id)
        mx.eval(advantages)
        advantage_s = time.perf_counter() - t_adv

        # reference log-probs, once per rollout (beta = 0 computes none)
        t_ref = time.perf_counter()
        ref_logp = reference_logprobs(self.reference, batch, config.temperature)
        ref_s = time.perf_counter() - t_ref

        update = update_policy(policy.model, self.optimizer, self.loss_and_grad, batch, advantages, ref_logp, config)
        step_s = time.perf_counter() - t_step

        correct = [is_correct(t, a) for t, a in zip(texts, answers)]
        adv = np.array(advantages)
        lengths = np.array([len(c) for c in rollout.completions], dtype=float)
        n_tokens = batch.num_tokens
        prompt_tokens = sum(len(p) for p in rollout.prompts)
        metrics: dict[str, float] = {
            "policy/loss": update.loss,
            "policy/grad_norm": update.grad_norm,
            "policy/lr": self.optimizer.learning_rate.item(),
            "policy/kl_coef": config.beta,
            "policy/skipped_updates": float(update.skipped),
            **{f"policy/{k}": v for k, v in update.stats.items()},
            "advantages/mean": float(adv.mean()),
            "advantages/std": float(adv.std()),
            "advantages/min": float(adv.min()),
            "advantages/max": float(adv.max()),
            **reward_metrics(scores.per_function, scores.names, [f.weight for f in self.reward_fns],
                             scores.total, G),
            **rollout_metrics([len(e.tokens) for e in encoded for _ in range(G)],
                              [e.truncated for e in encoded for _ in range(G)],
                              lengths, rollout.truncated, correct, [row.get("difficulty") for row in group_rows]),
            "timing/rollout_s": rollout.seconds,
            "timing/reward_s": reward_s,
            "timing/advantage_s": advantage_s,
            "timing/ref_s": ref_s,
            "timing/update_s": update.seconds,
            "timing/step_s": step_s,
            "timing/gen_ms_per_token": 1000 * rollout.seconds / max(1, rollout.num_completion_tokens),
            "timing/update_ms_per_token": 1000 * update.seconds / max(1, n_tokens),
            "timing/ref_ms_per_token": 1000 * ref_s / max(1, n_tokens),
            "timing/reward_ms_per_token": 1000 * reward_s / max(1, n_tokens),
            "timing/advantage_ms_per_token": 1000 * advantage_s / max(1, n_tokens),
            "timing/step_ms_per_token": 1000 * step_s / max(1, n_tokens),
            "throughput/step_tokens_per_s": (n_tokens + prompt_tokens) / step_s,
        }
        if self.reference is None:
            for name in ("policy/kl", "policy/kl_penalty"):
                metrics.pop(name, None)  # no reference policy: there is no KL to report
        if plan is not None:
            metrics.update(self.window.update(plan, lengths, correct))
        if config.sgrpo.enable:
            metrics.update(trained.metrics())
        dump = None
        if update.token_stats and step % config.entropy_logging.every == 0:
            dump = entropy_dump.build_dump(step, update.token_stats["token_entropy"],
                                           update.token_stats["token_varentropy"], trained.prompts,
                                           trained.completions)
        for fn in self.reward_fns:
            if hasattr(fn.fn, "step_metrics"):
                metrics.update(fn.fn.step_metrics(step))
        samples = self._samples(group_rows, texts, scores, np.array(sample_adv), lengths, rollout.truncated, correct)
        return StepResult(metrics, samples, scores.total, scores.per_function, adv, lengths, scores.new_errors,
                          update.skipped, dump)

    def _samples(self, rows, texts, scores, adv, lengths, truncated, correct) -> list[dict]:
        """One completion from each of the first few groups, for samples.jsonl."""
        picks = [g * self.config.num_generations for g in range(min(self.config.samples_per_step,
                                                                    self.config.batch_size))]
        out = []
        for i in picks:
            per_fn = {name: (None if np.isnan(scores.per_function[j, i]) else float(scores.per_function[j, i]))
                      for j, name in enumerate(scores.names)}
            out.append({"prompt": rows[i]["prompt"], "completion": texts[i], "answer": rows[i]["answer"],
                        "rewards": per_fn, "total": float(scores.total[i]), "advantage": float(adv[i]),
                        "length": int(lengths[i]), "truncated": bool(truncated[i]), "correct": bool(correct[i])})
        return out

    def evaluate(self) -> dict[str, float]:
        t = time.perf_counter()
        result = evaluate(self.policy.model, self.policy.tokenizer, self.eval_rows, self.config,
                          self.policy.eos_ids, self.policy.pad_id)
        return self.world.reduce_metrics({"eval/accuracy": result.accuracy, "eval/num_samples": float(result.num_rows),
                                          **result.by_difficulty, "timing/eval_s": time.perf_counter() - t})

    def adapter_config(self) -> dict | None:
        c = self.config
        if not c.use_lora:
            return None
        num_layers = len(self.policy.model.layers) if c.lora_layers < 0 else c.lora_layers
        return {"fine_tune_type": "dora" if c.use_dora else "lora", "num_layers": num_layers,
                "lora_parameters": {"rank": c.lora_rank, "scale": c.lora_alpha / c.lora_rank,
                                    "dropout": c.lora_dropout, "keys": c.lora_keys}}


# ----------------------------------------------------------------------------- the run

def alert_rules(config: TrainConfig, base_dir: Path) -> list:
    if config.alerts_file is not None:
        path = Path(config.alerts_file)
        return load_alert_rules(path if path.is_absolute() else base_dir / path, defaults=config.enable_alerts)
    return rules_from_config({}, defaults=config.enable_alerts)


def new_run_dir(config: TrainConfig, base_dir: Path) -> Path:
    root = Path(config.monitoring_dir)
    root = root if root.is_absolute() else base_dir / root if not Path.cwd() == base_dir else root
    name = config.run_name or time.strftime("grpo-%Y%m%d-%H%M%S")
    run_dir = root / name
    suffix = 1
    while run_dir.exists():
        suffix += 1
        run_dir = root / f"{name}-{suffix}"
    return run_dir


def train_from_cli(config_path: str | None, overrides: dict, resume: str | None = None) -> int:
    if resume is not None:
        if config_path is not None:
            raise UserError(f"--resume {resume}: the run keeps its own config; give changes as flags "
                            f"(e.g. --num-steps 500), not a config file ({config_path})")
        run_dir = Path(resume)
        config, base_dir = config_for_resume(run_dir, overrides)
        result = train(config, base_dir, resume_dir=run_dir)
    else:
        config = load_config(config_path, overrides)
        base_dir = Path(config_path).resolve().parent if config_path else Path.cwd()
        result = train(config, base_dir)
    return {"finished": 0, "interrupted": EXIT_INTERRUPTED}.get(result.get("status"), 1)


def train(config: TrainConfig, base_dir: Path, resume_dir: Path | None = None) -> dict[str, Any]:
    """Run GRPO; returns the final metrics plus the run directory and status."""
    checkpoint = resumable_checkpoint(resume_dir, config.num_steps) if resume_dir is not None else None
    rules = alert_rules(config, base_dir)  # before the model loads: a mistake in the file shows at once
    trainer = Trainer.build(config, base_dir)
    run_dir = Path(trainer.world.from_main(str(resume_dir or new_run_dir(config, base_dir))))
    start_step = 0
    resume_state: dict[str, Any] = {}
    if resume_dir is not None:
        if checkpoint is not None:
            resume_state = load_checkpoint(checkpoint, trainer.policy.model, trainer.optimizer)
            trainer.world.check_resume(resume_state, checkpoint)
            start_step = resume_state["step"]
            trainer.order.load_state(resume_state["order"])
        if trainer.world.is_main:
            truncate_logs(run_dir, resume_state.get("log_positions", {}))

    wandb_options = None
    if wandb_enabled(config.wandb):
        wandb_options = WandbOptions(project=config.wandb_project, entity=config.wandb_entity,
                                     name=config.wandb_run_name or run_dir.name, tags=config.wandb_tags,
                                     notes=config.wandb_notes, log_checkpoints=config.wandb_log_checkpoints)
    console = TrainingConsole(config.num_steps, start_step)
    console.console.quiet = not trainer.world.is_main  # rank 0 speaks for the run
    sinks: SinkSet = trainer.world.sinks(lambda: make_sinks(
        run_dir, tensorboard=config.tensorboard, tensorboard_dir=config.tensorboard_dir, wandb=wandb_options,
        warn=lambda m: console.message(m, style="yellow"),
        purge_step=start_step + 1 if resume_dir is not None else None), run_dir)
    total_params, trainable_params = count_parameters(trainer.policy.model)
    run_config = {**config_to_dict(config), "base_dir": str(base_dir)}
    device = {**describe_device(config), **trainer.world.describe()}
    sinks.start(run_dir.name, run_config, versions(), device, config.num_steps,
                run_id=resume_state.get("run_id"), resume_step=start_step if resume_dir is not None else None)
    run_id = sinks.rundir.info["run_id"]
    console.message(f"run {run_dir}  model {config.model_id}: {total_params:,} parameters, "
                    f"{trainable_params:,} trainable")
    for fn in trainer.reward_fns:
        if hasattr(fn.fn, "rubric"):
            console.message(fn.fn.rubric.describe())

    engine = AlertEngine(rules)
    tracker = RewardTracker([f.name for f in trainer.reward_fns], hist_every=config.histogram_every)
    gen_tp = ThroughputTracker("throughput/gen_tokens_per_s")
    bp_tp = ThroughputTracker("throughput/backprop_tokens_per_s")
    run_state = RunState(tracker, [gen_tp, bp_tp], engine, trainer.reward_fns,
                         components={"adaptive_window": trainer.window} if trainer.window is not None else {})
    elapsed_before = run_state.load_state_dict(resume_state["run_state"]) if "run_state" in resume_state else 0.0
    sampler = SystemSampler(accel_memory=accel_memory).start()
    run_start = time.perf_counter() - elapsed_before
    status = "failed"
    checkpoint_s: float | None = None  # reported in the record after the checkpoint
    last_epoch = trainer.order.epoch
    step = start_step
    metrics: dict[str, Any] = last_record(run_dir) if resume_dir is not None else {}
    stop = StopRequest()
    stopping: str | None = None  # a stop request, agreed by every rank so all stop at the same step
    try:
        with console, stop:
            for step in range(start_step + 1, config.num_steps + 1):
                result = trainer.world.reduce_step(trainer.step(step))
                metrics = result.metrics
                if result.entropy_dump is not None and trainer.world.is_main:
                    entropy_dump.write_dump(run_dir, result.entropy_dump)
                for message in result.new_errors:
                    console.message(f"warning: {message}", style="yellow")
                metrics.update(gen_tp.update(metrics["tokens/completion_total"], metrics["timing/rollout_s"]))
                metrics.update(bp_tp.update(metrics["tokens/completion_total"] * config.num_iterations,
                                            metrics["timing/update_s"]))
                metrics.update(tracker.update(step, result.scores, result.rewards_total, loss=metrics["policy/loss"],
                                              extra={"advantages/hist": result.advantages,
                                                     "completions/length_hist": result.lengths}))
                if trainer.order.epoch != last_epoch:
                    metrics.update(tracker.end_epoch())
                    for fn in trainer.reward_fns:
                        if hasattr(fn.fn, "end_epoch"):
                            metrics.update(fn.fn.end_epoch())
                    last_epoch = trainer.order.epoch
                if config.eval_every and (step % config.eval_every == 0 or step == config.num_steps):
                    metrics.update(trainer.evaluate())
                metrics.update(trainer.world.reduce_metrics(sampler.snapshot()))
                if checkpoint_s is not None:
                    metrics["timing/checkpoint_s"], checkpoint_s = checkpoint_s, None
                metrics["timing/elapsed_s"] = time.perf_counter() - run_start
                run_state.nonfinite_in_a_row = run_state.nonfinite_in_a_row + 1 if result.skipped_updates else 0

                if step % config.log_every == 0 or step == config.num_steps:
                    sinks.write(step, metrics, tracker.histograms(step), rewards=result.rewards_total)
                    sinks.write_samples(step, result.samples)
                alerts = engine.check({"step": step, "time": time.time(), **metrics})
                for fn in trainer.reward_fns:
                    if hasattr(fn.fn, "take_alerts"):
                        alerts.extend(fn.fn.take_alerts())
                for alert in alerts:
                    sinks.write_alert(alert)
                    console.message(format_alert(alert) if hasattr(alert, "level") else str(alert))
                console.step(step, metrics, every=max(1, config.num_steps // 20))

                if run_state.nonfinite_in_a_row >= config.max_consecutive_nonfinite:
                    raise UserError(nonfinite_stop_message(run_state.nonfinite_in_a_row, step, run_dir, config),
                                    exit_code=3)
                stopping = trainer.world.agree(stop.requested)
                if trainer.world.is_main and ((config.checkpoint_every and step % config.checkpoint_every == 0)
                                              or step == config.num_steps or stopping):
                    checkpoint_s = _checkpoint(trainer, sinks, run_dir, step, run_id, run_state,
                                               time.perf_counter() - run_start)
                if stopping:
                    # Said now, while nothing can go wrong: a second Ctrl-C during the cleanup below ends it at once.
                    report_stop(run_dir, step, checkpoint_saved=True)
                    break
        status = "interrupted" if stopping else "finished"
    except KeyboardInterrupt:
        status = "interrupted"
        report_stop(run_dir, step, checkpoint_saved=False)
        raise
    finally:
        sampler.stop()
        final = {**tracker.final_metrics(), "final/steps": float(step)}
        if status == "finished":
            final.update({k: v for k, v in metrics.items() if k.startswith("eval/")} if step else {})
            for fn in trainer.reward_fns:
                summary = getattr(fn.fn, "summary", None)
                if summary is not None:
                    if trainer.world.is_main:
                        summary.write(run_dir)
                    final.update(summary.final_metrics())
        sinks.write_final(final)
        sinks.close(status)
    if status == "finished" and trainer.world.is_main:
        from .telemetry.report import write_report

        report = write_report(run_dir)
        acc = final.get("eval/accuracy")
        quality = report.quality.score
        console.message(f"finished {step} steps in {time.perf_counter() - run_start:.0f} s"
                        + (f", held-out accuracy {acc:.1%}" if acc is not None else "")
                        + (f", reward quality {quality:.0f}/100" if quality is not None else "")
                        + f" — run directory: {run_dir}")
    return {**final, "status": status, "run_dir": str(run_dir)}


def nonfinite_stop_message(count: int, step: int, run_dir: Path, config: TrainConfig) -> str:
    return (f"{count} updates in a row had a NaN or Inf loss or gradient (each was skipped: the weights never "
            f"saw them); stopped at step {step}. Continue from the last checkpoint with a lower learning rate: "
            f"{resume_command(run_dir)} --learning-rate {config.learning_rate / 10:g}")


def _checkpoint(trainer: Trainer, sinks: SinkSet, run_dir: Path, step: int, run_id: str, run_state: RunState,
                elapsed_s: float) -> float:
    """Save everything a resume needs; returns the seconds it took."""
    t = time.perf_counter()
    state = {"order": trainer.order.state(), "log_positions": log_positions(run_dir), "run_id": run_id,
             "config": scrub_secrets(dataclasses.asdict(trainer.config)), "run_state": run_state.state_dict(elapsed_s),
             **trainer.world.checkpoint_state()}
    path = save_checkpoint(run_dir / "checkpoints", step, trainer.policy.model, trainer.optimizer, state,
                           trainer.adapter_config(), trainer.config.keep_checkpoints)
    sinks.log_checkpoint(path, step)
    return time.perf_counter() - t
