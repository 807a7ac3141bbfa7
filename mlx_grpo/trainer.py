"""The GRPO training loop: rollout -> rewards -> advantages -> update -> metric record.

Read `train()` top to bottom; each phase is a small function below it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np

from . import grpo
from .config import TrainConfig, load_config
from .data import PromptOrder, encode_prompt, extra_columns, load_datasets
from .errors import UserError
from .models import apply_adapters, count_parameters, load_policy, make_reference
from .rewards import is_correct, load_reward_functions, score_completions
from .rollout import Rollout, SamplingSettings, decode_completion, generate
from .step_metrics import rollout_metrics


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


def step_key(seed: int, step: int) -> mx.array:
    """The sampling key of one step: a pure function of (seed, step), so resume replays it exactly."""
    return mx.random.key(seed * 1_000_003 + step)


# ----------------------------------------------------------------------------- batches

@dataclass
class TrainBatch:
    """Right-padded prompt+completion sequences and where each completion token sits."""

    inputs: mx.array  # [N, S-1]
    targets: mx.array  # [N, S-1]
    positions: mx.array  # [N, T] index into the S-1 axis of completion token t
    mask: mx.array  # [N, T] 1 for real completion tokens

    @property
    def num_completion_tokens(self) -> int:
        return int(self.mask.sum().item())


def build_train_batch(rollout: Rollout, pad_id: int) -> TrainBatch:
    """Prompt then completion, padded on the right: a causal mask is then exactly the rollout's view."""
    seqs = [p + c for p, c in zip(rollout.prompts, rollout.completions)]
    width = max(len(s) for s in seqs)
    tokens = np.full((len(seqs), width), pad_id, dtype=np.int32)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = s
    t_max = max(1, max(len(c) for c in rollout.completions))
    positions = np.zeros((len(seqs), t_max), dtype=np.int32)
    mask = np.zeros((len(seqs), t_max), dtype=np.float32)
    for i, (p, c) in enumerate(zip(rollout.prompts, rollout.completions)):
        n = len(c)
        # the logit at position k predicts token k+1, so completion token t comes from len(p)-1+t
        positions[i, :n] = np.arange(len(p) - 1, len(p) - 1 + n)
        mask[i, :n] = 1.0
    return TrainBatch(mx.array(tokens[:, :-1]), mx.array(tokens[:, 1:]), mx.array(positions), mx.array(mask))


def completion_logprobs(model: nn.Module, batch: TrainBatch, temperature: float) -> tuple[mx.array, mx.array]:
    """(log-probs [N, T], logits at completion positions [N, T, V]) under `model`."""
    logits = model(batch.inputs).astype(mx.float32) / temperature
    logits = mx.take_along_axis(logits, batch.positions[:, :, None], axis=1)
    targets = mx.take_along_axis(batch.targets, batch.positions, axis=1)
    return grpo.token_logprobs(logits, targets), logits


# ----------------------------------------------------------------------------- the update

def make_loss_fn(config: TrainConfig):
    temperature = config.temperature

    def loss_fn(model, batch: TrainBatch, advantages, old_logp, ref_logp):
        logp, logits = completion_logprobs(model, batch, temperature)
        loss, stats = grpo.grpo_loss(
            logp, old_logp, ref_logp, advantages, batch.mask,
            beta=config.beta, epsilon=config.epsilon, epsilon_high=config.epsilon_high,
            loss_type=config.loss_type, importance_level=config.importance_sampling_level,
            max_completion_length=config.max_generation_steps,
        )
        stats["entropy"] = grpo.masked_mean(mx.stop_gradient(grpo.token_entropy(logits)), batch.mask)
        return loss, (stats, mx.stop_gradient(logp))

    return loss_fn


def clip_by_global_norm(grads: Any, max_norm: float) -> tuple[Any, mx.array]:
    if max_norm > 0:
        return optim.clip_grad_norm(grads, max_norm)
    leaves = [g for _, g in __import__("mlx.utils", fromlist=["tree_flatten"]).tree_flatten(grads)]
    return grads, mx.sqrt(sum(mx.sum(mx.square(g)) for g in leaves))


# ----------------------------------------------------------------------------- training

def train_from_cli(config_path: str | None, overrides: dict, resume: str | None = None) -> int:
    config = load_config(config_path, overrides)
    base_dir = Path(config_path).resolve().parent if config_path else Path.cwd()
    train(config, base_dir)
    return 0


def train(config: TrainConfig, base_dir: Path) -> dict[str, float]:
    mx.random.seed(config.seed)
    policy = load_policy_for_training(config, base_dir)
    model, tokenizer = policy.model, policy.tokenizer
    reference = make_reference(model, config)
    reward_fns = load_reward_functions([(r.name, r.weight) for r in config.rewards], base_dir)
    train_rows, eval_rows = load_datasets(config, base_dir)
    order = PromptOrder(len(train_rows), config.seed)
    optimizer = make_optimizer(config)
    loss_and_grad = nn.value_and_grad(model, make_loss_fn(config))
    settings = SamplingSettings(config.temperature, config.top_p, config.top_k, config.min_p)
    total_params, trainable_params = count_parameters(model)
    print(f"model {config.model_id}: {total_params:,} parameters, {trainable_params:,} trainable")

    record: dict[str, float] = {}
    for step in range(1, config.num_steps + 1):
        t_step = time.perf_counter()
        rows = [train_rows[i] for i in order.next_indices(config.batch_size)]
        encoded = [encode_prompt(tokenizer, row["prompt"], config) for row in rows]

        # rollout
        model.eval()
        rollout = generate(model, [e.tokens for e in encoded], config.num_generations,
                           config.max_generation_steps, policy.eos_ids, policy.pad_id, settings,
                           step_key(config.seed, step))
        texts = [decode_completion(tokenizer, c, policy.eos_ids) for c in rollout.completions]

        # rewards and advantages
        t_reward = time.perf_counter()
        G = config.num_generations
        group_rows = [row for row in rows for _ in range(G)]
        prompts = [row["prompt"] for row in group_rows]
        answers = [row["answer"] for row in group_rows]
        scores = score_completions(reward_fns, prompts, texts, answers, extra_columns(group_rows))
        for message in scores.new_errors:
            print(f"warning: {message}")
        advantages = grpo.group_advantages(mx.array(scores.total, dtype=mx.float32), G, config.scale_rewards)
        reward_s = time.perf_counter() - t_reward

        # reference log-probs, once per rollout
        batch = build_train_batch(rollout, policy.pad_id)
        t_ref = time.perf_counter()
        ref_logp = None
        if reference is not None:
            with reference.active() as ref_model:
                ref_logp = mx.stop_gradient(completion_logprobs(ref_model, batch, config.temperature)[0])
                mx.eval(ref_logp)
        ref_s = time.perf_counter() - t_ref

        # update
        model.train()
        t_update = time.perf_counter()
        old_logp = None
        for _ in range(config.num_iterations):
            (loss, (stats, logp)), grads = loss_and_grad(model, batch, advantages, old_logp, ref_logp)
            grads, grad_norm = clip_by_global_norm(grads, config.max_grad_norm)
            mx.eval(loss, grad_norm, stats)
            if old_logp is None:
                old_logp = logp
            if math.isfinite(loss.item()) and math.isfinite(grad_norm.item()):
                optimizer.update(model, grads)
                mx.eval(model.parameters(), optimizer.state)
        update_s = time.perf_counter() - t_update
        step_s = time.perf_counter() - t_step

        correct = [is_correct(t, a) for t, a in zip(texts, answers)]
        n_tokens = batch.num_completion_tokens
        record = {
            "rewards/total/mean": float(scores.total.mean()),
            "policy/loss": loss.item(),
            "policy/grad_norm": grad_norm.item(),
            **{f"policy/{k}": v.item() for k, v in stats.items()},
            **rollout_metrics([len(e.tokens) for e in encoded for _ in range(G)],
                              [e.truncated for e in encoded for _ in range(G)],
                              [len(c) for c in rollout.completions], rollout.truncated, correct,
                              [row.get("difficulty") for row in group_rows]),
            "throughput/gen_tokens_per_s": rollout.num_completion_tokens / rollout.seconds,
            "throughput/backprop_tokens_per_s": n_tokens * config.num_iterations / update_s,
            "timing/rollout_s": rollout.seconds,
            "timing/reward_s": reward_s,
            "timing/ref_s": ref_s,
            "timing/update_s": update_s,
            "timing/step_s": step_s,
        }
        print(step, {k: round(v, 3) for k, v in record.items() if k in (
            "rewards/total/mean", "accuracy/train", "policy/kl", "throughput/gen_tokens_per_s", "timing/step_s")})
    return record
