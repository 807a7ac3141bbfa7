"""The metric catalogue: lookups, other tools' names (complete for the requirement documents), METRICS.md,
`mlx-grpo metrics`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from package_strings import string_literals
from step_data_builder import make_step_data

from mlx_grpo.cli import main
from mlx_grpo.commands.metrics import metrics_markdown
from mlx_grpo.rewards.rubric import load_rubric
from mlx_grpo.rewards.rubric_reward import RubricReward
from mlx_grpo.telemetry.metrics import catalogue, charts, other_names
from mlx_grpo.telemetry.metrics.catalogue import find_entry
from mlx_grpo.telemetry.metrics.reward_stats import RewardTracker, ThroughputTracker, reward_metrics
from mlx_grpo.telemetry.metrics.step_data import step_record
from mlx_grpo.telemetry.metrics.system import SystemSampler

REPO = Path(__file__).resolve().parents[2]
SEEDS_DIR = Path(os.environ.get("MLX_GRPO_SEEDS_DIR", REPO.parent / "shared" / "seeds"))
# The requirement documents the product was described from, by the tool whose names each one uses.
SEED_FILES = {"tunix": "000-wandb-metrics-guide.md", "wandb-guide": "001-wandb-visualization-guide.md",
              "verl": "002-tinyzero-verl-metrics.md", "reward-monitor": "003-reward-monitoring-system.md",
              "tensorboard-guide": "004-tensorboard-metrics.md"}

# Backticked words in the seed documents that are not metric names.
NOT_METRICS = {
    "google/gemma-3-1b-it": "a model id in the config table",
    "<reasoning>...</reasoning><answer>...</answer>": "the answer format",
    "actor/*": "section header", "critic/*": "section header", "completion/*": "section header",
    "difficulty/*": "section header", "adaptive_window/*": "section header", "sgrpo/*": "section header",
    "timing_s/*": "section header", "timing_per_token_ms/*": "section header",
}
_FENCE = re.compile(r"```.*?```", re.S)


def seed_metric_names(text: str) -> list[str]:
    """Metric-like names a seed document mentions.

    Backticked words with a slash (outside code), backticked first cells of markdown tables (metric and
    config tables), and the keys of `wandb.log({...})` calls in the code examples.
    """
    found: list[str] = []
    prose = _FENCE.sub("", text)
    for token in re.findall(r"`([^`\s]+)`", prose):
        if "/" in token and ":" not in token and not token.startswith(("-", ".", "/")) \
                and not token.endswith((".py", ".json", ".pt", "/")):
            found.append(token)
    for line in prose.splitlines():
        cell = re.match(r"\|\s*`([^`]+)`\s*\|", line)
        if cell and not cell.group(1).startswith("-"):
            found.append(cell.group(1))
    for block in _FENCE.findall(text):
        for call in re.finditer(r"wandb\.log\(\s*\{", block):
            depth, i = 1, call.end()
            while depth and i < len(block):
                depth += {"{": 1, "}": -1}.get(block[i], 0)
                i += 1
            nesting = 0
            for token in re.finditer(r'[{}]|f?"([^"]+)"\s*:', block[call.end():i - 1]):
                if token.group(0) in "{}":
                    nesting += 1 if token.group(0) == "{" else -1
                elif nesting == 0:
                    found.append(token.group(1))
    return [name for name in dict.fromkeys(found) if name not in NOT_METRICS]


@pytest.mark.skipif(not SEEDS_DIR.is_dir(), reason=f"seed documents not found at {SEEDS_DIR}")
def test_every_metric_named_in_the_requirement_documents_has_an_other_name_entry():
    mapped = {(m.source, m.name) for m in other_names.OTHER_NAMES}
    missing = []
    for source, document in SEED_FILES.items():
        names = seed_metric_names((SEEDS_DIR / document).read_text(encoding="utf-8"))
        assert len(names) > 10, f"extraction found almost nothing in {document}"
        missing += [(source, name) for name in names if (source, name) not in mapped]
    assert missing == []


def test_other_names_answer_with_catalogue_entries_and_unanswered_ones_say_why():
    assert other_names.unresolved_answers() == []
    for m in other_names.OTHER_NAMES:
        assert m.source in other_names.SOURCES
        assert m.answers or m.note, f"{m.source} {m.name}: no canonical metric and no reason"
    critic_values = other_names.lookup("critic/values/mean")
    assert critic_values and critic_values[0].answers == () and "critic" in critic_values[0].note


def test_find_entry_matches_concrete_names_and_rejects_unknown_ones():
    assert find_entry("rewards/total/mean").name == "rewards/total/mean"
    assert find_entry("rewards/answer_check/mean").name == "rewards/<fn>/mean"
    assert find_entry("rewards/my_reward/contribution_pct").name == "rewards/<fn>/contribution_pct"
    assert find_entry("difficulty/3/accuracy").name == "difficulty/<level>/accuracy"
    assert find_entry("criteria/style/clarity/mean").name == "criteria/<rubric>/<criterion>/mean"
    assert find_entry("sgrpo/exit_2/accuracy").name == "sgrpo/exit_<k>/accuracy"
    assert find_entry("final/total/total_samples").kind == "summary"
    # `total` is the weighted sum, not a function: per-function-only statistics do not exist for it.
    assert find_entry("rewards/total/contribution_pct") is None
    assert find_entry("policy/not_a_metric") is None
    assert find_entry("Policy/Loss") is None


def test_catalogue_names_are_unique_lowercase_and_slash_grouped():
    names = [spec.name for spec in catalogue.CATALOGUE]
    assert len(names) == len(set(names))
    for spec in catalogue.CATALOGUE:
        fixed = re.sub(r"<[a-z]+>", "x", spec.name)
        assert fixed == fixed.lower() and " " not in fixed, spec.name
        assert spec.description and spec.when and spec.group


def test_every_name_the_telemetry_modules_emit_is_catalogued():
    names = ["format_exact", "answer_check"]
    scores = np.array([[1.0, 0.0, 1.0, np.nan], [0.0, 2.0, 2.0, 2.0]])
    total = np.array([1.0, 2.0, 3.0, 2.0])
    emitted = dict(reward_metrics(scores, names, [1.0, 1.0], total, 2))
    tracker = RewardTracker(names, hist_every=1, hist_min_samples=1)
    emitted.update(tracker.update(1, scores, total, loss=0.5,
                                  extra={"advantages/hist": total, "completions/length/hist": total}))
    emitted.update(tracker.histograms(1))
    tracker.update(2, scores, total, loss=0.4)
    emitted.update(tracker.end_epoch())
    tracker.update(3, scores, total, loss=0.3)
    emitted.update(tracker.end_epoch())
    emitted.update(tracker.final_metrics())
    for rate in ("throughput/gen_tokens_per_s", "throughput/backprop_tokens_per_s"):
        emitted.update(ThroughputTracker(rate).update(100, 1.0))
    sampler = SystemSampler(accel_memory=lambda: {"active": 1, "peak": 2, "cache": 3, "limit": 4},
                            gpu_utilization=lambda: 50.0)
    with sampler:
        emitted.update(sampler.snapshot())
    emitted.update(step_record(make_step_data(levels=[3, 4] * 8)))
    for key in ("epoch/reward/trend", "epoch/loss/trend", "system/gpu_utilization_percent",
                "system/accel_memory_percent", "rewards/answer_check/hist", "advantages/hist"):
        assert key in emitted
    assert [name for name in emitted if find_entry(name) is None] == []


def test_every_name_the_rubric_reward_emits_is_catalogued(tmp_path):
    path = tmp_path / "rubric.yaml"
    path.write_text("name: style\ncriteria:\n  - {name: correct, weight: 0.75, scorer: numeric_answer}\n"
                    "  - {name: tags, weight: 0.25, scorer: substring, text: \"<answer>\"}\n")
    reward = RubricReward(load_rubric(path))
    reward(["p"] * 2, ["<answer>1</answer>", "2"], ["1", "1"])
    emitted = {**reward.step_metrics(step=1), **reward.end_epoch(), **reward.summary.final_metrics()}
    assert "criteria/style/tags/mean" in emitted and "final/criteria/style/correct/total_samples" in emitted
    # The judge's metrics need a judge server; their names are fixed.
    emitted.update(dict.fromkeys(["judge/api_tokens", "judge/api_tokens_total", "judge/failed_requests"]))
    assert [name for name in emitted if find_entry(name) is None] == []


def test_metrics_md_is_up_to_date():
    expected = metrics_markdown()
    actual = (REPO / "METRICS.md").read_text(encoding="utf-8")
    assert actual == expected, "METRICS.md is stale: mlx-grpo metrics --write METRICS.md"


def test_metrics_write_regenerates_metrics_md(tmp_path):
    assert main(["metrics", "--write", str(tmp_path / "METRICS.md")]) == 0
    text = (tmp_path / "METRICS.md").read_text(encoding="utf-8")
    assert text == metrics_markdown()
    assert "| `rewards/total/mean` |" in text and "# Other tools' names" in text


def test_metrics_command_prints_table_json_other_names_and_looks_names_up(capsys):
    assert main(["metrics", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {"name", "description", "unit", "group", "when", "kind"} <= set(rows[0])
    assert len(rows) == len(catalogue.CATALOGUE)
    assert main(["metrics", "--other-names", "--json"]) == 0
    other = json.loads(capsys.readouterr().out)
    assert any(r["name"] == "Train/KLPenalty" and r["answers"] == ["policy/kl_penalty"] for r in other)
    assert main(["metrics", "frac_reward_zero_std", "--json"]) == 0  # TRL's name
    assert [r["ours"] for r in json.loads(capsys.readouterr().out)] == ["rewards/zero_std_group_frac"]
    assert main(["metrics", "actor/pg_clipfrac", "--json"]) == 0  # verl's
    assert json.loads(capsys.readouterr().out)[0]["ours"] == "policy/clip_frac"
    assert main(["metrics", "no/such_metric"]) == 2
    assert "no metric named 'no/such_metric'" in capsys.readouterr().err
    assert main(["metrics", "--group", "system"]) == 0
    out = capsys.readouterr().out
    assert "system/process_rss_gb" in out and "policy/loss" not in out
    assert main(["metrics", "--group", "nonsense"]) == 2
    assert "unknown group" in capsys.readouterr().err


def test_telemetry_modules_never_import_mlx():
    code = ("import sys\n"
            "import mlx_grpo.telemetry.metrics.catalogue, mlx_grpo.telemetry.metrics.reward_stats\n"
            "import mlx_grpo.telemetry.metrics.system\n"
            "import mlx_grpo.telemetry.rundir.writer, mlx_grpo.telemetry.sinks, mlx_grpo.commands.metrics\n"
            "assert not [m for m in sys.modules if m == 'mlx' or m.startswith('mlx.')], 'mlx imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_cross_boundary_names_and_chart_groups_are_catalogued():
    from mlx_grpo.telemetry.metrics import names

    constants = {k: v for k, v in vars(names).items() if k.isupper()}
    assert len(constants) >= 10
    assert [v for v in constants.values() if find_entry(v) is None] == []
    for section in charts.CHART_GROUPS.values():
        for title, members in section.items():
            named = [m.replace("<fn>", "f").replace("<level>", "3").replace("<k>", "4") for m in members]
            assert [m for m, name in zip(members, named) if find_entry(name) is None] == [], title
    assert [n for n in charts.LABELS if find_entry(n) is None] == []


def test_tensorboard_layout_is_generated_from_the_chart_groups():
    layout = charts.tensorboard_layout()
    assert set(layout) == set(charts.CHART_GROUPS) | {"epoch"}
    regexes = [rx for charts in layout.values() for kind, rxs in charts.values() if kind == "Multiline" for rx in rxs]
    # T13: seed 004's Reward and Loss Analysis groups: the total reward's variance and the epoch figures
    for name in ("rewards/answer_check/mean", "policy/ratio/p95", "completions/truncated_frac", "memory/update_peak_gb",
                 "throughput/gen_tokens_per_s/avg", "difficulty/3/accuracy", "rewards/total/variance",
                 "epoch/reward/mean", "epoch/reward/trend", "epoch/reward/variance", "epoch/loss/mean",
                 "epoch/loss/trend"):
        assert any(re.match(rx, name) for rx in regexes), name
    assert not any(re.match(rx, "rewards/total/contribution_pct") for rx in regexes)


def test_dashboard_views_draw_the_catalogues_chart_groups_with_its_labels():
    from mlx_grpo.tui import views

    for view in (views.OVERVIEW, views.POLICY, views.LENGTHS, views.THROUGHPUT, views.SYSTEM):
        for tile_label, metric in view.tiles:
            assert find_entry(metric) is not None and tile_label == charts.label(metric), metric
        for chart in view.charts:  # every chart is one of the catalogue's, members and title alike
            assert any(charts.CHART_GROUPS[s].get(chart.title) == chart.metrics for s in charts.CHART_GROUPS)
    assert [m for _, m in views.SYSTEM_SPARKLINES if find_entry(m) is None] == []
    # placeholders resolve against a run's names; <fn> never takes the total
    available = ["rewards/total/mean", "rewards/answer_check/mean", "rewards/format_exact/mean", "accuracy/train"]
    per_function = next(c for c in views.OVERVIEW.charts if c.title == "reward per function")
    assert views.resolve(per_function, available) == ["rewards/answer_check/mean", "rewards/format_exact/mean"]


def metric_name_literals() -> dict[str, set[str]]:
    """Each catalogued metric name spelled as a string literal in the package (docstrings aside), and the
    modules that spell it."""
    found: dict[str, set[str]] = {}
    for where, _, value in string_literals():
        if "/" in value and " " not in value and find_entry(value) is not None:
            found.setdefault(value, set()).add(where)
    return found


# The catalogue and its charts describe every name, other_names.py maps other tools' names to ours (all checked above).
DESCRIBING = {"mlx_grpo/telemetry/metrics/catalogue.py", "mlx_grpo/telemetry/metrics/charts.py",
              "mlx_grpo/telemetry/metrics/other_names.py"}


def test_a_metric_name_is_spelled_in_one_module_and_cross_boundary_ones_only_in_names_py():
    from mlx_grpo.telemetry.metrics import names

    spelled = metric_name_literals()
    # Beside the tables that describe names, a name is spelled where it is made; a name two
    # modules need is a constant of names.py, which they import (the catalogue too).
    making = {name: sorted(where - DESCRIBING) for name, where in spelled.items()}
    assert {name: where for name, where in making.items() if len(where) > 1} == {}
    constants = {v for k, v in vars(names).items() if k.isupper()}
    assert {name: sorted(where) for name, where in spelled.items()
            if name in constants and where != {"mlx_grpo/telemetry/metrics/names.py"}} == {}


def test_old_metric_names_are_read_as_todays():
    from mlx_grpo.telemetry.rundir.metric_table import table_from_records

    assert all(find_entry(new) is not None and find_entry(old) is None for old, new in other_names.ALIASES.items())
    old_run = [json.loads(line) for line in (REPO / "tests/data/run_default_healthy.jsonl").read_text().splitlines()]
    assert "completions/clip_ratio" in old_run[0]  # written before truncation got its own name
    table, rejected = table_from_records(old_run)
    assert rejected == 0 and "completions/truncated_frac" in table.names and "completions/clip_ratio" not in table.names
    assert other_names.canonical_record({"step": 1, "x/y": 2}) == {"step": 1, "x/y": 2}
