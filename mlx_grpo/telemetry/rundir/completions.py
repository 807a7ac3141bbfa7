"""Every completion of every step, kept: `completions/step_<NNNNNN>.jsonl.gz` in the run directory.

One gzip-compressed JSONL file per step, one object per completion (B x G of them), prompt by prompt:

    {"step": 12, "prompt_index": 3, "completion_index": 5, "prompt": "...", "answer": "...",
     "completion": "...", "reasoning": "...", "predicted": "...", "rewards": {"<fn>": 1.0 or null},
     "total": 4.5, "advantage": 0.71, "length": 17, "truncated": false, "correct": true or null}

`completion_rows` builds these rows once a step (the recorder calls it); samples.jsonl holds a selection of
the same rows (`sample_rows`), so a sample and its group join by (step, prompt_index).

One format, not Parquet with a JSONL fallback: a step is ~128 short rows, where Parquet's per-file
metadata costs more than its columns save, gzip already collapses the prompt repeated G times, and every
reader (report, replay, the dashboard, which never imports pyarrow) reads the same file with the standard
library. A file is written whole (temp file, then rename), so a reader never sees half a step.

`CompletionsWriter`, a sink of `Completions` events, stops adding files once the directory holds `max_mb`
(and says so once, through `warn`); readers
parse through `loads_object` and skip what does not parse. Imports no mlx.
"""

from __future__ import annotations

import gzip
import math
import os
import tempfile
import zlib
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ...common.user_files import read_regular_bytes
from ..events import Completions, Sink
from .layout import RunPaths
from .writer import clipped_text, dumps_line, loads_object


def completion_rows(*, step: int, prompts: Sequence[str], answers: Sequence[Any], texts: Sequence[str],
                    reasoning: Sequence[str | None], predicted: Sequence[str | None], group_size: int,
                    reward_names: Sequence[str], scores: np.ndarray, total: np.ndarray, advantages: np.ndarray,
                    lengths: np.ndarray, truncated: np.ndarray, correct: np.ndarray | None,
                    trajectories: Sequence[dict] | None = None) -> list[dict]:
    """The step's rows: completion i belongs to prompt i // group_size (`scores` is [F, N], NaN = no score).
    Texts are cut to the run directory's one limit (`clipped_text`). A multi-turn run's rows also hold the
    trajectory (`trajectory_fields`)."""
    rows = []
    for i, text in enumerate(texts):
        g = i // group_size
        rows.append({
            "step": int(step), "prompt_index": g, "completion_index": i % group_size,
            "prompt": clipped_text(prompts[g]), "answer": clipped_text(answers[g]), "completion": clipped_text(text),
            "reasoning": clipped_text(reasoning[i]), "predicted": clipped_text(predicted[i]),
            "rewards": {name: _number(scores[f, i]) for f, name in enumerate(reward_names)},
            "total": _number(total[i]), "advantage": _number(advantages[i]), "length": int(lengths[i]),
            "truncated": bool(truncated[i]), "correct": None if correct is None else bool(correct[i]),
            **(trajectory_fields(trajectories[i]) if trajectories is not None else {}),
        })
    return rows


def trajectory_fields(trajectory: dict) -> dict:
    """A multi-turn completion's story: `turns` ([{"role": "assistant" | "environment", "text": ...}], the
    environment's turns being tool results and template text), `answer_text` (the model's answer, what rewards
    read; "" when it gave none), and the columns rewards may take (`tool_calls`, `tool_failures`,
    `environment_reward`, `turns_taken`), so `replay` rescores without calling a tool again."""
    return {"turns": [{"role": t["role"], "text": clipped_text(t["text"])} for t in trajectory["turns"]],
            "answer_text": clipped_text(trajectory["answer_text"]), "tool_calls": int(trajectory["tool_calls"]),
            "tool_failures": int(trajectory["tool_failures"]),
            "environment_reward": _number(trajectory["environment_reward"]),
            "turns_taken": int(trajectory["turns_taken"])}


def sample_rows(rows: Sequence[dict], group_size: int, count: int) -> list[dict]:
    """samples.jsonl's selection of a step's rows: the first completion of each of the first `count` groups."""
    return [row for row in rows[: count * group_size : group_size]]


def _number(value: Any) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


class CompletionsWriter(Sink):
    """Writes each step's file until the directory holds `max_mb` megabytes (0: no cap); `warn` hears, once,
    that the cap was reached."""

    name = "completions"

    def __init__(self, run_dir: str | Path, max_mb: float, warn: Callable[[str], None] = print) -> None:
        self.paths = RunPaths(run_dir)
        self.dir = self.paths.completions
        self.max_bytes = int(max_mb * 1e6)
        self.warn = warn
        # a resumed run counts what its first part wrote
        self.used = sum(p.stat().st_size for p in self.paths.completions_files().values())
        self.full = False

    def handle(self, event: Any) -> None:
        """Write a step's file (a `Completions` event); other events are not this sink's."""
        if isinstance(event, Completions):
            self.write(event.step, event.rows)

    def write(self, step: int, rows: Sequence[dict]) -> None:
        """Write the step's file, unless the cap stopped the writer."""
        if self.full or not rows:
            return
        text = "".join(dumps_line(row) + "\n" for row in rows)
        data = gzip.compress(text.encode("utf-8"), compresslevel=6, mtime=0)
        if self.max_bytes and self.used + len(data) > self.max_bytes:
            self.full = True
            self.warn(f"warning: completions/ reached its cap of {self.max_bytes / 1e6:g} MB at step {step}: later "
                      "steps' completions are not kept (raise completions_max_mb, or 0 for no cap)")
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".step.", suffix=".tmp", dir=self.dir)
        try:
            os.fchmod(fd, 0o644)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, self.paths.completions_step(step))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self.used += len(data)


def completion_steps(run_dir: str | Path) -> list[int]:
    """The steps whose completions the run directory holds, in order."""
    return list(RunPaths(run_dir).completions_files())


MAX_STEP_FILE_BYTES = 256 << 20  # compressed; a default step's file is ~2 KB
MAX_STEP_TEXT_BYTES = 64 << 20  # inflated: a step of 64 MB of completions is a gzip bomb, not a run's


def read_step(run_dir: str | Path, step: int, display: bool = False) -> list[dict]:
    """One step's completions; rows that do not parse (or a damaged file's tail) are left out, and so is a
    file that is not a regular one (a FIFO, a device, a directory). `display`: for a reader that prints
    them, control characters in the texts made visible (replay re-scores the raw texts, so it does not)."""
    try:
        compressed = read_regular_bytes(RunPaths(run_dir).completions_step(step), MAX_STEP_FILE_BYTES)
    except OSError:
        return []
    raw = inflate(compressed, MAX_STEP_TEXT_BYTES)
    rows = []
    for line in raw.split(b"\n"):
        row = loads_object(line, display) if line else None
        if row is not None and isinstance(row.get("prompt_index"), int):
            rows.append(row)
    return rows


def inflate(compressed: bytes, limit: int) -> bytes:
    """A gzip file's content, member after member, cut at `limit` bytes (a gzip bomb inflates no further)
    and at the first damage (a truncated or damaged file yields what comes before it)."""
    out, size, data = [], 0, compressed
    while data and size < limit:
        member = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            while size < limit:
                chunk = member.decompress(data, min(1 << 20, limit - size))
                data = member.unconsumed_tail
                out.append(chunk)
                size += len(chunk)
                if member.eof or not (chunk or data):
                    break
        except zlib.error:
            break
        if not member.eof:
            break
        data = member.unused_data
    return b"".join(out)[:limit]


def read_all(run_dir: str | Path, steps: Iterable[int] | None = None, display: bool = False) -> list[dict]:
    """The completions of the given steps (all kept steps by default), step by step."""
    return [row for step in (completion_steps(run_dir) if steps is None else steps)
            for row in read_step(run_dir, step, display)]


def groups(rows: Sequence[dict]) -> dict[int, list[dict]]:
    """A step's rows by prompt index, each group in completion order."""
    out: dict[int, list[dict]] = {}
    for row in rows:
        out.setdefault(int(row["prompt_index"]), []).append(row)
    for group in out.values():
        group.sort(key=lambda r: r.get("completion_index") if isinstance(r.get("completion_index"), int) else 0)
    return dict(sorted(out.items()))


def ordered_totals(rows: Sequence[dict]) -> np.ndarray:
    """One step's total rewards in the heatmap's order (`order_groups`)."""
    return order_groups([np.array([_total(r) for r in group]) for group in groups(rows).values()])


def order_groups(by_group: list[np.ndarray]) -> np.ndarray:
    """Groups' total rewards in the heatmap's order: groups by mean reward, best first, and each group's
    completions best first (a group that taught nothing is a band of one colour)."""
    by_group = list(by_group)
    by_group.sort(key=lambda totals: -np.nanmean(totals) if np.isfinite(totals).any() else np.inf)
    return np.concatenate([np.sort(t)[::-1] for t in by_group]) if by_group else np.empty(0)


def _total(row: dict) -> float:
    value = row.get("total")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def reward_heatmap(rows: Sequence[dict], last: int | None = None) -> tuple[list[int], np.ndarray]:
    """(steps, matrix[example, step]) of the total reward of every kept completion, examples in
    `ordered_totals` order; NaN where a step had fewer. Rows without a prompt index (samples.jsonl's) are
    left out: a column needs the whole step. `last`: only the last so many steps."""
    by_step: dict[int, list[dict]] = {}
    for row in rows:
        if isinstance(row.get("prompt_index"), int) and isinstance(row.get("step"), int):
            by_step.setdefault(row["step"], []).append(row)
    steps = sorted(by_step)[-last:] if last else sorted(by_step)
    return steps, heatmap_matrix([ordered_totals(by_step[s]) for s in steps])


def heatmap_matrix(columns: Sequence[np.ndarray]) -> np.ndarray:
    """Steps' columns of totals side by side, matrix[example, step]; NaN below a shorter column."""
    height = max((len(c) for c in columns), default=0)
    matrix = np.full((height, len(columns)), np.nan)
    for j, column in enumerate(columns):
        matrix[:len(column), j] = column
    return matrix


def truncate_completions(run_dir: str | Path, step: int) -> None:
    """Remove the files of steps after `step` (a resume from its checkpoint writes them again)."""
    for later in completion_steps(run_dir):
        if later > step:
            RunPaths(run_dir).completions_step(later).unlink(missing_ok=True)
