"""Launched by tests/core/test_distributed.py under `mlx.launch -n 2 --backend ring` (loopback only).

One fixed rollout of 2*B prompts x G completions (token ids, rewards and lengths drawn from a seeded
numpy generator, so every rank builds the same one). Each rank makes two updates from the same
starting weights:

- single: the whole rollout, plain `value_and_grad`, no communication: one process with batch 2B;
- data-parallel: this rank's B prompts, its loss divided by the global batch's sizes and the ranks'
  gradients summed (`World.loss_totals`, `World.sum_update`).

It prints one JSON line per case from rank 0: the largest weight difference between the two
updates, the size of the update itself, the two losses, and whether all ranks ended with the same
weights. `naive_bnpo` divides each rank's bnpo loss by its own token count and averages the
gradients, to show the comparison can tell the difference.

    python tests/dist_equivalence.py MODEL_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_map
from tiny_models import grouped_rollout

from mlx_grpo import grpo
from mlx_grpo.config.train_config import load_config
from mlx_grpo.distributed import init_world
from mlx_grpo.models.policy import load_policy_for_training
from mlx_grpo.rollout import Rollout
from mlx_grpo.trainer import make_optimizer
from mlx_grpo.update import LocalReduce, build_train_batch, completion_logprobs, make_loss_fn, update_policy

B, G = 2, 4  # prompts per rank, completions per prompt
CASES = {  # name -> (loss_type, scale_rewards, micro_batch_size, naive reduction)
    "grpo": ("grpo", "group", 0, False),
    "bnpo": ("bnpo", "group", 0, False),
    "dr_grpo": ("dr_grpo", "group", 0, False),
    "dapo": ("dapo", "group", 0, False),
    "grpo_batch_scaled": ("grpo", "batch", 0, False),
    "dapo_micro_batched": ("dapo", "group", 3, False),
    "naive_bnpo": ("bnpo", "group", 0, True),
}


class NaiveReduce(LocalReduce):
    """Each rank's own sizes, gradients averaged: right for grpo, wrong for token-normalised losses."""

    def __init__(self, world):
        self.world = world

    def sum_update(self, loss, grads):
        loss, grads = self.world.sum_update(loss, grads)
        return loss / self.world.size, tree_map(lambda g: g / self.world.size, grads)


def fixed_rollout(num_prompts: int, vocab: int) -> tuple[Rollout, np.ndarray]:
    rng = np.random.default_rng(1234)
    # completions of very different lengths, so the ranks hold different token counts (bnpo/dapo care)
    rollout = grouped_rollout(rng, num_prompts, G, ids=(4, vocab), prompt_lengths=(3, 7), completion_lengths=(1, 12))
    rewards = rng.integers(0, 3, size=len(rollout.completions)).astype(np.float32)
    return rollout, rewards


def part(rollout: Rollout, start: int, stop: int) -> Rollout:
    return rollout.take(range(start, stop))


def update(config, base_dir, rollout, advantages, reduce=None):
    policy = load_policy_for_training(config, base_dir)
    before = dict(tree_flatten(policy.model.parameters()))
    mx.eval(before)
    batch = build_train_batch(rollout, policy.pad_id)
    ref_logp = mx.stop_gradient(completion_logprobs(policy.model, batch, config.temperature))
    loss_and_grad = nn.value_and_grad(policy.model, make_loss_fn(config))
    result = update_policy(policy.model, make_optimizer(config), loss_and_grad, batch, advantages, ref_logp, config,
                           reduce=reduce)
    return before, dict(tree_flatten(policy.model.parameters())), result


def main() -> None:
    model_dir = Path(sys.argv[1])
    world = init_world()
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    rows = {}
    for name, (loss_type, scale, micro_batch_size, naive) in CASES.items():
        config = load_config(None, {"model_id": str(model_dir), "loss_type": loss_type, "scale_rewards": scale,
                                    "micro_batch_size": micro_batch_size,
                                    "num_generations": G, "batch_size": B, "beta": 0.04, "num_iterations": 2,
                                    "learning_rate": 1e-3, "lr_schedule": "constant", "warmup_fraction": 0.0,
                                    "max_grad_norm": 0.5, "max_generation_steps": 12})
        rollout, rewards = fixed_rollout(B * world.size, vocab)
        n = B * G
        mine = slice(world.rank * n, (world.rank + 1) * n)

        whole_adv = grpo.group_advantages(mx.array(rewards), G, scale)
        before, single, single_result = update(config, model_dir.parent, rollout, whole_adv)
        rank_adv = world.group_advantages(mx.array(rewards[mine]), G, scale)
        _, parallel, parallel_result = update(config, model_dir.parent, part(rollout, mine.start, mine.stop), rank_adv,
                                              reduce=NaiveReduce(world) if naive else world)

        diff = max(float(mx.abs(single[k] - parallel[k]).max()) for k in single)
        moved = max(float(mx.abs(single[k] - before[k]).max()) for k in single)
        prints = world.gather_json([float(parallel[k].astype(mx.float32).sum()) for k in sorted(parallel)])
        agree = all(p == prints[0] for p in prints)
        rows[name] = {"max_weight_diff": diff, "update_size": moved, "loss_single": single_result.loss,
                      "loss_parallel": parallel_result.loss, "grad_norm_single": single_result.grad_norm,
                      "grad_norm_parallel": parallel_result.grad_norm, "ranks_agree": agree,
                      "tokens_per_rank": world.gather_json(sum(len(c) for c in rollout.completions[mine]))}
    if world.is_main:
        print(json.dumps({"world_size": world.size, "cases": rows}), flush=True)


if __name__ == "__main__":
    main()
