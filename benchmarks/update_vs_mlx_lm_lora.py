"""mlx-grpo's GRPO gradient against mlx-lm-lora's on the same batch: is the update rule the same?

One rollout of the recipe (B prompts x G completions, mlx-grpo's sampler), its rewards and group advantages,
then the gradient of each tool's loss with respect to the LoRA factors of the same model object: mlx-grpo's
loss as its trainer computes it (its micro-batch pass, reference log-probs with the adapters off) and
mlx-lm-lora's `grpo_loss` (its own masking, KL estimator and token-level normalisation, a separately loaded
copy of the model as its reference). The adapters' B factors are moved off zero first, so the policy
differs from its reference and the KL term has a gradient too. Where no group's rewards differ (short
completions of a hard task), a fixed set of advantages stands in: the comparison is of the loss, not of
the rewards.

mlx-lm-lora takes log-probs of the model's raw logits; mlx-grpo takes them at the sampling temperature (as
TRL does). Its model is given logits divided by the temperature, so at --temperature 1 each tool runs
exactly its own rule. Gradient clipping is off (mlx-lm-lora has none).

    python benchmarks/update_vs_mlx_lm_lora.py --config configs/qwen_think.yaml --model-id /path/to/hf-dir \
        --peer-site-packages /path/to/venv-with-mlx-lm-lora/lib/python3.11/site-packages

--peer-site-packages is where `mlx_lm_lora` is installed, when not in this environment (its Python code
then runs on this environment's mlx). Prints the two losses, the two gradient norms, their cosine and the
relative difference of the gradients.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __name__ == "__main__":
    from mlx_grpo.planning.blas import reexec_with_openblas

    reexec_with_openblas([str(Path(__file__).resolve()), *sys.argv[1:]])

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

STAND_IN_ADVANTAGES = (1.2, -0.4, -0.4, -0.4, 0.9, 0.9, -0.9, -0.9)


class AtTemperature(nn.Module):
    """A model whose logits are divided by `temperature`."""

    def __init__(self, model: nn.Module, temperature: float):
        super().__init__()
        self.model, self.temperature = model, temperature

    def __call__(self, inputs: mx.array) -> mx.array:
        return self.model(inputs) / self.temperature


def flat(grads) -> np.ndarray:
    return np.concatenate([np.array(v, dtype=np.float64).ravel() for _, v in sorted(tree_flatten(grads))])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("configs/qwen_think.yaml"))
    parser.add_argument("--model-id", required=True, help="a Hugging Face-format directory both tools load")
    parser.add_argument("--peer-site-packages", type=Path, help="site-packages holding mlx_lm_lora")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()
    if args.peer_site_packages:
        sys.path.append(str(args.peer_site_packages))  # appended: this environment's mlx stays first
    from mlx_lm import load as load_plain
    from mlx_lm_lora.trainer.grpo_trainer import grpo_loss as peer_loss

    from mlx_grpo.config.train_config import load_config
    from mlx_grpo.grpo import LossTotals
    from mlx_grpo.trainer import Trainer, step_key
    from mlx_grpo.update import _micro_batch_pass, build_train_batch, entropy_stride

    config = load_config(str(args.config), {
        "model_id": args.model_id, "temperature": args.temperature, "max_grad_norm": 0.0,
        "num_generations": args.group_size, "max_generation_steps": args.max_tokens, "loss_type": "bnpo",
        "seed": args.seed, "micro_batch_size": 0, "eval_every": 0, "checkpoint_every": 0, "tensorboard": False,
        "enable_alerts": False})
    trainer = Trainer.build(config, args.config.resolve().parent)
    model = trainer.policy.model
    mx.random.seed(args.seed)
    moved = [(name, mx.random.normal(value.shape) * 0.02)
             for name, value in tree_flatten(model.trainable_parameters()) if name.endswith("lora_b")]
    model.update(tree_unflatten(moved))
    mx.eval(model.parameters())

    prompts = trainer.draw_prompts()
    rollout = trainer.rollout(prompts, step_key(args.seed, 1), args.max_tokens)
    scored = trainer.score(prompts, rollout)
    advantages = trainer.advantages(scored, args.group_size)
    if not np.array(advantages).any():
        advantages = mx.array([STAND_IN_ADVANTAGES[i % len(STAND_IN_ADVANTAGES)]
                               for i in range(len(rollout.completions))], dtype=mx.float32)
    batch = build_train_batch(rollout, trainer.policy.pad_id)
    ref_logp = trainer.reference_logprobs(batch)
    model.train()
    ours_loss, ours_grads, *_ = _micro_batch_pass(model, trainer.loss_and_grad, batch, advantages, None, ref_logp,
                                                  LossTotals(batch.num_sequences, batch.num_tokens), 0,
                                                  entropy_stride(config.max_generation_steps))

    reference, _ = load_plain(args.model_id)
    reference.freeze()
    peer_batch = ([e.tokens for e in prompts.encoded], None, None, None, None)
    of_prompt = [g for g in range(len(prompts.encoded)) for _ in range(args.group_size)]

    def loss(policy):
        return peer_loss(AtTemperature(policy, args.temperature), AtTemperature(reference, args.temperature),
                         peer_batch, completions=[mx.array(c, dtype=mx.int32) for c in rollout.completions],
                         batch_indices=of_prompt, advantages=advantages, beta=config.beta, epsilon=config.epsilon,
                         max_tokens=config.max_generation_steps, grpo_loss_type="bnpo")[0]

    peer_value, peer_grads = nn.value_and_grad(model, loss)(model)
    mx.eval(ours_loss, ours_grads, peer_value, peer_grads)
    a, b = flat(ours_grads), flat(peer_grads)
    print(f"completion lengths {[len(c) for c in rollout.completions]}, advantages "
          f"{[round(float(x), 2) for x in np.array(advantages)]}, temperature {args.temperature}")
    print(f"loss: mlx-grpo {ours_loss.item():.6f}, mlx-lm-lora {peer_value.item():.6f}")
    print(f"gradient norm: mlx-grpo {np.linalg.norm(a):.6f}, mlx-lm-lora {np.linalg.norm(b):.6f}; cosine "
          f"{a @ b / (np.linalg.norm(a) * np.linalg.norm(b)):.6f}; |difference| / |mlx-lm-lora's| "
          f"{np.linalg.norm(a - b) / np.linalg.norm(b):.1e}")


if __name__ == "__main__":
    main()
