"""What every selftest check shares: its result row, the test-only switches, the float32 tolerances and
the small config and batch the numerical checks compare on."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np

PERTURB_ENV = "MLX_GRPO_SELFTEST_PERTURB"
ABORT_ENV = "MLX_GRPO_SELFTEST_ABORT"
# what MLX before 0.32 writes to file descriptor 2 as Metal's watchdog ends a command buffer, then it aborts
METAL_ABORT_LINE = ("[METAL] Command buffer execution failed: Impacting Interactivity "
                    "(0000000e:kIOGPUCommandBufferCallbackErrorImpactingInteractivity)")

# float32 on two paths or two devices: the same sums in another order differ by ~1e-6 at these sizes (measured
# 1.9e-6 on the shared-prompt path); 1e-4 leaves room and still sees a broken kernel (errors of 1e-3 and up).
FP32_TOLERANCE = 1e-4
# Two bfloat16 computations can each be off the exact value by bf16's rounding (8 bits of mantissa), so they
# may differ by twice the rounding measured on this machine (bf16 against float32 on the reference device),
# plus a floor for paths where it measures ~0.
BF16_FLOOR = 1e-3

REAL_MODEL = "smollm2"  # SmolLM2-135M-Instruct, its Q4_1 GGUF (tools/smollm2.py): a real 4-bit base and tokenizer



@dataclass
class Check:
    name: str
    status: str  # "pass", "fail" or "skip"
    detail: str  # one line: what was compared, the numbers, the tolerance (or why skipped)
    measured: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    dtype: str = ""  # what the check computed in ("float32", "bfloat16 + 4-bit base", ...)
    device: str = ""  # "cpu", "gpu", or "gpu vs cpu"
    error: str = ""  # the whole traceback of a check that raised


def perturbed(check: str, values: np.ndarray) -> np.ndarray:
    """`values`, nudged when the test switch names this check."""
    return values * (1 + 1e-3) + 1e-3 if os.environ.get(PERTURB_ENV) == check else values


def max_difference(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0


def device_name() -> str:
    import mlx.core as mx

    return "gpu" if mx.default_device().type == mx.gpu else "cpu"


def verdict(ok: bool) -> str:
    return "pass" if ok else "fail"



def small_config(**overrides):
    from ...config.train_config import load_config

    return load_config(None, {"batch_size": 4, "num_generations": 4, "max_generation_steps": 12, "eval_size": 8,
                              "micro_batch_size": 0, "wandb": False, **overrides})


def sample_batch(trainer):
    """A real rollout of the trainer's model on its task, laid out for the update."""
    from ...trainer import step_key
    from ...update import build_train_batch

    prompts = trainer.draw_prompts()
    rollout = trainer.rollout(prompts, step_key(trainer.config.seed, 1), trainer.config.max_generation_steps)
    batch = build_train_batch(rollout, trainer.policy.pad_id)
    advantages = trainer.advantages(trainer.score(prompts, rollout), prompts.group_size)
    return batch, advantages


def sum_rows(count: int, held_out: bool, seed: int) -> list[dict]:
    """"What is a + b?" rows; a pair is held out or trained on by a fixed rule, never both."""

    rng, rows, seen = random.Random(seed), [], set()
    while len(rows) < count:
        a, b = rng.randint(0, 30), rng.randint(0, 30)
        if ((a * 7 + b * 13) % 4 == 0) != held_out or (held_out and (a, b) in seen):
            continue
        seen.add((a, b))
        rows.append({"prompt": f"What is {a} + {b}?", "answer": str(a + b)})
    return rows


def reply_batch(tokenizer, rows: list[dict]):
    """Each row's prompt followed by its reference reply ("2 + 3 = 5."), laid out for `completion_logprobs`."""
    from ...rollout import Rollout
    from ...update import build_train_batch

    prompts = [tokenizer.encode(row["prompt"]) for row in rows]
    replies = [tokenizer.encode(f" {row['prompt'][8:-1]} = {row['answer']}.", add_special_tokens=False)
               for row in rows]
    rollout = Rollout(prompts, replies, [[0.0] * len(r) for r in replies], [False] * len(rows), 0.0)
    return build_train_batch(rollout, tokenizer.pad_token_id or 0)
