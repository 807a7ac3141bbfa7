"""`mlx-grpo replay`: re-score a run's kept completions under other reward functions, weights or rubric,
without a model, and show what GRPO would have learnt differently.

The run's completions/ holds every completion of every step with the scores it got. `replay` scores the
same texts again with the reward set given (`score_completions`, a step at a time as the trainer does),
recomputes each group's advantages (`grpo.group_advantages`, the run's scale_rewards), and compares:

- rankings: groups whose completions are ordered differently by total reward;
- advantages: completions whose advantage changed sign (a completion the update pushed up is now
  pushed down, or the reverse) and the mean absolute change;
- zero-std groups: groups with no spread, which teach nothing, before and after;
- the reward-quality report (telemetry/analysis/reward_quality.py), before and after.

Extra dataset columns are not kept in completions/, so a reward function reading one gets none here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..common.errors import UserError
from ..common.terminal import terminal_safe
from ..rewards.scoring import RewardFunction, score_completions
from ..telemetry.analysis.reward_quality import QualityReport, analyze_quality
from ..telemetry.metrics.reward_stats import reward_metrics
from ..telemetry.rundir.completions import completion_steps, read_step
from ..telemetry.rundir.writer import read_run_info

SIGN_TOLERANCE = 1e-4  # advantages closer to 0 than this have no sign


@dataclass
class StepRows:
    """One step's kept completions as arrays, prompt-major (groups of G consecutive rows)."""

    step: int
    rows: list[dict]
    total: np.ndarray  # [N] the total reward the run gave
    advantages: np.ndarray  # [N] the advantage the run trained on


@dataclass
class GroupChange:
    step: int
    prompt_index: int
    prompt: str
    old_order: list[list[int]]  # completion indices, best first, ties together
    new_order: list[list[int]]
    old_total: list[float]
    new_total: list[float]


@dataclass
class SignFlip:
    step: int
    prompt_index: int
    completion_index: int
    completion: str
    old_advantage: float
    new_advantage: float


@dataclass
class ReplayResult:
    steps: int
    groups: int
    completions: int
    names_before: list[str]
    names_after: list[str]
    reranked: list[GroupChange] = field(default_factory=list)
    flips: list[SignFlip] = field(default_factory=list)
    zero_std_before: int = 0
    zero_std_after: int = 0
    mean_abs_advantage_change: float = 0.0
    quality_before: QualityReport | None = None
    quality_after: QualityReport | None = None
    skipped_steps: list[int] = field(default_factory=list)  # steps whose file did not hold whole groups


def run_settings(run_dir: Path) -> tuple[list[tuple[str, float]], str | None, float, int, str, Path]:
    """The run's (rewards, rubric_file, rubric_weight, num_generations, scale_rewards, base_dir) from run.json,
    every value checked: run.json is data from a run directory, a wrong type is one line naming the key."""
    info = read_run_info(run_dir)
    config = info.config if info is not None and isinstance(info.config, dict) else {}
    if not config:
        raise UserError(f"{run_dir}: run.json has no config; is it an mlx-grpo run directory?")
    rewards = [(str(r["name"]), _setting(run_dir, f"reward '{r['name']}' weight", r.get("weight", 1.0), float))
               for r in _list(config.get("rewards")) if isinstance(r, dict) and "name" in r]
    rubric = config.get("rubric_file")
    base = Path(str(config.get("base_dir") or run_dir))
    weight = config.get("rubric_weight")
    return (rewards, str(rubric) if rubric else None,
            1.0 if weight is None else _setting(run_dir, "rubric_weight", weight, float),
            _setting(run_dir, "num_generations", config.get("num_generations", 0), int),
            str(config.get("scale_rewards", "group")), base)


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _setting(run_dir: Path, key: str, value: Any, kind: type) -> Any:
    """run.json's number as `kind`, or one line naming the key."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value)
    if ok and kind is int and float(value) != int(value):
        ok = False
    if not ok:
        raise UserError(f"{run_dir}/run.json: config {key} is {terminal_safe(repr(value))[:60]}; expected "
                        f"{'a whole number' if kind is int else 'a finite number'}")
    return kind(value)


def load_steps(run_dir: Path, group_size: int, steps: Sequence[int] | None = None) -> tuple[list[StepRows], list[int]]:
    """The kept steps (whole groups only) and the steps skipped for not holding whole groups."""
    kept, skipped = [], []
    for step in steps if steps is not None else completion_steps(run_dir):
        rows = sorted(map(_checked_row, read_step(run_dir, step)),
                      key=lambda r: (r["prompt_index"], r["completion_index"]))
        if not rows or group_size < 1 or len(rows) % group_size:
            skipped.append(step)
            continue
        kept.append(StepRows(step, rows, np.array([_num(r.get("total")) for r in rows]),
                             np.array([_num(r.get("advantage")) for r in rows])))
    return kept, skipped


def _checked_row(row: dict) -> dict:
    """A kept row with the types replay reads: texts as strings ("" when not), scores as a mapping ({} when
    not), the completion index a whole number (0 when not). A step file is data and may be damaged."""
    index = row.get("completion_index")
    return {**row,
            **{key: row[key] if isinstance(row.get(key), str) else "" for key in ("prompt", "completion", "answer")},
            "rewards": row["rewards"] if isinstance(row.get("rewards"), dict) else {},
            "completion_index": index if isinstance(index, int) and not isinstance(index, bool) else 0}


def _num(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else np.nan


def _order(totals: np.ndarray) -> list[list[int]]:
    """Completion indices best first, tied ones together: [[4, 5], [0], [1, 3]]."""
    ranks = _ranks(totals)
    return [[int(i) for i in np.flatnonzero(ranks == r)] for r in range(int(ranks.max()) + 1)] if len(ranks) else []


def order_text(order: list[list[int]]) -> str:
    """'4=5 > 0 > 1=3': the ranking of a group, ties joined by '='."""
    return " > ".join("=".join(str(i) for i in tied) for tied in order)


def _ranks(totals: np.ndarray) -> np.ndarray:
    """Dense ranks (equal totals share a rank), so two orders of tied completions do not count as a change."""
    _, inverse = np.unique(-totals, return_inverse=True)
    return inverse


def replay(run_dir: str | Path, functions: list[RewardFunction], group_size: int, scale: str,
           steps: Sequence[int] | None = None, metrics: Sequence[dict] = (),
           weights_before: dict[str, float] | None = None) -> ReplayResult:
    """Score the kept completions with `functions` and compare with what the run gave them.
    `metrics`: the run's metric records (accuracy and the like carry over into the quality report);
    `weights_before`: the run's reward weights (for the functions' shares of the total before)."""
    import mlx.core as mx

    from ..grpo import group_advantages

    run_dir = Path(run_dir)
    kept, skipped = load_steps(run_dir, group_size, steps)
    if not kept and skipped:
        raise UserError(f"{run_dir}: no kept completions to replay: none of the {len(skipped)} step files in "
                        f"completions/ holds whole groups of {group_size} (damaged files, or a run.json whose "
                        "num_generations is not the run's)")
    if not kept:
        raise UserError(f"{run_dir}: no kept completions to replay (completions/ is empty or missing; runs keep "
                        "them unless keep_completions is false)")
    names = [f.name for f in functions]
    result = ReplayResult(steps=len(kept), groups=0, completions=0, names_before=[], names_after=names,
                          skipped_steps=skipped)
    before_records, after_records, after_rows = [], [], []
    others = {int(r["step"]): r for r in metrics if isinstance(r.get("step"), int)}
    changes = []
    for part in kept:
        rows = part.rows
        scores = score_completions(functions, [r.get("prompt", "") for r in rows], [answered(r) for r in rows],
                                   [r.get("answer", "") for r in rows], trajectory_columns(rows))
        for message in scores.new_errors:
            print(f"warning: {terminal_safe(message)}")
        total = scores.total
        advantages = np.array(group_advantages(mx.array(total, dtype=mx.float32), group_size, scale))
        old_names = list(dict.fromkeys(fn for r in rows for fn in r["rewards"]))
        result.names_before = result.names_before or old_names
        old_scores = np.array([[_num(r["rewards"].get(fn)) for r in rows] for fn in old_names],
                              dtype=float).reshape(len(old_names), len(rows))
        # the run's own record of the step, with the reward figures recomputed from the kept rows
        base = {k: v for k, v in others.get(part.step, {}).items() if not k.startswith("rewards/")}
        before_records.append({**base, "step": part.step,
                               **reward_metrics(old_scores, old_names,
                                                [(weights_before or {}).get(n, 1.0) for n in old_names],
                                                part.total, group_size)})
        after_records.append({**base, "step": part.step,
                              **reward_metrics(scores.per_function, names, [f.weight for f in functions], total,
                                               group_size)})
        for i, r in enumerate(rows):
            after_rows.append({**r, "rewards": {n: _num(scores.per_function[f, i]) for f, n in enumerate(names)},
                               "total": float(total[i]), "advantage": float(advantages[i])})
        changes.append(np.abs(advantages - part.advantages))
        _compare_groups(result, part, total, advantages, group_size)
        result.completions += len(rows)
    result.mean_abs_advantage_change = float(np.nanmean(np.concatenate(changes)))
    before_rows = [r for part in kept for r in part.rows]
    result.quality_before = analyze_quality(before_records, before_rows)
    result.quality_after = analyze_quality(after_records, after_rows)
    return result


def _compare_groups(result: ReplayResult, part: StepRows, total: np.ndarray, advantages: np.ndarray,
                    group_size: int) -> None:
    """Each group of one step, before and after: flat groups, groups ranked differently, advantages whose sign
    flipped, counted into `result`."""
    rows = part.rows
    for g in range(len(rows) // group_size):
        cut = slice(g * group_size, (g + 1) * group_size)
        old_t, new_t = part.total[cut], total[cut]
        result.groups += 1
        finite = old_t[np.isfinite(old_t)]  # a run writes null for a total it could not give
        flat_before = finite.size == 0 or bool(finite.max() == finite.min())
        flat_after = bool(new_t.max() == new_t.min())
        result.zero_std_before += flat_before
        result.zero_std_after += flat_after
        if not np.array_equal(_ranks(old_t), _ranks(new_t)):
            result.reranked.append(GroupChange(part.step, g, str(rows[g * group_size].get("prompt", "")),
                                               _order(old_t), _order(new_t), old_t.tolist(), new_t.tolist()))
        for j, (old_a, new_a) in enumerate(zip(part.advantages[cut], advantages[cut])):
            # a group without spread has advantages of float rounding only (float32 mean, divided by
            # the std + 1e-4: about 0.005), and their sign means nothing
            if flat_before or flat_after:
                break
            if old_a * new_a < 0 and min(abs(old_a), abs(new_a)) > SIGN_TOLERANCE:
                row = rows[g * group_size + j]
                result.flips.append(SignFlip(part.step, g, j, str(row.get("completion", "")), float(old_a),
                                             float(new_a)))


def render(result: ReplayResult, limit: int = 10) -> str:
    """The comparison as text: the summary first, then the changed groups and the sign flips."""
    q0, q1 = result.quality_before, result.quality_after
    lines = [
        f"replayed {result.completions} completions in {result.groups} groups over {result.steps} steps",
        f"reward functions: {', '.join(result.names_before)} -> {', '.join(result.names_after)}",
        f"groups ranked differently: {len(result.reranked)} of {result.groups} "
        f"({len(result.reranked) / max(1, result.groups):.0%})",
        f"advantages whose sign flipped: {len(result.flips)} of {result.completions}; mean |change| "
        f"{result.mean_abs_advantage_change:.3f}",
        f"zero-std groups (teach nothing): {result.zero_std_before} -> {result.zero_std_after} of {result.groups}",
    ]
    if q0 is not None and q1 is not None:
        lines.append(f"reward functions' {q0.headline()} -> {q1.headline()}")
        for before, after in zip(q0.parts, q1.parts):
            fmt = lambda p: "n/a" if p.score is None else f"{p.score:.0f}"  # noqa: E731
            lines.append(f"  {after.name:<17} {fmt(before):>4} -> {fmt(after):>4}   {after.explanation}")
    if result.skipped_steps:
        lines.append(f"steps left out (their file does not hold whole groups): {result.skipped_steps[:10]}")
    if result.reranked:
        lines += ["", f"groups ranked differently (first {min(limit, len(result.reranked))}; completion indices "
                      "best first, '=' ties; totals before->after in completion order):"]
        for change in result.reranked[:limit]:
            prompt = " ".join(change.prompt.split())[:40]
            totals = ", ".join(f"{a:.3g}->{b:.3g}" for a, b in zip(change.old_total, change.new_total))
            lines.append(f"  step {change.step} prompt {change.prompt_index} {prompt!r}: "
                         f"{order_text(change.old_order)}  ->  {order_text(change.new_order)}   totals {totals}")
    if result.flips:
        lines += ["", f"completions whose advantage changed sign (first {min(limit, len(result.flips))}):"]
        for flip in result.flips[:limit]:
            text = " ".join(flip.completion.split())[:60]
            lines.append(f"  step {flip.step} prompt {flip.prompt_index} #{flip.completion_index}: "
                         f"{flip.old_advantage:+.2f} -> {flip.new_advantage:+.2f}  {text!r}")
    return "\n".join(lines)


TRAJECTORY_COLUMNS = ("tool_calls", "tool_failures", "environment_reward", "turns_taken")


def answered(row: dict) -> str:
    """What the rewards read: a multi-turn row's answer (its last turn; the tools are not called again), else
    the completion."""
    return str(row["answer_text"] if "answer_text" in row else row.get("completion", ""))


def trajectory_columns(rows: list[dict]) -> dict[str, list]:
    """The columns a multi-turn run's rewards took (the kept trajectory and its tool counts); none otherwise."""
    if not rows or "turns" not in rows[0]:
        return {}
    columns = {name: [r.get(name) for r in rows] for name in TRAJECTORY_COLUMNS}
    columns["trajectory"] = [r.get("completion", "") for r in rows]
    return columns
