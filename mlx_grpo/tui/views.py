"""What each chart view shows: tiles of single metrics, and charts picked from the catalogue's chart groups.

The dashboard keeps no names, labels or chart groups of its own: tiles name their metric through
`telemetry/metrics/names.py` and take the catalogue's short label, and charts are the catalogue's
`CHART_GROUPS` (the grouping TensorBoard's layout is made from). A chart's names may carry the
catalogue's placeholders (`rewards/<fn>/mean`): it finds the run's reward functions by itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..telemetry.metrics import names as n
from ..telemetry.metrics.catalogue import name_pattern
from ..telemetry.metrics.charts import CHART_GROUPS, label


@dataclass(frozen=True)
class ChartSpec:
    """One chart: its title and the metric names (or catalogue patterns) it draws."""

    title: str
    metrics: tuple[str, ...]


@dataclass(frozen=True)
class ViewSpec:
    """A view's tiles, each (label, metric), and its charts."""

    tiles: tuple[tuple[str, str], ...]
    charts: tuple[ChartSpec, ...]


def labelled(*metrics: str) -> tuple[tuple[str, str], ...]:
    """(catalogue label, metric) of each metric."""
    return tuple((label(metric), metric) for metric in metrics)


def view(tiles: tuple[str, ...], section: str, titles: tuple[str, ...] = ()) -> ViewSpec:
    """Tiles of these metrics above the charts of one catalogue section (all of them, or those titled)."""
    charts = CHART_GROUPS[section]
    return ViewSpec(labelled(*tiles), tuple(ChartSpec(title, charts[title]) for title in titles or charts))


def resolve(spec: ChartSpec, available: list[str]) -> list[str]:
    """The chart's metrics that exist in at least one run, in spec order then name order."""
    out: list[str] = []
    for name in spec.metrics:
        if "<" not in name:
            if name in available and name not in out:
                out.append(name)
            continue
        rx = name_pattern(name)
        out.extend(sorted(m for m in available if rx.match(m) and m not in out))
    return out


OVERVIEW = view((n.REWARD_MEAN, n.ACCURACY_TRAIN, n.EVAL_ACCURACY, n.KL, n.ENTROPY, n.LENGTH_MEAN,
                 n.GEN_TOKENS_PER_S, n.STEP_SECONDS),
                # accuracy on the first screen; tool use only in runs with tools (no data, no chart)
                "rewards", ("total reward", "accuracy", "tool use", "reward per function"))
POLICY = view((n.KL, n.ENTROPY, n.CLIP_FRAC, n.LOSS, n.GRAD_NORM, n.LEARNING_RATE, n.SAMPLING_LOGP_DIFF_MAX), "policy")
LENGTHS = view((n.LENGTH_MEAN, n.TRUNCATED_FRAC, n.FINISHED_FRAC, n.PROMPT_LENGTH_MEAN, n.TOKENS_TOTAL), "lengths")
THROUGHPUT = view((n.GEN_TOKENS_PER_S, n.BACKPROP_TOKENS_PER_S, n.MFU, n.STEP_SECONDS, n.ROLLOUT_SECONDS,
                   n.UPDATE_SECONDS, n.GEN_MS_PER_TOKEN), "throughput")
SYSTEM = view((n.CPU_PERCENT, n.MEMORY_PERCENT, n.PROCESS_RSS_GB, n.ACCEL_ACTIVE_GB, n.ACCEL_PEAK_GB,
               n.ACCEL_LIMIT_GB), "memory")

# Metrics of the system view drawn as sparklines under its tiles.
SYSTEM_SPARKLINES = labelled(n.CPU_PERCENT, n.MEMORY_PERCENT, n.MEMORY_USED_GB, n.PROCESS_RSS_GB, n.ACCEL_ACTIVE_GB,
                             n.ACCEL_MEMORY_PERCENT)
