"""Multi-turn rollouts: B prompts x G trajectories decoded together, turn after turn, from one KV cache.

A turn: every live row decodes until its end-of-turn token or its budget (one token per forward pass, all rows
at once). Each row's environment then reads the turn and answers (a tool's result, the world's reply) or ends
the trajectory. The rows that go on keep their cache: each row's keys and values are cut to what it really
holds (a finished row kept decoding padding), its answer tokens are run on it, and the rows are merged into
one left-padded batch cache again for the next turn. Nothing is prefilled again from the start, and rows
whose trajectory ended leave the batch.

The completion of a trajectory is every token after the prompt, the model's and the environment's; its
`model_mask` says which are the model's. Only those are sampled, scored and trained.

With `capture`, the output of the frozen blocks below the first adapted one is kept at every position fed
(frozen_prefix.py): the prompts' from the prefill, each turn's from its decode steps, the rest of the turn
and the environment's answer from the pass that runs them on the row's cache. The reference pass and the
update then start at the first adapted block, as after a single-turn rollout."""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import BatchKVCache, KVCache

from .. import frozen_prefix
from ..common.errors import UserError
from ..frozen_prefix import Captured
from ..models.cpu_kernels import cpu_kernels
from ..rollout import Rollout, has_plain_kv_cache, prefill_plain
from ..sampling import SamplingSettings, sample_tokens
from .chat import continuation_tokens


@dataclass
class Trajectory:
    """One row's story: which completion tokens each turn holds, the tools it called, its environment reward."""

    segments: list[tuple[str, int, int]] = field(default_factory=list)  # (assistant | environment, start, end)
    calls: list[tuple[str, bool]] = field(default_factory=list)  # (tool name, failed)
    reward: float = 0.0  # the environment's rewards, summed
    done: bool = False  # the environment ended it (else: turns or budget ran out)

    @property
    def turns(self) -> int:
        return sum(role == "assistant" for role, _, _ in self.segments)


@dataclass
class TurnBudgets:
    max_turns: int  # model turns per trajectory
    turn_tokens: int  # model tokens per turn
    trajectory_tokens: int  # all tokens after the prompt, the environment's included


@dataclass
class _Row:
    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    story: Trajectory = field(default_factory=Trajectory)
    truncated: bool = False
    kept: list[mx.array] = field(default_factory=list)  # frozen-block outputs of the tokens fed, in order

    def add_turn(self, ids: list[int], logprobs: np.ndarray, eos_ids: set[int]) -> tuple[list[int], bool, int]:
        """Append a decoded turn, cut after its end-of-turn token: (its tokens, whether it ended, its start)."""
        end = next((t for t, tok in enumerate(ids) if tok in eos_ids), None)
        ids = ids if end is None else ids[:end + 1]
        start = len(self.tokens)
        self.tokens += ids
        self.mask += [1] * len(ids)
        self.logprobs += logprobs[:len(ids)].tolist()
        self.story.segments.append(("assistant", start, len(self.tokens)))
        return ids, end is not None, start


def generate_trajectories(model: nn.Module, tokenizer: Any, prompts: list[list[int]], rows: list[dict],
                          group_size: int, budgets: TurnBudgets, eos_ids: set[int], pad_id: int,
                          settings: SamplingSettings, key: mx.array, make_env: Callable[[], Any],
                          tools: list[dict] | None, capture: bool = False) -> Rollout:
    """`group_size` trajectories for each prompt (`rows`: the prompts' dataset rows, for the environments).
    `capture`: keep the frozen blocks' output at every position (`Rollout.prefix`)."""
    with frozen_prefix.recording(model) if capture else nullcontext([]) as recorded, cpu_kernels(model):
        rollout = _generate_trajectories(model, tokenizer, prompts, rows, group_size, budgets, eos_ids, pad_id,
                                         settings, key, make_env, tools, recorded)
        recorded.clear()  # the per-call pieces, now joined per row
        return rollout


def _generate_trajectories(model: nn.Module, tokenizer: Any, prompts: list[list[int]], rows: list[dict],
                           group_size: int, budgets: TurnBudgets, eos_ids: set[int], pad_id: int,
                           settings: SamplingSettings, key: mx.array, make_env: Callable[[], Any],
                           tools: list[dict] | None, recorded: list[mx.array]) -> Rollout:
    start = time.perf_counter()
    n = len(prompts) * group_size
    of_prompt = np.repeat(np.arange(len(prompts)), group_size)
    capacity = max(map(len, prompts)) + budgets.trajectory_tokens
    if not has_plain_kv_cache(model, capacity):
        raise UserError("multi-turn rollouts need a model whose layers cache plain keys and values over "
                        f"{capacity} positions (no sliding window shorter than that, no recurrent state)")
    logits, cache = prefill_plain(model, prompts, pad_id, capacity, of_prompt)
    prompt_states = frozen_prefix.capture_from_prefill(recorded, prompts, [list(range(len(prompts)))]) \
        if recorded else None
    states = [_Row() for _ in range(n)]
    envs = []
    for i in range(n):
        env = make_env()
        env.reset(rows[of_prompt[i]])
        envs.append(env)
    live = list(range(n))
    eos_text = {i: tokenizer.decode([i]) for i in eos_ids}
    turn_keys = mx.random.split(key, budgets.max_turns)
    for turn in range(budgets.max_turns):
        budget = [min(budgets.turn_tokens, budgets.trajectory_tokens - len(states[i].tokens)) for i in live]
        before = len(recorded)
        ids, logprobs, fed = _decode_turn(model, logits, cache, max(budget), eos_ids, settings, turn_keys[turn])
        decoded = mx.concatenate(recorded[before:], axis=1) if len(recorded) > before else None  # [R, fed, H]
        going, caches, pending = [], [], []
        for r, i in enumerate(live):
            row = states[i]
            turn_ids, ended, turn_start = row.add_turn(ids[r, :budget[r]].tolist(), logprobs[r], eos_ids)
            cached = min(len(turn_ids), fed)  # this turn's tokens its decode steps fed back
            if decoded is not None:
                row.kept.append(decoded[r, :cached])
            if not ended and len(row.tokens) >= budgets.trajectory_tokens:
                row.truncated = True
                continue
            extra = _environment_turn(row, envs[i], tokenizer, turn_ids, ended, tools, eos_text,
                                      turn + 1 == budgets.max_turns, budgets.trajectory_tokens)
            if extra is None:
                continue
            # what this row's cache lacks: its turn's tokens decoding never fed back, then the answer
            caches.append(_row_cache(cache, r, len(prompts[of_prompt[i]]) + turn_start + cached))
            pending.append(turn_ids[cached:] + extra)
            going.append(i)
        if not going:
            break
        before = len(recorded)
        logits, cache = _continue(model, caches, pending)
        for i, out in zip(going, recorded[before:]):  # one pass per row, in `going`'s order
            states[i].kept.append(out[0])
        live = going
    return Rollout(prompts=[prompts[p] for p in of_prompt], completions=[s.tokens for s in states],
                   logprobs=[s.logprobs for s in states], truncated=[s.truncated for s in states],
                   seconds=time.perf_counter() - start, prefix=_kept_states(prompt_states, of_prompt, states),
                   model_mask=[s.mask for s in states], trajectories=[s.story for s in states])


def _kept_states(prompt_states: list[mx.array] | None, of_prompt: np.ndarray, states: list[_Row]) -> Captured | None:
    """Each row's kept frozen-block states: its prompt's, then one per completion token but the last (a final
    turn's last tokens may have been fed too; they are cut)."""
    if prompt_states is None:
        return None
    return Captured([prompt_states[p] for p in of_prompt],
                    [mx.concatenate(s.kept or [prompt_states[0][:0]])[:len(s.tokens) - 1] for s in states])


def _environment_turn(row: _Row, env: Any, tokenizer: Any, turn_ids: list[int], ended: bool,
                      tools: list[dict] | None, eos_text: dict[int, str], last_turn: bool,
                      trajectory_tokens: int) -> list[int] | None:
    """The environment's answer to the model's turn, appended to `row` (masked out of the loss): its tokens,
    or None when the row stops here (done, out of turns, or no room left)."""
    answer = env.step(tokenizer.decode(turn_ids[:-1] if ended else turn_ids))
    row.story.calls += answer.calls
    row.story.reward += answer.reward or 0.0
    if answer.done or not answer.messages:
        row.story.done = True
        return None
    if last_turn:
        return None  # out of turns: the environment's answer is never read
    extra = continuation_tokens(tokenizer, answer.messages, tools, eos_text.get(turn_ids[-1], "") if ended else "")
    if len(row.tokens) + len(extra) >= trajectory_tokens:
        row.truncated = True  # no room left for the model to answer
        return None
    row.story.segments.append(("environment", len(row.tokens), len(row.tokens) + len(extra)))
    row.tokens += extra
    row.mask += [0] * len(extra)
    row.logprobs += [0.0] * len(extra)
    return extra


def _decode_turn(model: nn.Module, logits: mx.array, cache: list, max_tokens: int, eos_ids: set[int],
                 settings: SamplingSettings, key: mx.array) -> tuple[np.ndarray, np.ndarray, int]:
    """Sample up to `max_tokens` tokens per row, stopping once every row has ended its turn. Returns the ids
    and log-probs ([R, T]) and how many of each row's tokens were fed back into the cache."""
    eos = mx.array(sorted(eos_ids)) if eos_ids else mx.array([-1])
    finished = mx.zeros((logits.shape[0],), dtype=mx.bool_)
    step_ids, step_logprobs = [], []
    keys = mx.random.split(key, max(1, max_tokens))
    fed = 0
    for t in range(max_tokens):
        ids, logprobs = sample_tokens(logits, settings, keys[t])
        step_ids.append(ids)
        step_logprobs.append(logprobs)
        finished = finished | (ids[:, None] == eos[None, :]).any(axis=-1)
        if t + 1 == max_tokens or (t % 4 == 3 and bool(finished.all())):
            break
        logits = model(ids[:, None], cache=cache)[:, -1, :]
        fed += 1
        mx.async_eval(logits, finished, ids, logprobs)
    return np.array(mx.stack(step_ids, axis=1)), np.array(mx.stack(step_logprobs, axis=1)), fed


def _row_cache(cache: list, row: int, length: int) -> list[KVCache]:
    """Row `row` of a batch cache as a one-row cache of its first `length` positions."""
    out = []
    for layer in cache:
        if isinstance(layer, BatchKVCache):
            single = layer.extract(row)
        else:
            single = KVCache()
            single.keys = layer.keys[row:row + 1, :, :layer.offset]
            single.values = layer.values[row:row + 1, :, :layer.offset]
            single.offset = layer.offset
        single.trim(single.offset - length)
        out.append(single)
    return out


def _continue(model: nn.Module, caches: list[list[KVCache]], pending: list[list[int]]) -> tuple[mx.array, list]:
    """Run each row's pending tokens on its own cache, then merge the rows into one batch cache; returns the
    next-token logits per row ([R, V]) and the merged cache."""
    last = []
    for row_cache, tokens in zip(caches, pending):
        last.append(model(mx.array([tokens]), cache=row_cache)[:, -1, :])
        mx.eval(last[-1], [c.state for c in row_cache])
    merged = [BatchKVCache.merge([row_cache[layer] for row_cache in caches]) for layer in range(len(caches[0]))]
    return mx.concatenate(last, axis=0), merged
