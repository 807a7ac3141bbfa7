"""Batched rollouts over a KV cache.

Each prompt is prefilled once; its cache is then repeated for the G completions of
its group, and all B*G sequences decode together, one token per forward pass.
The exact sampled token ids and their log-probabilities under the sampling
distribution are kept; completions are never re-tokenized from text.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_map
from mlx_lm.models.cache import BatchKVCache, KVCache, RotatingKVCache, make_prompt_cache

from . import frozen_prefix
from .frozen_prefix import Captured
from .lookup_decoding import LOOKUP_ROWS, LOOKUP_TOKENS, LookupTexts
from .models.cpu_kernels import cpu_kernels
from .models.kv_cache import QuantizedBatchKVCache
from .models.policy import has_plain_head, lm_head, project_to_vocab
from .sampling import SamplingSettings, check_guesses, sample_tokens, sampling_logits


@dataclass
class Rollout:
    """B*G sequences, prompt-major (the G completions of prompt i are rows i*G .. i*G+G-1)."""

    prompts: list[list[int]]  # one entry per sequence
    completions: list[list[int]]  # sampled ids, up to and including EOS when one was sampled
    logprobs: list[list[float]]  # log-probability of each sampled id under the sampling distribution
    truncated: list[bool]  # hit the token budget without EOS
    seconds: float  # generation time (a part taken from a rollout keeps the whole rollout's)
    # the frozen blocks' output at every position decoded (frozen_prefix.py), when captured
    prefix: Captured | None = None
    # multi-turn (multiturn/trajectories.py): 1 for the model's own completion tokens, 0 for the environment's
    # (tool results, template text), which are neither sampled nor trained; and each row's turns and calls
    model_mask: list[list[int]] | None = None
    trajectories: list | None = None

    def take(self, rows: Sequence[int]) -> "Rollout":
        """The sequences at `rows`, in that order."""
        pick = lambda values: None if values is None else [values[i] for i in rows]  # noqa: E731
        return Rollout(pick(self.prompts), pick(self.completions), pick(self.logprobs), pick(self.truncated),
                       self.seconds, None if self.prefix is None else self.prefix.take(rows),
                       pick(self.model_mask), pick(self.trajectories))

    @staticmethod
    def concat(parts: Sequence["Rollout"]) -> "Rollout":
        """The parts' sequences one after another; their generation times add up."""
        join = lambda name: (None if getattr(parts[0], name) is None  # noqa: E731
                             else [x for p in parts for x in getattr(p, name)])
        return Rollout(join("prompts"), join("completions"), join("logprobs"), join("truncated"),
                       sum(p.seconds for p in parts), Captured.concat([p.prefix for p in parts]),
                       join("model_mask"), join("trajectories"))


def last_position_logits(model: nn.Module, inputs: mx.array, cache: list) -> mx.array:
    """[B, V] logits of the last position: a prompt's prefill needs no others (at a 152k vocabulary,
    B x prompt length x V logits would be most of the rollout's memory)."""
    if has_plain_head(model):
        return project_to_vocab(lm_head(model), model.model(inputs, cache=cache)[:, -1, :])
    return model(inputs, cache=cache)[:, -1, :]


def has_plain_kv_cache(model: nn.Module, length: int = 0) -> bool:
    """Every layer can cache plain keys and values over sequences of `length` positions (no recurrent
    state): prompts can then be prefilled together, left-padded, and a prompt's cache copied to many rows.
    A sliding window's cache (RotatingKVCache) counts when it holds `length` positions: it then never drops
    a key, so a plain cache holds the same ones (and the model still makes its window's attention mask from
    it). gemma-3-270m's window is 512: its short-prompt rollouts and updates batch their prompts, where
    per-prompt rotating caches merged for 32 rows took 0.5 GB and a third of the rollout's time."""
    return all(type(c) is KVCache or (type(c) is RotatingKVCache and 0 < length <= c.max_size)
               for c in make_prompt_cache(model))


def repeat_rows(x: mx.array, rows: np.ndarray) -> mx.array:
    """`x[rows]` for sorted `rows` (each group's rows are one run), as broadcast copies instead of a gather.
    The update differentiates through this copy: a gather's gradient is a scatter-add, which Metal runs
    with atomic adds in thread-scheduling order (not reproducible run to run, and rounded at every add in
    bf16); a broadcast's gradient is a sum-reduction, the same on every run and backend."""
    counts = np.bincount(rows, minlength=x.shape[0])
    if (counts == 1).all():
        return x
    if (counts == counts[0]).all():  # the usual case: G rows per prompt
        return mx.broadcast_to(x[:, None], (x.shape[0], int(counts[0]), *x.shape[1:])).reshape(-1, *x.shape[1:])
    return mx.concatenate([mx.broadcast_to(x[i:i + 1], (int(n), *x.shape[1:])) for i, n in enumerate(counts) if n])


def prefill_plain(model: nn.Module, prompts: list[list[int]], pad_id: int, capacity: int, rows: np.ndarray,
                  hidden: bool = False, first_block: int = 0) -> tuple[mx.array, list]:
    """Every prompt in one left-padded forward pass, then each prompt's cache copied per row (row i
    continues prompt rows[i]; `rows` sorted, every prompt used). Returns the last prompt position's logits
    per row ([R, V]; with `hidden`, for a plain-head model, its hidden state, [R, H]) and the cache.
    Differentiable: the update runs its completions on this cache, so a group's G completions share one
    pass over their prompt. `first_block` > 0: the blocks before it hand on a kept state
    (frozen_prefix.injecting) and get no cache of their own; their entries are the first computed block's
    cache, which the model's attention mask is then made from."""
    longest = max(len(p) for p in prompts)
    left_padding = [longest - len(p) for p in prompts]
    inputs = mx.array([[pad_id] * pad + p for pad, p in zip(left_padding, prompts)])
    cache = [BatchKVCache(left_padding) if any(left_padding) else KVCache() for _ in model.layers[first_block:]]
    for layer_cache in cache:
        # mlx-lm grows caches in blocks of 256 positions; one block of exactly the needed size
        # cuts rollout peak memory ~3.5x at the default shapes.
        layer_cache.step = max(1, capacity)
    computed, cache = cache, [cache[0]] * first_block + cache
    last = model.model(inputs, cache=cache)[:, -1, :] if hidden else last_position_logits(model, inputs, cache)
    for layer_cache in computed:
        layer_cache.keys = repeat_rows(layer_cache.keys, rows)
        layer_cache.values = repeat_rows(layer_cache.values, rows)
        if isinstance(layer_cache, BatchKVCache):
            # BatchKVCache.filter(rows) without its gather; the longest prompt has no padding and every
            # prompt keeps a row, so filter's shift of the common left padding would be zero
            layer_cache.offset = layer_cache.offset[mx.array(rows)]
            layer_cache.left_padding = layer_cache.left_padding[mx.array(rows)]
    return repeat_rows(last, rows), cache


def _prefill_merged(model: nn.Module, prompts: list[list[int]],
                    rows: np.ndarray) -> tuple[mx.array, list, list[list[int]]]:
    """Prompts prefilled in the model's own cache (sliding windows, state-space layers, hybrids), those of one
    length together (they need no padding: 100 held-out questions of 9 lengths are 9 passes, not 100), each
    prompt's cache cut out of its batch, then every layer's caches merged into mlx-lm's batch cache of that
    kind, one row per group member. Also the prompt indices of each prefill pass, in order."""
    by_length: dict[int, list[int]] = {}
    for index, prompt in enumerate(prompts):
        by_length.setdefault(len(prompt), []).append(index)
    per_prompt: list[list] = [[] for _ in prompts]
    last: list[mx.array] = [mx.array(0)] * len(prompts)
    for indices in by_length.values():
        cache = make_prompt_cache(model)
        logits = last_position_logits(model, mx.array([prompts[i] for i in indices]), cache)
        mx.eval(logits, [c.state for c in cache])
        for row, index in enumerate(indices):
            per_prompt[index] = [_row_cache(layer_cache, row) for layer_cache in cache]
            last[index] = logits[row:row + 1]
    order = rows.tolist()
    merged = [type(per_prompt[0][layer]).merge([per_prompt[i][layer] for i in order])
              for layer in range(len(per_prompt[0]))]
    return mx.concatenate(last, axis=0)[mx.array(rows)], merged, list(by_length.values())


def _row_cache(cache, row: int):
    """One row of a batch-prefilled layer cache, as the cache one prompt alone would have: the hybrids' caches
    cut themselves out (`extract`); a KV cache (plain or rotating) is its arrays' row and the same offsets."""
    if hasattr(cache, "extract"):
        return cache.extract(row)
    return type(cache).from_state(tuple(part[row:row + 1] if isinstance(part, mx.array) else part
                                        for part in cache.state))


def generate(
    model: nn.Module,
    prompts: list[list[int]],
    group_size: int,
    max_tokens: int,
    eos_ids: set[int],
    pad_id: int,
    settings: SamplingSettings,
    key: mx.array,
    capture: bool = False,
    kv_bits: int = 0,
    lookup: bool = True,
) -> Rollout:
    """Sample `group_size` completions for each prompt, all in one batch. `capture`: keep the frozen blocks'
    output at every position (frozen_prefix.py; the model must have been given frozen_prefix.install).
    `kv_bits` 8 or 4: the decode's KV cache quantized (plain-cache models; 0: kept in the model's dtype).
    `lookup`: the last rows decode several tokens a step where their own text guesses them (lookup_decoding.py)."""
    with frozen_prefix.recording(model) if capture else nullcontext([]) as recorded, cpu_kernels(model):
        return _generate(model, prompts, group_size, max_tokens, eos_ids, pad_id, settings, key, recorded, kv_bits,
                         lookup)


# Finished rows leave the decode batch once they are this share of it: dropping copies the kept rows' cache
# once (about one decode step's read of it), and every later step then computes only the rows still going.
DROP_SHARE = 0.25


@dataclass
class _Span:
    """Decode steps run on one set of rows: which rows (of the whole batch), their sampled ids and log-probs per
    step, and how many frozen-block outputs had been recorded when the span ended."""

    rows: np.ndarray
    ids: list[mx.array] = field(default_factory=list)
    logprobs: list[mx.array] = field(default_factory=list)
    recorded_end: int = 0


def _generate(model: nn.Module, prompts: list[list[int]], group_size: int, max_tokens: int, eos_ids: set[int],
              pad_id: int, settings: SamplingSettings, key: mx.array, recorded: list[mx.array],
              kv_bits: int = 0, lookup: bool = True) -> Rollout:
    start = time.perf_counter()
    rows = np.repeat(np.arange(len(prompts)), group_size)
    # the KV cache, the rollout's largest buffer, goes with _decode's frame: before the kept states are joined
    spans, batches, prefilled = _decode(model, prompts, rows, max_tokens, eos_ids, pad_id, settings, key, recorded,
                                        kv_bits, lookup)
    ids_np, logprobs_np = _token_arrays(spans, len(rows))
    prefix = _captured(recorded, prefilled, prompts, batches, rows, spans) if recorded else None
    recorded.clear()  # the per-step pieces, now joined
    completions, completion_logprobs, truncated = _cut_at_eos(ids_np, logprobs_np, eos_ids, max_tokens)
    return Rollout(
        prompts=[prompts[i] for i in np.repeat(np.arange(len(prompts)), group_size)],
        completions=completions,
        logprobs=completion_logprobs,
        truncated=truncated,
        seconds=time.perf_counter() - start,
        prefix=prefix,
    )


def _prefill(model: nn.Module, prompts: list[list[int]], rows: np.ndarray, pad_id: int, max_tokens: int,
             kv_bits: int) -> tuple[mx.array, list, list[list[int]], bool]:
    """(last logits, KV cache, the prompts' prefill batches, whether the cache is plain) for the decode."""
    capacity = max(len(p) for p in prompts) + max_tokens
    plain = has_plain_kv_cache(model, capacity)
    if plain:
        # a cache to be quantized keeps only the prompts in the model's dtype, until it is
        logits, cache = prefill_plain(model, prompts, pad_id, capacity - max_tokens if kv_bits else capacity, rows)
        batches = [list(range(len(prompts)))]  # one left-padded pass
        if kv_bits:
            cache = [QuantizedBatchKVCache.of(layer_cache, kv_bits, capacity) for layer_cache in cache]
    else:
        logits, cache, batches = _prefill_merged(model, prompts, rows)
    return logits, cache, batches, plain


def _decode(model: nn.Module, prompts: list[list[int]], rows: np.ndarray, max_tokens: int, eos_ids: set[int],
            pad_id: int, settings: SamplingSettings, key: mx.array, recorded: list[mx.array],
            kv_bits: int, lookup: bool) -> tuple[list[_Span], list[list[int]], int]:
    """Prefill, then sample every row until all have ended or `max_tokens`: the spans of rows decoded together
    (finished rows leave the batch), the prefill batches, and how many frozen-block outputs the prefill
    recorded. Many rows decode one token a step; the last few look their next tokens up in their own text
    (lookup_decoding.py) and take several a step."""
    logits, cache, batches, plain = _prefill(model, prompts, rows, pad_id, max_tokens, kv_bits)
    state = _Decoding(cache, [_Span(np.arange(len(rows)))], mx.zeros((len(rows),), dtype=mx.bool_),
                      mx.array(sorted(eos_ids)), recorded, len(recorded))

    keys = mx.random.split(key, max_tokens)
    # lookup needs a cache that can drop the refused guesses' positions (a plain one, unquantized)
    texts = LookupTexts(prompts, rows, state.spans) if lookup and plain and not kv_bits else None
    carried = None
    t, passes = 0, 0
    while True:
        span = state.spans[-1]
        draw_rows = None if len(span.rows) == len(rows) else (mx.array(span.rows), len(rows))
        ids, logprobs = sample_tokens(logits, settings, keys[t], draw_rows, carried)
        state.emit(ids, logprobs)
        if t + 1 == max_tokens:
            break
        lookup_now = texts and len(span.rows) <= LOOKUP_ROWS
        guesses = texts.guesses(span, min(LOOKUP_TOKENS, max_tokens - t - 2)) if lookup_now else None
        if guesses is None:
            logits, carried = model(ids[:, None], cache=cache)[:, -1, :], None
            t += 1
            # the step's ids and log-probs too: left lazy, each would keep its step's [N, V] logits alive
            # until decoding ends (5 GB for 32 rows x 152k x 256 steps in fp32)
            mx.async_eval(logits, state.finished, ids, logprobs)
        else:
            guesses = mx.array(guesses)
            raw = model(mx.concatenate([ids[:, None], guesses], axis=1), cache=cache)
            kept, guess_logprobs = check_guesses(sampling_logits(raw, settings), guesses, settings.temperature == 0,
                                                 mx.random.split(keys[t])[1], draw_rows)
            emitted, carried = state.keep_guesses(guesses, guess_logprobs, kept)
            logits = raw[:, emitted]
            t += emitted + 1
        passes += 1
        # Checking for the end costs a sync; every few steps keeps decode mostly asynchronous.
        if passes % 4 == 0 or guesses is not None:
            done = np.array(state.finished)
            if done.all():
                break
            if plain and done.sum() >= DROP_SHARE * len(done):
                kept_rows = state.drop_finished(done)
                logits = logits[kept_rows]
                carried = None if carried is None else (carried[0][kept_rows], carried[1][kept_rows])
    state.spans[-1].recorded_end = len(recorded)
    return state.spans, batches, state.prefilled


@dataclass
class _Decoding:
    """What the decode loop carries from step to step: the cache, the spans of rows decoded together (the last
    one current), which rows have ended, and the frozen-block outputs recorded (the prefill's first)."""

    cache: list
    spans: list[_Span]
    finished: mx.array
    eos: mx.array
    recorded: list[mx.array]
    prefilled: int

    def emit(self, ids: mx.array, logprobs: mx.array) -> None:
        """One token for each of the current span's rows."""
        span = self.spans[-1]
        span.ids.append(ids)
        span.logprobs.append(logprobs)
        self.finished = self.finished | (ids[:, None] == self.eos[None, :]).any(axis=-1)

    def keep_guesses(self, guesses: mx.array, logprobs: mx.array,
                     kept: np.ndarray) -> tuple[int, tuple[mx.array, mx.array] | None]:
        """Emit the guessed tokens every row kept (the fewest any row kept), drop the rest's positions from
        the cache and the recorded states, and return how many were emitted and what the next draw carries:
        per row, its next guessed token when it kept it (emitted next), else the refused token (never drawn)."""
        emitted = int(kept.min())
        for j in range(emitted):
            self.emit(guesses[:, j], logprobs[:, j])
        unused = guesses.shape[1] - emitted
        if not unused:
            return emitted, None
        trim_positions(self.cache, unused)
        if len(self.recorded) > self.prefilled:
            self.recorded[-1] = self.recorded[-1][:, :emitted + 1]
        return emitted, (mx.where(mx.array(kept > emitted), guesses[:, emitted], -1),
                         mx.where(mx.array(kept == emitted), guesses[:, emitted], -1))

    def drop_finished(self, done: np.ndarray) -> mx.array:
        """A new span of the rows still going; their cache rows kept. Returns their indices in the old span."""
        keep = np.flatnonzero(~done)
        self.spans[-1].recorded_end = len(self.recorded)
        self.spans.append(_Span(self.spans[-1].rows[keep]))
        kept_rows = mx.array(keep)
        self.finished = self.finished[kept_rows]
        keep_rows(self.cache, kept_rows)
        return kept_rows


def trim_positions(cache: list, count: int) -> None:
    """Drop the last `count` positions of every layer's cache (the refused guesses')."""
    for layer_cache in {id(c): c for c in cache}.values():
        layer_cache.trim(count)


def _token_arrays(spans: list[_Span], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Every row's sampled ids and log-probs, [n, steps], from the spans that decoded them."""
    steps = sum(len(s.ids) for s in spans)
    ids_np = np.full((n, steps), -1, dtype=np.int64)  # a dropped row's later steps: never read (it has ended)
    logprobs_np = np.zeros((n, steps), dtype=np.float32)
    done_steps = 0
    for s in spans:
        if s.ids:
            ids_np[s.rows, done_steps:done_steps + len(s.ids)] = np.array(mx.stack(s.ids, axis=1))
            logprobs_np[s.rows, done_steps:done_steps + len(s.ids)] = np.array(mx.stack(s.logprobs, axis=1))
        done_steps += len(s.ids)
    return ids_np, logprobs_np


def _cut_at_eos(ids_np: np.ndarray, logprobs_np: np.ndarray, eos_ids: set[int],
                max_tokens: int) -> tuple[list[list[int]], list[list[float]], list[bool]]:
    """Each row's completion up to its first end token (kept), or cut at `max_tokens` (truncated)."""
    completions, completion_logprobs, truncated = [], [], []
    for row_ids, row_lps in zip(ids_np.tolist(), logprobs_np.tolist()):
        end = next((i for i, tok in enumerate(row_ids) if tok in eos_ids), None)
        if end is None:
            completions.append(row_ids[:max_tokens])
            completion_logprobs.append(row_lps[:max_tokens])
            truncated.append(True)
        else:
            completions.append(row_ids[: end + 1])
            completion_logprobs.append(row_lps[: end + 1])
            truncated.append(False)
    return completions, completion_logprobs, truncated


def keep_rows(cache: list, rows: mx.array) -> None:
    """Only `rows` of each layer's batch cache stay (finished rows leave the decode batch). Not
    BatchKVCache.filter: it also cuts the padding the kept rows share off the front, which shrinks the buffer
    preallocated for the whole rollout, so the next token would grow it by a whole block again."""
    for layer_cache in {id(c): c for c in cache}.values():
        layer_cache.keys = tree_map(lambda x: x[rows], layer_cache.keys)
        layer_cache.values = tree_map(lambda x: x[rows], layer_cache.values)
        if isinstance(layer_cache, BatchKVCache):
            layer_cache.offset = layer_cache.offset[rows]
            layer_cache.left_padding = layer_cache.left_padding[rows]


def _captured(recorded: list[mx.array], prefilled: int, prompts: list[list[int]], batches: list[list[int]],
              rows: np.ndarray, spans: list[_Span]) -> Captured:
    """The recorded frozen-block outputs as per-row states: the prefill's (per prompt; `batches`: the prompts of
    each prefill pass), then one per decode step (the fed-back completion tokens) while the row was decoded."""
    per_prompt = frozen_prefix.capture_from_prefill(recorded[:prefilled], prompts, batches)
    pieces: list[list[mx.array]] = [[] for _ in rows]
    begin = prefilled
    for span in spans:
        if span.recorded_end > begin:
            decoded = mx.concatenate(recorded[begin:span.recorded_end], axis=1)
            for r, row in enumerate(span.rows.tolist()):
                pieces[row].append(decoded[r])
        begin = span.recorded_end
    empty = mx.zeros((0, per_prompt[0].shape[-1]), dtype=per_prompt[0].dtype)
    completion = [empty if not p else p[0] if len(p) == 1 else mx.concatenate(p) for p in pieces]
    mx.eval(completion, per_prompt)
    return Captured([per_prompt[i] for i in rows.tolist()], completion)


def decode_completion(tokenizer, ids: list[int], eos_ids: set[int]) -> str:
    """Completion text without the trailing EOS token."""
    if ids and ids[-1] in eos_ids:
        ids = ids[:-1]
    return tokenizer.decode(ids)
