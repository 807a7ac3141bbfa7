"""Data-parallel GRPO over `mx.distributed` (launched by `mlx.launch`); see docs/DISTRIBUTED.md.

Every rank runs the same trainer on its own share of each step's prompts:

- prompts: the ranks split one global data order, so W ranks with batch b roll out exactly the
  prompts one process with batch W*b would (rank r takes the r-th slice of each W*b block). Groups
  never straddle ranks, so group advantages are rank-local; `scale_rewards: batch` divides by the
  std of the whole global batch.
- the update: gradients are averaged across ranks (`nn.average_gradients`) before clipping, so the
  update equals the single-process update on the whole batch. That holds as is for `grpo` (mean over
  sequences) and `dr_grpo` (constant denominator), since every rank holds the same number of
  sequences. `bnpo` and `dapo` divide by the active-token count, which differs between ranks: each
  rank's loss and gradient are rescaled by W * M_r / M (M_r its tokens, M the global count) before
  averaging, which turns its divisor into the global count and the average into the big-batch update.
- metrics: each rank's step record is gathered and combined by the rules of `rank_metrics`; the
  per-completion arrays (rewards, advantages, lengths) are gathered whole, so the reward tracker,
  histograms and final summaries see the global batch. Held-out evaluation is split across ranks.
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
from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_map

from . import grpo
from .data import PromptOrder
from .errors import UserError
from .rank_metrics import combine_records
from .telemetry.sinks import SinkSet

# Loss types whose denominator is the active-token count of the batch (see grpo.grpo_loss).
TOKEN_NORMALISED = ("bnpo", "dapo")


@dataclass
class ShardedOrder(PromptOrder):
    """The global prompt order, of which this rank takes its slice of every step's block."""

    rank: int = 0
    size: int = 1

    def next_indices(self, count: int) -> list[int]:
        block = super().next_indices(count * self.size)
        return block[self.rank * count:(self.rank + 1) * count]


class SilentRunDir:
    """Stands in for the run-directory writer on ranks other than 0: same calls, writes nothing."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.info: dict[str, Any] = {}

    def start(self, name: str, *args: Any, run_id: str | None = None, **kwargs: Any) -> dict[str, Any]:
        self.info = {"name": name, "run_id": run_id}
        return self.info

    def write_metrics(self, *args, **kwargs) -> None:
        pass

    def write_samples(self, *args, **kwargs) -> None:
        pass

    def write_alert(self, *args, **kwargs) -> None:
        pass

    def write_final_metrics(self, *args, **kwargs) -> None:
        pass

    def finish(self, status: str = "finished") -> None:
        pass


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

    def describe(self) -> dict[str, Any]:
        """For run.json's device section: how many processes, and where each ran."""
        if not self.distributed:
            return {"world_size": 1}
        return {"world_size": self.size, "rank_hosts": self.gather_json(socket.gethostname())}

    # ------------------------------------------------------------------ the update

    def wrap_loss_and_grad(self, loss_and_grad: Callable, loss_type: str) -> Callable:
        """`loss_and_grad` whose loss and gradients are those of the global batch, identical on every rank."""
        if not self.distributed:
            return loss_and_grad

        def averaged(model, batch, *args):
            (loss, (stats, logp)), grads = loss_and_grad(model, batch, *args)
            if loss_type in TOKEN_NORMALISED:
                total = mx.distributed.all_sum(mx.array(float(batch.num_tokens)), group=self.group).item()
                # This rank divided by its own M_r; W * M_r / M makes it M / W, and the average then sums / M.
                scale = self.size * batch.num_tokens / max(total, 1.0)
                loss = loss * scale
                grads = tree_map(lambda g: g * scale, grads)
                stats = {**stats, "pg_loss": stats["pg_loss"] * scale}
            grads = nn.average_gradients(grads, group=self.group)
            loss = mx.distributed.all_sum(loss, group=self.group) / self.size
            return (loss, (stats, logp)), grads

        return averaged

    def group_advantages(self, rewards: mx.array, group_size: int, scale: str) -> mx.array:
        """grpo.group_advantages of this rank's rewards; `batch` scaling uses the std of the global batch."""
        if scale != "batch" or not self.distributed:
            return grpo.group_advantages(rewards, group_size, scale)
        parts = self.gather_json(np.array(rewards).tolist())
        everything = grpo.group_advantages(mx.array(np.concatenate(parts), dtype=mx.float32), group_size, scale)
        start = sum(len(p) for p in parts[:self.rank])
        return everything[start:start + rewards.size]

    # ------------------------------------------------------------------ metrics and output

    def reduce_metrics(self, record: dict[str, float]) -> dict[str, float]:
        """One record of the whole step from every rank's record (see rank_metrics)."""
        if not self.distributed:
            return record
        return combine_records(self.gather_json(record))

    def reduce_step(self, result: Any) -> Any:
        """A StepResult of the global batch: combined metrics and the gathered per-completion arrays.

        Samples (for samples.jsonl) stay rank 0's; reward-function warnings stay on their rank.
        """
        if not self.distributed:
            return result
        parts = self.gather_json({"metrics": result.metrics, "total": result.rewards_total.tolist(),
                                  "scores": result.scores.tolist(), "advantages": result.advantages.tolist(),
                                  "lengths": result.lengths.tolist()})

        def joined(key: str) -> np.ndarray:
            return np.concatenate([np.asarray(p[key], dtype=float) for p in parts])

        scores = np.concatenate([np.asarray(p["scores"], dtype=float).reshape(result.scores.shape[0], -1)
                                 for p in parts], axis=1)
        return dataclasses.replace(result, metrics=combine_records([p["metrics"] for p in parts]),
                                   rewards_total=joined("total"), scores=scores,
                                   advantages=joined("advantages"), lengths=joined("lengths"))

    def sinks(self, make: Callable[[], SinkSet], run_dir: Path) -> SinkSet:
        """Rank 0's sinks from `make()`; other ranks get a set that records nothing."""
        return make() if self.is_main else SinkSet(SilentRunDir(run_dir))  # type: ignore[arg-type]

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


def init_world() -> World:
    """The launch's group (`mlx.launch` sets it up), or a single-process World."""
    group = mx.distributed.init()
    if group.size() == 1:
        return World()
    return World(group, group.rank(), group.size())
