"""Data-parallel GRPO over `mx.distributed` (launched by `mlx.launch`); see docs/DISTRIBUTED.md.

Every rank runs the same trainer on its own share of each step's prompts:

- prompts: the ranks split one global data order, so W ranks with batch b roll out exactly the
  prompts one process with batch W*b would (rank r takes the r-th slice of each W*b block). Groups
  never straddle ranks, so group advantages are rank-local; `scale_rewards: batch` divides by the
  std of the whole global batch.
- the update: every rank divides its loss by the global batch's sequence and token counts
  (`loss_totals`, one small all_sum), so its loss and gradient are exactly its share of the global
  batch's; they are summed across ranks (`sum_update`) before clipping, and the update equals the
  single-process update on the whole batch for every loss type. Micro-batches inside a rank work the
  same way (see update.py).
- metrics: gather, then summarise. Each rank's raw per-completion arrays (scores, advantages,
  lengths, truncation, correctness...) are gathered whole into one `StepData` of the global batch,
  from which the recorder computes every metric once, exactly as one process would. What is local by
  nature is reduced as sums: the update's token means weighted by each rank's tokens, phase seconds
  and peaks as the slowest rank's. (Loss and gradient norm are already the global batch's.) The
  few metrics that components compute per rank (adaptive window, S-GRPO exits, reward-function
  step metrics) are averaged over ranks. Held-out evaluation is split across ranks and its rows'
  results gathered.
- output: only rank 0 writes the run directory, TensorBoard, W&B and checkpoints, and prints.

With one process (no launcher) `init_world()` gives a `World` of size 1 whose every method hands its
input back untouched: the single-process trainer pays nothing.
"""

from __future__ import annotations

import dataclasses
import json
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_map

from . import grpo
from .common.errors import UserError
from .data import PromptOrder
from .telemetry.metrics.step_data import StepData
from .update import TrainBatch


@dataclass
class ShardedOrder(PromptOrder):
    """The global prompt order, of which this rank takes its slice of every step's block."""

    rank: int = 0
    size: int = 1

    def next_indices(self, count: int) -> list[int]:
        block = super().next_indices(count * self.size)
        return block[self.rank * count:(self.rank + 1) * count]


@dataclass
class World:
    """This process's place in the data-parallel group; size 1 = a single process."""

    group: Any = None
    rank: int = 0
    size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    # ------------------------------------------------------------------ communication

    def gather_json(self, obj: Any) -> list[Any]:
        """Every rank's JSON-able `obj`, in rank order (NaN and Inf survive)."""
        data = np.frombuffer(json.dumps(obj, default=float).encode(), dtype=np.uint8)
        lengths = np.array(mx.distributed.all_gather(mx.array([data.size], dtype=mx.int32), group=self.group))
        padded = np.zeros(int(lengths.max()), dtype=np.uint8)
        padded[:data.size] = data
        rows = np.array(mx.distributed.all_gather(mx.array(padded), group=self.group)).reshape(self.size, -1)
        return [json.loads(rows[i, :n].tobytes()) for i, n in enumerate(lengths)]

    def from_main(self, value: Any) -> Any:
        """Rank 0's JSON-able `value` on every rank."""
        return self.gather_json(value)[0] if self.distributed else value

    def lost_peer(self, err: BaseException) -> bool:
        """Whether `err` is a collective failing because another rank went away (MLX's ring backend says
        '[ring] connection to a peer was lost'; others name the peer or the connection)."""
        text = str(err).lower()
        return self.distributed and ("[ring]" in text or "peer" in text or "connection" in text)

    def agree(self, request: str | None) -> str | None:
        """The first rank's stop request, if any rank has one: every rank then stops at the same step."""
        if not self.distributed:
            return request
        return next((r for r in self.gather_json(request) if r is not None), None)

    # ------------------------------------------------------------------ setup

    def shard_order(self, order: PromptOrder) -> PromptOrder:
        if not self.distributed:
            return order
        return ShardedOrder(order.num_rows, order.seed, order.epoch, order.position, self.rank, self.size)

    def shard_rows(self, rows: list[dict]) -> list[dict]:
        """This rank's slice of the held-out rows (evaluation metrics are combined weighted by count)."""
        return rows[self.rank::self.size] if self.distributed else rows

    def sample_key(self, key: mx.array) -> mx.array:
        """A rank's own sampling key, so ranks do not draw the same random numbers; rank 0 keeps `key`."""
        if self.rank == 0:
            return key
        return mx.random.split(key, self.size)[self.rank]

    def broadcast_parameters(self, model: nn.Module) -> None:
        """Give every rank rank 0's trainable weights (LoRA initialisation, or a mismatched download)."""
        if not self.distributed:
            return

        def from_main(p: mx.array) -> mx.array:
            return mx.distributed.all_sum(p if self.is_main else mx.zeros_like(p), group=self.group)

        model.update(tree_map(from_main, model.trainable_parameters()))
        mx.eval(model.parameters())

    def ranks_on_this_host(self) -> int:
        """How many ranks of the launch run on this host (`mlx.launch -n 2` on one Mac: 2)."""
        if not self.distributed:
            return 1
        return self.gather_json(socket.gethostname()).count(socket.gethostname())

    def describe(self) -> dict[str, Any]:
        """For run.json's device section: how many processes, and where each ran."""
        if not self.distributed:
            return {"world_size": 1}
        return {"world_size": self.size, "rank_hosts": self.gather_json(socket.gethostname())}

    # ------------------------------------------------------------------ the update

    def loss_totals(self, batch: TrainBatch) -> grpo.LossTotals:
        """The global batch's sequences and active tokens: every rank divides its loss by them."""
        if not self.distributed:
            return grpo.LossTotals(batch.num_sequences, batch.num_tokens)
        sizes = mx.distributed.all_sum(mx.array([batch.num_sequences, batch.num_tokens]), group=self.group)
        return grpo.LossTotals(*(int(v) for v in sizes.tolist()))

    def sum_update(self, loss: mx.array, grads: Any) -> tuple[mx.array, Any]:
        """Each rank's loss and gradient are its share of the global batch's: their sums are the whole."""
        if not self.distributed:
            return loss, grads
        return (mx.distributed.all_sum(loss, group=self.group),
                tree_map(lambda g: mx.distributed.all_sum(g, group=self.group), grads))

    def group_advantages(self, rewards: mx.array, group_size: int, scale: str) -> mx.array:
        """grpo.group_advantages of this rank's rewards; `batch` scaling uses the std of the global batch."""
        if scale != "batch" or not self.distributed:
            return grpo.group_advantages(rewards, group_size, scale)
        parts = self.gather_json(np.array(rewards).tolist())
        everything = grpo.group_advantages(mx.array(np.concatenate(parts), dtype=mx.float32), group_size, scale)
        start = sum(len(p) for p in parts[:self.rank])
        return everything[start:start + rewards.size]

    # ------------------------------------------------------------------ metrics and output

    def gather_lists(self, *lists: list) -> list[list]:
        """Each JSON-able list concatenated over ranks, in rank order."""
        if not self.distributed:
            return list(lists)
        parts = self.gather_json(list(lists))
        return [[item for part in parts for item in part[k]] for k in range(len(lists))]

    def slowest(self, seconds: float) -> float:
        """The slowest rank's time: a phase ends when the last rank's does."""
        return max(self.gather_json(seconds)) if self.distributed else seconds

    def gather(self, data: StepData) -> StepData:
        """The global batch's StepData: per-completion arrays concatenated in rank order, the update's
        token means weighted by each rank's tokens, the slowest rank's seconds and peaks.

        The entropy dump and reward-function warnings stay this rank's.
        """
        if not self.distributed:
            return data
        parts = self.gather_json({
            "scores": data.scores.tolist(), "total": data.total.tolist(), "advantages": data.advantages.tolist(),
            "prompt_lengths": data.prompt_lengths.tolist(), "prompt_truncated": data.prompt_truncated.tolist(),
            "lengths": data.lengths.tolist(), "truncated": data.truncated.tolist(),
            "correct": None if data.correct is None else data.correct.tolist(),
            "difficulty": data.difficulty, "trained_tokens": data.trained_tokens, "stats": data.update.stats,
            "texts": data.texts, "reasoning": data.reasoning, "predicted": data.predicted,
            "prompt_texts": data.prompt_texts, "answers": data.answers, "trajectories": data.trajectories,
            "seconds": data.seconds, "peaks": data.peak_memory, "components": data.component_metrics,
            "update_advantages": None if data.update_advantages is None else data.update_advantages.tolist(),
        })

        def joined(key: str, dtype: Any = float) -> np.ndarray:
            return np.concatenate([np.asarray(p[key], dtype=dtype) for p in parts])

        tokens = [p["trained_tokens"] for p in parts]
        stats = combine_update_stats([p["stats"] for p in parts], tokens)
        components = {name: float(np.mean([p["components"][name] for p in parts if name in p["components"]]))
                      for name in data.component_metrics}
        return dataclasses.replace(
            data,
            scores=np.concatenate([np.asarray(p["scores"], dtype=float).reshape(data.scores.shape[0], -1)
                                   for p in parts], axis=1),
            total=joined("total"), advantages=joined("advantages"), prompt_lengths=joined("prompt_lengths"),
            prompt_truncated=joined("prompt_truncated", bool), lengths=joined("lengths"),
            truncated=joined("truncated", bool), correct=None if data.correct is None else joined("correct", bool),
            difficulty=[level for p in parts for level in p["difficulty"]], trained_tokens=sum(tokens),
            texts=[t for p in parts for t in p["texts"]], reasoning=[t for p in parts for t in p["reasoning"]],
            predicted=[t for p in parts for t in p["predicted"]],
            prompt_texts=[t for p in parts for t in p["prompt_texts"]],
            answers=[a for p in parts for a in p["answers"]],
            trajectories=None if data.trajectories is None else [t for p in parts for t in p["trajectories"]],
            update=dataclasses.replace(data.update, stats=stats),
            seconds={name: max(p["seconds"][name] for p in parts) for name in data.seconds},
            peak_memory={name: max(p["peaks"][name] for p in parts) for name in data.peak_memory},
            component_metrics=components,
            update_advantages=None if data.update_advantages is None else joined("update_advantages"))

    # ------------------------------------------------------------------ checkpoints

    def checkpoint_state(self) -> dict[str, int]:
        return {"world_size": self.size}

    def check_resume(self, state: dict[str, Any], checkpoint: Path) -> None:
        """Refuse to resume with another number of processes: the batch (and so the run) would change."""
        saved = int(state.get("world_size", 1))
        if saved != self.size:
            raise UserError(f"{checkpoint}: saved by a run of {saved} process(es), this launch has {self.size}; "
                            f"resume with the same number (mlx.launch -n/--hostfile with {saved} "
                            f"{'ranks' if saved > 1 else 'rank, or plain mlx-grpo train --resume'})")


def combine_update_stats(per_rank: list[dict[str, float]], tokens: list[int]) -> dict[str, float]:
    """The update's statistics of the global batch from each rank's, over its `tokens` completion tokens.

    Token means are weighted by tokens; a `<x>_std` beside `<x>_mean` is pooled (exact population std);
    `pg_loss` is a sum (each rank holds its share of the global aggregate, see `loss_totals`); `ratio_p95`, a
    quantile, is the token-weighted mean of the ranks' (approximate).
    """
    total = max(1, sum(tokens))

    def weighted(values: list[float]) -> float:
        return sum(v * n for v, n in zip(values, tokens)) / total

    out: dict[str, float] = {}
    for name in per_rank[0]:
        values = [stats[name] for stats in per_rank]
        mean_name = name[:-len("_std")] + "_mean" if name.endswith("_std") else None
        if name == "pg_loss":
            out[name] = float(np.sum(values))
        elif name.endswith("_min") or name.endswith("_max"):  # extremes over completions: over ranks too
            out[name] = float(min(values) if name.endswith("_min") else max(values))
        elif mean_name in per_rank[0]:
            means = [stats[mean_name] for stats in per_rank]
            mean = weighted(means)
            out[name] = float(np.sqrt(weighted([v * v + (m - mean) ** 2 for v, m in zip(values, means)])))
        else:
            out[name] = weighted(values)
    return out


def init_world() -> World:
    """The launch's group (`mlx.launch` sets it up), or a single-process World."""
    group = mx.distributed.init()
    if group.size() == 1:
        return World()
    return World(group, group.rank(), group.size())
