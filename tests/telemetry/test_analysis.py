"""Reward analysis and `mlx-grpo report` on synthetic run directories."""

from __future__ import annotations

import json
from functools import lru_cache

import numpy as np
import pytest
from synthetic_runs import Faults, simulate, write_run_dir

from mlx_grpo.cli import main
from mlx_grpo.telemetry.analysis.report import write_report
from mlx_grpo.telemetry.analysis.reward_report import analyze_run, trend_of


@lru_cache(maxsize=None)
def _sim(fault: str | None = None, steps: int = 200, seed: int = 0):
    return simulate(steps, seed, Faults(**({fault: True} if fault else {})))


@pytest.fixture
def healthy_dir(tmp_path):
    metrics, samples = _sim()
    return write_run_dir(tmp_path / "healthy", metrics, samples, "healthy-run")


def test_healthy_report_scores_well_and_explains_each_part(healthy_dir):
    report = write_report(healthy_dir)
    q = report.quality
    assert [(p.name, p.weight) for p in q.parts] == [("consistency", 0.25), ("discriminability", 0.35),
                                                    ("stability", 0.25), ("coverage", 0.15)]
    assert all(p.score is not None and 0 <= p.score <= 100 and len(p.explanation) > 30 for p in q.parts)
    assert q.score == pytest.approx(sum(p.weight * p.score for p in q.parts))
    assert q.score > 80
    assert report.steps == 200 and report.num_samples == 800
    assert report.functions == ["format_exact", "format_approx", "answer_check", "number_check"]
    imp = report.importance
    assert imp["answer_check"].correct_corr > 0.9 and abs(imp["format_exact"].correct_corr) < 0.2
    assert sum(i.contribution_pct for i in imp.values()) == pytest.approx(100, abs=0.5)
    assert report.trends["accuracy/train"].direction == "rising"
    assert report.trends["rewards/format_approx/mean"].direction == "flat"
    assert not report.hacking.suspected and report.hacking.verdict.startswith("no sign")
    assert report.alerts_source == "replayed built-in rules"
    assert [a for a in report.alerts if a.level != "info"] == []
    # answer_check and number_check both pay for correctness: flagged as one signal.
    pair = next(c for c in report.correlations if {c.a, c.b} == {"answer_check", "number_check"})
    assert pair.corr > 0.9 and pair.source == "samples" and pair.note

    data = json.loads((healthy_dir / "report.json").read_text())
    assert data["run"] == "healthy-run" and data["quality"]["score"] == pytest.approx(q.score)
    assert set(data["importance"]) == set(report.functions)
    md = (healthy_dir / "report.md").read_text()
    assert md.startswith("# Reward report: healthy-run") and "## Reward functions' quality: " in md
    assert "**What happened:** " in md and "| discriminability | 35% |" in md


def test_constant_reward_scores_low_and_says_why():
    report = analyze_run(*_sim("constant_reward"))
    parts = {p.name: p for p in report.quality.parts}
    assert parts["discriminability"].score == 0
    assert parts["coverage"].score == 0
    assert report.quality.score < 50
    assert report.importance["constant"].constant
    issues = " ".join(report.quality.issues)
    assert "100% of groups gave all their completions the same reward" in issues
    assert "constant gave every completion of a batch the same score" in issues
    assert any("partial credit" in r for r in report.quality.recommendations)


def test_each_quality_part_drops_when_its_property_is_broken():
    metrics, samples = _sim()
    base = {p.name: p.score for p in analyze_run(metrics, samples).quality.parts}
    rng = np.random.default_rng(0)
    # A mean that jumps by about a batch spread every step: consistency falls.
    jumpy = [dict(r, **{"rewards/total/mean": r["rewards/total/mean"] + rng.normal(0, 3)}) for r in metrics]
    # A batch spread that keeps changing scale: stability falls.
    wobbly = [dict(r, **{"rewards/total/std": r["rewards/total/std"] * (0.2 if i % 2 else 1.8)})
              for i, r in enumerate(metrics)]
    # Batches spanning a sliver of the range: coverage falls.
    narrow = [dict(r, **{"rewards/total/min": r["rewards/total/mean"] - 0.1,
                         "rewards/total/max": r["rewards/total/mean"] + 0.1}) for r in metrics]
    # Correct and incorrect completions scored alike: discriminability falls.
    shuffled = [dict(s, total=float(rng.choice([4.0, 8.0]))) for s in samples]
    scores = {
        "consistency": {p.name: p.score for p in analyze_run(jumpy, samples).quality.parts}["consistency"],
        "stability": {p.name: p.score for p in analyze_run(wobbly, samples).quality.parts}["stability"],
        "coverage": {p.name: p.score for p in analyze_run(narrow, samples).quality.parts}["coverage"],
        "discriminability": {p.name: p.score for p in analyze_run(metrics, shuffled).quality.parts}["discriminability"],
    }
    for name, score in scores.items():
        assert score < base[name] - 20, (name, score, base[name])


def test_length_paying_reward_is_reported_as_hacking():
    report = analyze_run(*_sim("length_reward"))
    h = report.hacking
    assert h.suspected and h.verdict.startswith("possible reward hacking")
    assert any(f.startswith("length_bonus pays for length") for f in h.findings)
    assert any(a.rule == "reward_hacking" and a.metric == "rewards/length_bonus/mean" for a in h.alerts)
    assert report.importance["length_bonus"].length_corr > 0.9
    assert any("cut off at the generation limit" not in i and "hacking" in i for i in report.quality.issues)


def test_lengths_that_grow_with_accuracy_are_not_called_reward_hacking():
    # Tool calls and thinking make right answers longer: completions grow and the rewards correlate with
    # length, but accuracy, sampled and held-out, rises with them. The same run with held-out accuracy flat
    # is the length pathology.
    metrics, samples = _sim("length_reward")
    rising = [dict(r, **{name: 0.1 + 0.8 * i / len(metrics) for name in ("accuracy/train", "eval/accuracy")
                         if name in r}) for i, r in enumerate(metrics)]
    assert not any("pays for length" in f for f in analyze_run(rising, samples).hacking.findings)
    assert any(f.startswith("length_bonus pays for length") for f in analyze_run(metrics, samples).hacking.findings)


def test_takeover_is_reported_as_hacking():
    report = analyze_run(*_sim("takeover", steps=250))
    assert report.hacking.suspected
    assert any("format_approx's share of the reward grew" in f for f in report.hacking.findings)


def test_run_without_accuracy_cannot_tell_about_hacking():
    metrics, _ = _sim()
    bare = [{k: v for k, v in r.items() if "accuracy" not in k} for r in metrics]
    report = analyze_run(bare, [])
    assert not report.hacking.suspected and report.hacking.verdict.startswith("cannot tell")
    # Without samples, importance still has the shares and correlations fall back to step means.
    assert report.importance["answer_check"].correct_corr is None
    assert report.importance["answer_check"].contribution_pct > 0
    assert all(c.source == "metrics" for c in report.correlations)


def test_trend_needs_to_clear_the_noise():
    noisy_flat = [{"step": i, "m": 1.0 + (0.5 if i % 2 else -0.5)} for i in range(40)]
    assert trend_of(noisy_flat, "m").direction == "flat"
    rising = [{"step": i, "m": 1.0 + 0.05 * i} for i in range(40)]
    t = trend_of(rising, "m")
    assert t.direction == "rising" and t.slope_per_step == pytest.approx(0.05)


def test_report_tolerates_a_partial_last_line_and_reads_alerts(healthy_dir):
    with open(healthy_dir / "metrics.jsonl", "a") as f:
        f.write('{"step": 201, "rewards/tot')
    alert = {"step": 150, "time": 1.0, "level": "warning", "rule": "kl_drift", "metric": "policy/kl",
             "value": 0.5, "message": "policy/kl is 0.5"}
    (healthy_dir / "alerts.jsonl").write_text(json.dumps(alert) + "\n")
    report = write_report(healthy_dir)
    assert report.steps == 200 and report.last_step == 200
    assert report.alerts_source == "alerts.jsonl"
    assert [(a.step, a.rule) for a in report.alerts] == [(150, "kl_drift")]
    assert "step 150 **warning** `kl_drift`" in (healthy_dir / "report.md").read_text()


def test_report_command_prints_and_writes(healthy_dir, capsys):
    assert main(["report", str(healthy_dir)]) == 0
    out = capsys.readouterr().out
    assert "Reward report: healthy-run" in out and "quality" in out and "What happened: held-out accuracy" in out
    for word in ("consistency", "discriminability", "stability", "coverage", "answer_check", "Reward hacking"):
        assert word in out
    assert (healthy_dir / "report.json").is_file() and (healthy_dir / "report.md").is_file()


def test_report_command_json_without_writing(healthy_dir, capsys):
    assert main(["report", str(healthy_dir), "--json", "--no-write"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert 0 <= data["quality"]["score"] <= 100 and len(data["quality"]["parts"]) == 4
    assert not (healthy_dir / "report.json").exists()


def test_report_command_refuses_what_is_not_a_run(tmp_path, capsys):
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "run directory not found" in capsys.readouterr().err
    assert main(["report", str(tmp_path)]) == 2
    assert "metrics.jsonl: not found" in capsys.readouterr().err
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "rew')
    assert main(["report", str(tmp_path)]) == 2
    assert "no metric records yet" in capsys.readouterr().err


def test_a_run_whose_held_out_accuracy_collapsed_is_not_praised():
    from mlx_grpo.telemetry.analysis.reward_report import analyze_run as analyze

    metrics, samples = _sim()
    accuracy = iter(np.linspace(0.46, 0.14, sum(1 for r in metrics if "eval/accuracy" in r)))
    collapsed = [{**r, "eval/accuracy": next(accuracy)} if "eval/accuracy" in r else r for r in metrics]
    report = analyze(collapsed, samples)
    headline = report.outcome.headline()
    assert headline.startswith("held-out accuracy 46.0% -> 14.0% (-32.0 points)")
    assert any("held-out accuracy fell from 46% to 14%" in issue for issue in report.quality.issues)


def _with_shares(metrics, shares: dict[str, float]):
    """The run's metrics with each named function's share of the total reward set to `shares`."""
    return [{**r, **{f"rewards/{fn}/contribution_pct": pct for fn, pct in shares.items()}}
            if "rewards/answer_check/contribution_pct" in r else r for r in metrics]


def test_a_charted_function_at_weight_0_is_not_called_drowned():
    metrics, samples = _sim()
    # answer_check is the only paid function; the others are charted at weight 0 (their share is 0 by design)
    charted = _with_shares(metrics, {"answer_check": 100.0, "format_exact": 0.0, "format_approx": 0.0,
                                     "number_check": 0.0})
    assert not any("drowns the others" in issue for issue in analyze_run(charted, samples).quality.issues)
    # two paid functions, one at 90% of the total: that one does drown the other
    lopsided = _with_shares(metrics, {"answer_check": 90.0, "format_exact": 10.0, "format_approx": 0.0,
                                      "number_check": 0.0})
    issues = analyze_run(lopsided, samples).quality.issues
    assert any(issue.startswith("answer_check makes up 90% of the total reward and drowns") for issue in issues)
