"""Where a recipe's update and rollout spend their time and memory, on its real model: each path as the trainer
runs it, next to the paths it replaced, timed in one process on one rollout.

The trainer is built as `mlx-grpo train` builds it from the config (model, LoRA, frozen-prefix reuse,
micro-batches); one rollout of the recipe's shape is drawn, then every variant runs once per repetition,
interleaved, so load on a shared machine hits them alike. "Before" variants put back what an earlier
version did: `own head` runs the model's own LM head over every position (gemma3_text before it was a
plain-head family), `windowed caches` keeps sliding-window models out of the plain-cache paths (each prompt
prefilled alone into rotating caches; no shared prompt pass), `no prefix` runs the frozen blocks too.

    python benchmarks/recipe_profile.py configs/gemma3_subtraction.yaml --repetitions 2

Prints each variant's fastest seconds and its peak MLX memory above what was allocated when it started.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path

from mlx_grpo.planning.blas import reexec_with_openblas

if __name__ == "__main__":
    reexec_with_openblas([__file__, *sys.argv[1:]])

import mlx.core as mx  # noqa: E402
from mlx_lm.models.cache import KVCache, make_prompt_cache  # noqa: E402

from mlx_grpo import rollout, update  # noqa: E402
from mlx_grpo.config.train_config import load_config  # noqa: E402
from mlx_grpo.models import families  # noqa: E402
from mlx_grpo.trainer import Trainer  # noqa: E402


@contextmanager
def own_head(model_type: str):
    """The family's head read as the model's own: logits at every position."""
    family = families.FAMILIES.get(model_type)
    families.FAMILIES[model_type] = families.Family(plain_head=False)
    try:
        yield
    finally:
        if family is None:
            del families.FAMILIES[model_type]
        else:
            families.FAMILIES[model_type] = family


@contextmanager
def windowed_caches():
    """Plain caches only where every layer's cache is a KVCache, whatever the sequence's length."""
    def plain_only(model, length=0):
        return all(type(c) is KVCache for c in make_prompt_cache(model))

    kept = rollout.has_plain_kv_cache, update.has_plain_kv_cache
    rollout.has_plain_kv_cache = update.has_plain_kv_cache = plain_only
    try:
        yield
    finally:
        rollout.has_plain_kv_cache, update.has_plain_kv_cache = kept


@contextmanager
def micro_batch(trainer: Trainer, size: int):
    kept = trainer.config.micro_batch_size
    trainer.config.micro_batch_size = size
    try:
        yield
    finally:
        trainer.config.micro_batch_size = kept


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--repetitions", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    config = load_config(str(args.config), {"num_steps": 1, "eval_every": 0, "tensorboard": False,
                                            "seed": args.seed})
    trainer = Trainer.build(config, args.config.resolve().parent)
    model_type = getattr(trainer.policy.model, "model_type", "")
    prompts = trainer.draw_prompts()
    drawn = trainer.rollout(prompts, mx.random.key(args.seed), config.max_generation_steps)
    advantages = trainer.advantages(trainer.score(prompts, drawn), prompts.group_size)
    batch = update.build_train_batch(drawn, trainer.policy.pad_id, config.mask_truncated_completions)
    print(f"{model_type}: {batch.num_sequences} rows, inputs {tuple(batch.inputs.shape)}, "
          f"{batch.num_tokens} completion tokens, micro_batch_size {config.micro_batch_size}", flush=True)

    # each variant takes context factories: a context manager made by @contextmanager runs once
    def updating(*contexts, prefix: bool = True):
        def run():
            with ExitStack() as stack:
                for context in contexts:
                    stack.enter_context(context())
                trainer.update(batch if prefix else replace(batch, prefix=None), advantages, None)
        return run

    def rolling_out(*contexts):
        def run():
            with ExitStack() as stack:
                for context in contexts:
                    stack.enter_context(context())
                trainer.rollout(prompts, mx.random.key(args.seed), config.max_generation_steps)
        return run

    def plain_head_off():
        return own_head(model_type)

    variants = {
        "update, before: own head, windowed caches": updating(plain_head_off, windowed_caches),
        "update, before, no prefix": updating(plain_head_off, windowed_caches, prefix=False),
        "update, head at completion positions only": updating(windowed_caches),
        "update, as the trainer runs it": updating(),
        "update, one pass (micro_batch_size 0)": updating(lambda: micro_batch(trainer, 0)),
        "rollout, before: own head, windowed caches": rolling_out(plain_head_off, windowed_caches),
        "rollout, head at the last prompt position only": rolling_out(windowed_caches),
        "rollout, as the trainer runs it": rolling_out(),
    }
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    peaks: dict[str, float] = {name: 0.0 for name in variants}
    for repetition in range(args.repetitions + 1):  # the first is a warm-up
        for name, run in variants.items():
            gc.collect()
            mx.clear_cache()
            mx.reset_peak_memory()
            before = mx.get_active_memory()
            start = time.perf_counter()
            run()
            elapsed = time.perf_counter() - start
            if repetition:
                seconds[name].append(elapsed)
                peaks[name] = max(peaks[name], (mx.get_peak_memory() - before) / 1e9)
    width = max(map(len, variants))
    print(f"{'path':<{width}}  {'s (fastest)':>11}  {'peak above start':>16}")
    for name in variants:
        print(f"{name:<{width}}  {min(seconds[name]):>11.2f}  {peaks[name]:>13.3f} GB")


if __name__ == "__main__":
    main()
