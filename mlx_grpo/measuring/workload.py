"""What `mlx-grpo bench` and the selftest time: the trainer on synthetic prompts of a fixed length
(`Workload`), and the baselines each path is compared with (a minimal batched decode, a bare grad + AdamW
step). benchmark.py measures them and reports."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from ..common.errors import UserError
from ..config.train_config import TrainConfig
from ..data import EncodedPrompt, PromptOrder, encode_prompt
from ..planning.machine import wire_memory, wired_limit
from ..rollout import Rollout
from ..trainer import Prompts, Trainer, step_key
from ..update import build_train_batch

STEP_PHASES = ("rollout", "reward", "advantage", "ref", "update")


def _prompt_pool(tokenizer, seed: int) -> list[int]:
    """Ordinary token ids that survive decode -> encode as themselves, preferring whole words
    (" the"), which a BPE tokenizer does not merge with their neighbours."""
    special = set(getattr(tokenizer, "all_special_ids", None) or [])
    special |= set(getattr(tokenizer, "eos_token_ids", None) or [])
    order = np.random.default_rng(seed).permutation(tokenizer.vocab_size)[:20000]
    words, stable = [], []
    for i in (int(i) for i in order if int(i) not in special):
        text = tokenizer.decode([i])
        if not text.strip() or tokenizer.encode(text, add_special_tokens=False) != [i]:
            continue
        stable.append(i)
        if text[:1] == " " and text[1:].isalpha():
            words.append(i)
        if len(words) >= 256:
            break
    return words if len(words) >= 64 else stable


def synthetic_rows(tokenizer, config: TrainConfig, count: int, length: int,
                   seed: int) -> tuple[list[dict], list[list[int]]]:
    """`count` dataset rows whose prompts, encoded as the trainer encodes them (chat template,
    BOS...), are exactly `length` tokens; returns the rows and those token ids."""
    pool = _prompt_pool(tokenizer, seed)
    if not pool:
        raise UserError("bench: the tokenizer has no ordinary tokens to build prompts from")
    overhead = len(encode_prompt(tokenizer, "", config).tokens)  # BOS, chat-template tokens
    if length <= overhead:
        raise UserError(f"bench: --prompt-length must be more than {overhead} with this tokenizer "
                        f"(its BOS and chat-template tokens alone take {overhead})")
    rng = np.random.default_rng(seed)
    rows, prompts = [], []
    for _ in range(count):
        content = length - overhead
        for _attempt in range(20):
            text = tokenizer.decode(rng.choice(pool, size=content).tolist())
            tokens = encode_prompt(tokenizer, text, config).tokens
            if len(tokens) == length:
                break
            content = max(1, content + length - len(tokens))
        else:
            raise UserError(f"bench: could not make prompts of exactly {length} tokens with this tokenizer; "
                            "try another --prompt-length")
        rows.append({"prompt": text, "answer": "0"})
        prompts.append(tokens)
    return rows, prompts


class Workload:
    """The trainer (`Trainer.build`, as `mlx-grpo train` builds it) on synthetic prompts, and a
    prepared rollout, batch and advantages so that each phase can also be timed alone. Every phase
    is the trainer's own phase method."""

    def __init__(self, config: TrainConfig, base_dir: Path, prompt_length: int):
        # Features that change the amount of work from step to step are off, and EOS is not honoured:
        # every path then handles the same tokens, in the phases and in the whole step alike.
        config = replace(config, adaptive_window=replace(config.adaptive_window, enable=False),
                         sgrpo=replace(config.sgrpo, enable=False))
        self.config = config
        built = Trainer.build(config, base_dir, stop_at_eos=False)
        # as `mlx-grpo train` runs: on a Mac, the working set wired (figures otherwise include paging)
        wire_memory(built.resident_bytes())
        self.wired_limit = wired_limit()
        self.rows, self.prompts = synthetic_rows(built.policy.tokenizer, config, config.batch_size, prompt_length,
                                            config.seed)
        # As many rows as the configured dataset has, so the step pays the real cost of drawing
        # prompts from it; every row is one of the synthetic prompts, so the shapes stay fixed.
        size = max(len(built.train_rows), len(self.rows))
        self.trainer = replace(built, train_rows=[self.rows[i % len(self.rows)] for i in range(size)],
                               order=PromptOrder(size, config.seed))
        self.model = self.trainer.policy.model
        self.fixed = Prompts(self.rows, [EncodedPrompt(p, False) for p in self.prompts], config.num_generations)
        self.batch_rollout = self.rollout(step_key(config.seed, 0))
        self.batch = build_train_batch(self.batch_rollout, self.trainer.policy.pad_id)
        self.advantages = self.rewards(self.batch_rollout)
        self.ref_logp = self.trainer.reference_logprobs(self.batch)

    @property
    def reference(self):
        return self.trainer.reference

    @property
    def sequences(self) -> int:
        return self.config.batch_size * self.config.num_generations

    @property
    def completion_tokens(self) -> int:
        return self.sequences * self.config.max_generation_steps

    def rollout(self, key: mx.array) -> Rollout:
        return self.trainer.rollout(self.fixed, key, self.config.max_generation_steps)

    def rewards(self, rollout: Rollout) -> mx.array:
        """The reward and advantage phases."""
        return self.trainer.advantages(self.trainer.score(self.fixed, rollout), self.fixed.group_size)

    def update(self, batch, advantages: mx.array, ref_logp: mx.array | None) -> None:
        self.trainer.update(batch, advantages, ref_logp)

    def step(self, step: int) -> tuple[dict[str, float], dict[str, float]]:
        """One whole step of the trainer; returns its own phase timers and per-phase peak memory (bytes)."""
        data = self.trainer.step(step)
        return {phase: data.seconds[phase] for phase in STEP_PHASES if phase in data.seconds}, dict(data.peak_memory)


# ----------------------------------------------------------------------------- the baselines

def decode_ceiling(model: nn.Module, prompts: mx.array, group_size: int, steps: int, temperature: float) -> np.ndarray:
    """The least a batched KV-cache sampler must do: prefill each prompt once, copy its cache per
    group member, then one forward pass per token with the next pass queued before the host waits."""
    cache = make_prompt_cache(model)
    logits = model(prompts, cache=cache)[:, -1, :]
    if group_size > 1:
        rows = mx.repeat(mx.arange(prompts.shape[0]), group_size)
        for layer in cache:
            layer.keys, layer.values = layer.keys[rows], layer.values[rows]
        logits = logits[rows]
    out = []
    for t in range(steps):
        ids = mx.argmax(logits, axis=-1) if temperature == 0 else mx.random.categorical(logits / temperature)
        out.append(ids)
        if t + 1 < steps:
            logits = model(ids[:, None], cache=cache)[:, -1, :]
            mx.async_eval(logits)
    return np.array(mx.stack(out, axis=1))


def make_update_ceiling(model: nn.Module, batch, prompt_length: int, learning_rate: float) -> Callable[[], None]:
    """A bare training step over the batch's tokens: forward, masked cross-entropy on the completion
    positions, value_and_grad, AdamW; no clipping, no statistics, one evaluation."""
    start = prompt_length - 1  # fixed-length prompts: completion targets are one contiguous slice
    targets = batch.targets[:, start:]
    mask = batch.mask
    optimizer = optim.AdamW(learning_rate=learning_rate)

    def loss_fn(m):
        logits = m(batch.inputs)[:, start:, :]
        losses = nn.losses.cross_entropy(logits, targets, reduction="none")
        return (losses * mask).sum() / mask.sum()

    value_and_grad = nn.value_and_grad(model, loss_fn)

    def run() -> None:
        model.train()
        loss, grads = value_and_grad(model)
        optimizer.update(model, grads)
        mx.eval(loss, model.parameters(), optimizer.state)

    return run
