"""Weights & Biases: scalars, histograms, sample tables, charts and artifacts.

`WandbOptions` and `WandbSink(options)`: Weights & Biases (imported only here, at construction; a
missing `wandb` raises ImportError). `wandb.init` with project / entity / name / tags / notes, the
run config; the same scalars; `wandb.Histogram`s; the completions table `samples/completions` in
INCREMENTAL mode, so each log adds rows and the history is kept (wandb >= 0.21; W&B Server >= 0.70
to render it); `charts/reward_breakdown` (bar chart of the per-function means), three 3D point
clouds (`wandb.Object3D`, which work offline): `charts/reward_landscape_3d` (step, example, total
reward), `charts/reward_components_3d` (step, reward function, score; a colour per function) and
`charts/policy_evolution_3d` (KL, mean reward, step), `charts/reward_heatmap` (every completion's
total reward, step x example, as HTML), and with a rubric `charts/criteria_heatmap`
(criterion x step, as HTML) with its data as the table `charts/criteria_over_time`, all redrawn every
`chart_every` steps (0: about ten times per run, wandb_charts.chart_interval) and at the last step;
alerts through `run.alert`; checkpoints as model artifacts when `log_checkpoints` is set; the
dataset's rows as a `dataset` artifact and the final model as a `model` artifact (`Artifact` events);
final metrics in the run summary. WANDB_MODE=offline (or `mode="offline"`) works
without a network.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ...common.secrets import scrub_secrets, scrub_text
from ..events import AlertEvent, Artifact, Final, Samples, Scalars, Sink, Start
from ..metrics.names import KL, REWARD_MEAN, SAMPLES_TABLE
from ..rundir.completions import order_groups
from ..rundir.layout import checkpoint_name
from ..rundir.writer import RunInfo, json_safe
from .base import TEXT_LIMIT, _clip, tracker_config
from .wandb_charts import CATEGORY_COLOURS, category_cloud, chart_interval, heatmap_svg, value_cloud


@dataclass
class WandbOptions:
    """The W&B settings of a run (project, entity, name, tags, notes, what to upload)."""

    project: str = "mlx-grpo"
    entity: str | None = None
    name: str | None = None
    tags: Sequence[str] = ()
    notes: str | None = None
    mode: str | None = None  # "online", "offline", "disabled"; None = WANDB_MODE or online
    dir: str | None = None  # where W&B keeps its files; None = WANDB_DIR if set, else the run directory
    chart_every: int = 0  # 0: about ten times per run (wandb_charts.chart_interval)
    landscape_points: int = 10_000  # the most recent points each 3D cloud keeps
    log_checkpoints: bool = False
    extra_config: Mapping[str, Any] = field(default_factory=dict)


class WandbSink(Sink):
    """Weights & Biases: scalars, histograms, samples tables, charts, artifacts."""

    name = "wandb"

    def __init__(self, options: WandbOptions):
        import wandb

        self.wandb = wandb
        self.options = options
        self.run = None
        self._table = None
        self._table_fns: list[str] = []
        self._landscape = _RecentPoints(options.landscape_points)
        self._components = _RecentPoints(options.landscape_points)
        self._component_names: list[str] = []
        self._evolution: list[tuple[float, float, float]] = []
        self._criteria: dict[str, dict[int, float]] = {}  # criterion -> step -> mean score
        self._examples: dict[int, np.ndarray] = {}  # step -> its total rewards in the heatmap's order
        self._group_size = 0
        self._chart_every = options.chart_every
        self._undrawn: tuple[int, dict] | None = None  # the last step written without its charts
        self._total_steps: int | None = None

    def handle(self, event) -> None:
        """Scalars, histograms and charts, samples as a table, alerts, final metrics and artifacts."""
        if isinstance(event, Start):
            self._start(event.info, event.run_dir)
        elif isinstance(event, Scalars):
            self._write(event.step, event.values, event.histograms, event.rewards)
        elif isinstance(event, Samples):
            self._samples(event.step, event.rows)
        elif isinstance(event, AlertEvent):
            self._alert(event.record)
        elif isinstance(event, Final):
            self._final(event.metrics)
        elif isinstance(event, Artifact) and event.kind == "checkpoint":
            self._log_checkpoint(event.path, event.step)
        elif isinstance(event, Artifact) and event.kind == "dataset":
            self._log_dataset(event.name, event.splits, event.metadata)
        elif isinstance(event, Artifact) and event.kind == "model":
            self._log_model(event.path, event.step)

    def _start(self, info: RunInfo, run_dir: Path) -> None:
        """Start the W&B run with the scrubbed config (resuming the same W&B run on a resume)."""
        opts = self.options
        # An explicit dir wins, then the user's WANDB_DIR, then the run directory (keeps a run self-contained).
        wandb_dir = opts.dir or (None if os.environ.get("WANDB_DIR") else str(run_dir))
        config = {**tracker_config(info), **opts.extra_config}
        # Notes and tags are free text a user may paste a key into; W&B's own metadata would record the
        # command line, secrets typed as flags included, so it is not collected.
        tags = [scrub_text(str(tag)) for tag in opts.tags]
        # The entity and project form the run's path, so a secret there cannot be replaced: refused (the
        # sink turns off with a warning that does not repeat it). The display name is free text: scrubbed.
        for key, value in (("wandb_entity", opts.entity), ("wandb_project", opts.project)):
            if value and scrub_text(value) != value:
                raise ValueError(f"{key} looks like an API key or token; set it to your W&B user or team name")
        self.run = self.wandb.init(project=opts.project, entity=opts.entity,
                                   name=scrub_text(opts.name or info.name or "") or None,
                                   tags=tags or None, notes=scrub_text(opts.notes) if opts.notes else None,
                                   config=json_safe(scrub_secrets(config)), dir=wandb_dir, mode=opts.mode,
                                   settings=self.wandb.Settings(x_disable_meta=True))
        self._total_steps = info.total_steps
        self._chart_every = chart_interval(opts.chart_every, self._total_steps)
        generations = (info.config or {}).get("num_generations")
        self._group_size = generations if isinstance(generations, int) and generations > 0 else 0

    def _write(self, step, scalars, histograms, rewards) -> None:
        """One step's scalars and histograms, and the charts when they are due."""
        data: dict[str, Any] = {k: v for k, v in scalars.items() if v is not None}
        for name, array in histograms.items():
            data[name] = self.wandb.Histogram(np.asarray(array, dtype=np.float64))
        if rewards:
            self._add_rewards(step, rewards)
        if KL in scalars and REWARD_MEAN in scalars:
            self._evolution.append((float(scalars[KL]), float(scalars[REWARD_MEAN]), float(step)))
        for name, value in scalars.items():
            if name.startswith("criteria/") and name.endswith("/mean") and value is not None:
                self._criteria.setdefault(name[len("criteria/"):-len("/mean")], {})[step] = float(value)
        drawn = step % self._chart_every == 0 or step == self._total_steps
        if drawn:
            data.update(self._charts(scalars))
        # a run that stops early (an alert's stop, Ctrl-C) draws its charts at its last step on close
        self._undrawn = None if drawn else (step, dict(scalars))
        self.run.log(data, step=step)

    def _add_rewards(self, step: int, rewards: Mapping[str, np.ndarray]) -> None:
        total = np.asarray(rewards["total"], dtype=np.float64)
        if self._group_size and total.size % self._group_size == 0:
            self._examples[step] = order_groups(list(total.reshape(-1, self._group_size)))
            if len(self._examples) > CRITERIA_COLUMNS:
                del self._examples[min(self._examples)]
        points = np.stack([np.full(total.size, float(step)), np.arange(total.size, dtype=np.float64), total], axis=1)
        self._landscape.add(points[np.isfinite(total)])
        for name in rewards:
            if name != "total" and name not in self._component_names:
                self._component_names.append(name)
        parts = []
        for index, name in enumerate(self._component_names):
            scores = np.asarray(rewards.get(name, ()), dtype=np.float64)
            scores = scores[np.isfinite(scores)]  # a function that failed this batch has NaN scores
            parts.append(np.stack([np.full(scores.size, float(step)), np.full(scores.size, float(index)), scores],
                                  axis=1))
        if parts:
            self._components.add(np.concatenate(parts))

    def _charts(self, scalars: Mapping[str, float]) -> dict[str, Any]:
        charts: dict[str, Any] = {}
        means = {k.split("/")[1]: v for k, v in scalars.items()
                 if re.fullmatch(r"rewards/[^/]+/mean", k) and k != REWARD_MEAN}
        if means:
            charts["charts/reward_breakdown"] = self._bar(means, "Reward breakdown (batch mean per function)")
        points = self._landscape.points()
        if len(points) >= 2:
            charts["charts/reward_landscape_3d"] = self.wandb.Object3D(value_cloud(points, points[:, 2]))
        points = self._components.points()
        if len(points) >= 2:
            # x: step, y: reward function (in the order of the run's reward list), z: score; a colour per function.
            charts["charts/reward_components_3d"] = self.wandb.Object3D(category_cloud(points, points[:, 1]),
                                                                        caption=self._components_caption())
        if len(self._evolution) >= 2:
            points = np.asarray(self._evolution, dtype=np.float64)
            charts["charts/policy_evolution_3d"] = self.wandb.Object3D(value_cloud(points, points[:, 1]))
        charts.update(self._criteria_charts())
        charts.update(self._example_heatmap())
        return charts

    def _example_heatmap(self) -> dict[str, Any]:
        """Every completion's total reward, step x example (seed 001's reward surface), as an HTML heatmap:
        each column a step's completions, groups by mean reward and each group's completions best first."""
        if len(self._examples) < 2:
            return {}
        steps = sorted(self._examples)
        height = max(len(self._examples[s]) for s in steps)
        matrix = np.full((height, len(steps)), np.nan)
        for j, s in enumerate(steps):
            matrix[:len(self._examples[s]), j] = self._examples[s]
        labels = [f"group {i // self._group_size + 1}" if i % (self._group_size * 4) == 0 else ""
                  for i in range(height)]
        svg = heatmap_svg(labels, steps, matrix, cell_h=3, value_label="total reward",
                          title="Total reward of every completion: step x example (groups by mean, best first)")
        return {"charts/reward_heatmap": self.wandb.Html(svg, data_is_not_path=True)}

    def _components_caption(self) -> str:
        colours = [CATEGORY_COLOURS[i % len(CATEGORY_COLOURS)] for i in range(len(self._component_names))]
        return "y axis, in order: " + ", ".join(f"{name} (rgb{c})" for name, c in zip(self._component_names, colours))

    def _criteria_charts(self) -> dict[str, Any]:
        """The rubric criteria's mean scores over time: a heatmap (HTML) and the table it is drawn from."""
        steps = sorted({step for scores in self._criteria.values() for step in scores})
        if len(steps) < 2:
            return {}
        steps = steps[-CRITERIA_COLUMNS:]
        names = sorted(self._criteria)
        values = np.array([[self._criteria[n].get(s, math.nan) for s in steps] for n in names])
        svg = heatmap_svg(names, steps, values, title="Rubric criteria: mean score per logged step")
        rows = [[s, n, self._criteria[n][s]] for n in names for s in steps if s in self._criteria[n]]
        return {"charts/criteria_heatmap": self.wandb.Html(svg, data_is_not_path=True),
                "charts/criteria_over_time": self.wandb.Table(columns=["step", "criterion", "mean"], data=rows)}

    def _bar(self, values: Mapping[str, float], title: str):
        table = self.wandb.Table(columns=["reward_function", "mean"],
                                 data=[[k, float(v)] for k, v in values.items() if v is not None and math.isfinite(v)])
        return self.wandb.plot.bar(table, "reward_function", "mean", title=title)

    def _samples(self, step, samples) -> None:
        """The samples as a W&B table."""
        if not samples:
            return
        if self._table is None:
            self._table_fns = list(dict.fromkeys(k for s in samples for k in (s.get("rewards") or {})))
            columns = ["step", "prompt", "reasoning", "answer", "ground_truth", *(f"reward/{fn}" for fn in
                       self._table_fns), "total", "advantage", "length", "truncated", "correct", "completion"]
            self._table = self.wandb.Table(columns=columns, log_mode="INCREMENTAL")
        for s in samples:
            # The trainer splits each completion with the same extractor that scored it.
            rewards = s.get("rewards") or {}
            row = [step, _clip(s.get("prompt")), _clip(s.get("reasoning")), _clip(s.get("predicted")),
                   _clip(s.get("answer")),
                   *(json_safe(rewards.get(fn)) for fn in self._table_fns), json_safe(s.get("total")),
                   json_safe(s.get("advantage")), s.get("length"), s.get("truncated"), s.get("correct"),
                   _clip(s.get("completion"), 4 * TEXT_LIMIT)]
            self._table.add_data(*row)
        self.run.log({SAMPLES_TABLE: self._table}, step=step)

    def _alert(self, alert) -> None:
        """The alert as a W&B alert."""
        level = {"error": self.wandb.AlertLevel.ERROR, "warning": self.wandb.AlertLevel.WARN}.get(
            alert.get("level"), self.wandb.AlertLevel.INFO)
        self.run.alert(title=f"{alert.get('rule', 'alert')} (step {alert.get('step')})",
                       text=str(alert.get("message", "")), level=level)

    def _final(self, metrics) -> None:
        """The final metrics in the run's summary, and the last charts."""
        self.run.summary.update(json_safe(dict(metrics)))
        data: dict[str, Any] = {}
        means = {k.split("/")[1]: v for k, v in metrics.items()
                 if re.fullmatch(r"final/[^/]+/mean", k) and k != "final/total/mean"}
        if means:
            data["charts/reward_breakdown"] = self._bar(means, "Reward breakdown (whole-run mean per function)")
        criteria = sorted({k.rsplit("/", 1)[0] for k in metrics if k.startswith("final/criteria/")})
        if criteria:
            rows = [[c[len("final/criteria/"):], *(json_safe(metrics.get(f"{c}/{stat}"))
                     for stat in ("mean", "std", "min", "max", "total_samples"))] for c in criteria]
            data["final/rubric_criteria_summary"] = self.wandb.Table(
                columns=["criterion", "mean", "std", "min", "max", "samples"], data=rows)
        if data:
            self.run.log(data)

    def _log_checkpoint(self, path, step) -> None:
        """Upload the checkpoint as an artifact, when asked to."""
        if not self.options.log_checkpoints:
            return
        artifact = self.wandb.Artifact(name=f"{self.run.id}-checkpoint", type="model", metadata={"step": step})
        artifact.add_dir(str(path))
        self.run.log_artifact(artifact, aliases=[checkpoint_name(step), "latest"])

    def _log_dataset(self, name, splits, metadata) -> None:
        """The rows the run trains and evaluates on, one JSONL file per split (written here, on W&B's thread)."""
        import tempfile

        artifact = self.wandb.Artifact(name=_artifact_name(name), type="dataset",
                                       metadata=json_safe({**metadata, **{f"{split}_rows": len(rows)
                                                                           for split, rows in splits.items()}}))
        with tempfile.TemporaryDirectory() as tmp:
            for split, rows in splits.items():
                path = Path(tmp) / f"{split}.jsonl"
                with open(path, "w", encoding="utf-8") as fh:
                    for row in rows:
                        fh.write(json.dumps(json_safe(dict(row))) + "\n")
                artifact.add_file(str(path), name=path.name)  # copied into W&B's staging area here
            self.run.log_artifact(artifact)

    def _log_model(self, path, step) -> None:
        """The final model (a Hugging Face directory) as a model artifact."""
        artifact = self.wandb.Artifact(name=f"{self.run.id}-model", type="model", metadata={"step": step})
        artifact.add_dir(str(path))
        self.run.log_artifact(artifact, aliases=["final", checkpoint_name(step)])

    def close(self, status: str) -> None:
        """Draw the charts at the last step if they were not (a run stopped early), and finish the W&B run."""
        if self._undrawn is not None:
            step, scalars = self._undrawn
            self.run.log(self._charts(scalars), step=step)
        self.run.finish(exit_code=0 if status == "finished" else 1)


CRITERIA_COLUMNS = 200  # the heatmap shows the most recent logged steps, so a long run's stays readable


class _RecentPoints:
    """The most recent [n, 3] point arrays of a 3D cloud, `limit` points at most (whole steps dropped)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list[np.ndarray] = []
        self.size = 0

    def add(self, points: np.ndarray) -> None:
        self.parts.append(points)
        self.size += len(points)
        while self.size - len(self.parts[0]) >= self.limit:
            self.size -= len(self.parts.pop(0))

    def points(self) -> np.ndarray:
        return np.concatenate(self.parts) if self.parts else np.empty((0, 3))


def _artifact_name(text: str) -> str:
    """W&B artifact names allow letters, digits, dashes, underscores and dots."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.") or "dataset"
