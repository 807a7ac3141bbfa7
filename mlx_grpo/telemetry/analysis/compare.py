"""Compare finished (or running) runs side by side: what differs in their configs, how they ended.

Public API:

- `expand_run_dirs(paths) -> list[Path]`: run directories (a directory with run.json), or the run
  directories directly inside a directory that has none (a sweep directory); UserError otherwise.
- `load_summary(run_dir) -> RunSummary`: one run's status, config, world size and final numbers:
  final reward (the last logged `rewards/total/mean`, and `rewards/total/recent_mean`, the mean of the
  last 10 steps), held-out accuracy (final_metrics.json, else the last `eval/accuracy` logged), train
  accuracy (last `accuracy/train`), tokens/s over the whole run (sum of `tokens/total` / sum of
  `timing/step_s`) and wall time (last `timing/elapsed_s`). A torn last line is skipped.
- `run_config(info) -> dict`: a run's config (`RunInfo`) as dotted keys, plus `world_size`.
- `differing_keys(configs) -> list[str]`: dotted keys whose values differ between configs like that,
  leaving out keys that name the run rather than configure it (the dashboard's Config view uses it too);
  `config_differences(summaries)` is the same for loaded summaries.
- `value_text(value) -> str`: a config value in a table cell.
- `comparison_table(summaries, sort=None) -> rich.table.Table` and `comparison_json(summaries) -> list`.
- `table_console() -> rich.console.Console`: the terminal's width, or the table's own width when piped.

Imports no mlx.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from rich.console import Console
from rich.table import Table

from ...common.errors import UserError
from ..metrics.names import (
    ACCURACY_TRAIN,
    ELAPSED_SECONDS,
    EVAL_ACCURACY,
    REWARD_MEAN,
    REWARD_RECENT_MEAN,
    STEP_SECONDS,
    TOKENS_TOTAL,
)
from ..reward_names import reward_file, reward_name
from ..rundir.jsonl_tail import JsonlTail
from ..rundir.layout import RunPaths
from ..rundir.writer import RunInfo, read_json_object, read_run_info

# Keys that name or place a run; they always differ and say nothing about training.
NOT_CONFIG = ("run_name", "monitoring_dir", "base_dir", "wandb_run_name", "tensorboard_dir")
METRIC_COLUMNS = {  # summary attribute -> column title
    "final_reward": "reward",  # the last step's mean total reward
    "recent_reward": "reward10",  # mean over the last 10 steps
    "train_accuracy": "train acc",
    "eval_accuracy": "held-out",
    "tokens_per_s": "tok/s",
    "elapsed_s": "time",
}
# Wide enough for a table of several differing keys when the output is a file or a pipe.
SORT_KEYS = ("name", *METRIC_COLUMNS)


@dataclass
class RunSummary:
    """One run as `mlx-grpo compare` lists it: state, progress, flattened config and final numbers."""

    path: Path
    name: str
    status: str
    steps: int
    total_steps: int | None
    config: dict[str, Any] = field(default_factory=dict)  # flattened, dotted keys
    final_reward: float | None = None
    recent_reward: float | None = None
    train_accuracy: float | None = None
    eval_accuracy: float | None = None
    tokens_per_s: float | None = None
    elapsed_s: float | None = None


def expand_run_dirs(paths: Iterable[str | Path]) -> list[Path]:
    """The run directories named, or found one level under the folders named."""
    out: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if RunPaths(path).run_json.is_file():
            out.append(path)
            continue
        children = sorted(p for p in path.iterdir() if RunPaths(p).run_json.is_file()) if path.is_dir() else []
        if not children:
            raise UserError(f"{path}: not a run directory (no run.json), nor a directory of runs")
        out.extend(children)
    return out


def _flatten(mapping: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def load_summary(run_dir: Path) -> RunSummary:
    """The summary of one run directory (UserError when it holds no run)."""
    info = read_run_info(run_dir, display=True)
    if info is None:
        raise UserError(f"{run_dir}: run.json is missing or unreadable")
    summary = RunSummary(run_dir, info.name or run_dir.name, info.status or "unknown", 0, info.total_steps,
                         run_config(info))
    tokens = seconds = 0.0
    last: dict[str, float] = {}
    wanted = (REWARD_MEAN, REWARD_RECENT_MEAN, ACCURACY_TRAIN, EVAL_ACCURACY,
              ELAPSED_SECONDS)
    metrics = RunPaths(run_dir).metrics
    if metrics.is_file():
        for record in JsonlTail(metrics).poll(final=True).records:  # bad lines are skipped and counted
            step = _finite(record.get("step"))
            if step is not None:
                summary.steps = max(summary.steps, int(step))
                for name in wanted:
                    value = _finite(record.get(name))
                    if value is not None:
                        last[name] = value
                step_tokens, step_s = _finite(record.get(TOKENS_TOTAL)), _finite(record.get(STEP_SECONDS))
                if step_tokens is not None and step_s:
                    tokens += step_tokens
                    seconds += step_s
    final = read_json_object(RunPaths(run_dir).final_metrics, display=True) or {}
    summary.final_reward = last.get(REWARD_MEAN)
    summary.recent_reward = last.get(REWARD_RECENT_MEAN)
    summary.train_accuracy = last.get(ACCURACY_TRAIN)
    summary.eval_accuracy = _finite(final.get(EVAL_ACCURACY))
    if summary.eval_accuracy is None:
        summary.eval_accuracy = last.get(EVAL_ACCURACY)
    summary.tokens_per_s = tokens / seconds if seconds > 0 else None
    summary.elapsed_s = last.get(ELAPSED_SECONDS)
    return summary


def run_config(info: RunInfo) -> dict[str, Any]:
    """A run's config flattened to dotted keys, with its world size; its rewards as their names (a user
    function by its name, its file beside it), the names metrics and `replay --without` use."""
    config = dict(info.config)
    if isinstance(config.get("rewards"), list):
        config["rewards"] = rewards_text(config["rewards"])
    return {**_flatten(config), "world_size": info.world_size}


def rewards_text(rewards: list) -> str:
    """`answer_check, brevity x0.5 (my_rewards.py)`: each reward's one name, its weight when not 1, and the
    file a user function comes from."""
    parts = []
    for item in rewards:
        spec = str(item.get("name", "")) if isinstance(item, dict) else str(item)
        weight = item.get("weight", 1.0) if isinstance(item, dict) else 1.0
        text = reward_name(spec) + ("" if weight == 1 else f" x{weight:g}" if isinstance(weight, (int, float))
                                    else f" x{weight}")
        file = reward_file(spec)
        parts.append(text + (f" ({Path(file).name})" if file else ""))
    return ", ".join(parts)


def differing_keys(configs: list[dict[str, Any]]) -> list[str]:
    """The config keys whose values are not the same in every config (bookkeeping keys aside)."""
    keys: dict[str, None] = {}
    for config in configs:
        keys.update(dict.fromkeys(config))
    missing = object()
    return [key for key in keys if key not in NOT_CONFIG
            and len({json.dumps(c.get(key, missing), default=str) for c in configs}) > 1]


def config_differences(summaries: list[RunSummary]) -> list[str]:
    """The config keys on which the summarised runs differ."""
    return differing_keys([s.config for s in summaries])


def value_text(value: Any) -> str:
    """A config value as a short table cell ("-" for none)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


def _metric_cell(name: str, value: float | None) -> str:
    if value is None:
        return "-"
    if name in ("train_accuracy", "eval_accuracy"):
        return f"{value:.1%}"
    if name == "tokens_per_s":
        return f"{value:,.0f}"
    if name == "elapsed_s":
        return f"{value / 60:.1f} min" if value >= 120 else f"{value:.0f} s"
    return f"{value:+.3f}"


def sort_summaries(summaries: list[RunSummary], sort: str | None) -> list[RunSummary]:
    """The summaries by name, or best first by a number column (runs without it last); None keeps the order."""
    if sort is None:
        return summaries
    if sort == "name":
        return sorted(summaries, key=lambda s: s.name)
    # best first; runs without the number go last
    return sorted(summaries, key=lambda s: (getattr(s, sort) is None, -(getattr(s, sort) or 0.0)))


def comparison_table(summaries: list[RunSummary], sort: str | None = None) -> Table:
    """The comparison as a rich table: a row per run, the differing config keys as columns."""
    differing = config_differences(summaries)
    table = Table(title=f"{len(summaries)} runs" + (f": {len(differing)} config keys differ" if differing else
                                                     ": same config"), title_justify="left")
    table.add_column("run", no_wrap=True)
    table.add_column("status")
    table.add_column("steps", justify="right")
    for key in differing:
        table.add_column(key, style="cyan")
    for title in METRIC_COLUMNS.values():
        table.add_column(title, justify="right")
    for s in sort_summaries(summaries, sort):
        steps = f"{s.steps}/{s.total_steps}" if s.total_steps else str(s.steps)
        table.add_row(s.name, s.status, steps, *[value_text(s.config.get(k)) for k in differing],
                      *[_metric_cell(attr, getattr(s, attr)) for attr in METRIC_COLUMNS])
    return table


def comparison_json(summaries: list[RunSummary], sort: str | None = None) -> list[dict[str, Any]]:
    """The comparison as JSON-safe data."""
    differing = config_differences(summaries)
    return [{"run_dir": str(s.path), "name": s.name, "status": s.status, "steps": s.steps,
             "total_steps": s.total_steps, "config": {k: s.config.get(k) for k in differing},
             **{attr: getattr(s, attr) for attr in METRIC_COLUMNS}} for s in sort_summaries(summaries, sort)]


def table_console() -> Console:
    """A rich console sized for tables, wide enough when output is not a terminal."""
    from ..output import output_console

    return output_console()
