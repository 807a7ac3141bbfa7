"""A few steps of the default task with the training extras on: their metrics reach metrics.jsonl and
TensorBoard, the window follows the previous step's successes, S-GRPO trains on its exits, dumps appear."""

import json
import math
from pathlib import Path

import pytest
from short_runs import BATCH, EXITS, GROUP, STEPS, run
from tbparse import SummaryReader

from mlx_grpo.extras.entropy_dump import list_dumps, read_dump
from mlx_grpo.telemetry.metrics.catalogue import find_entry


def records(run_dir: Path) -> list[dict]:
    """The steps' records (step 0's, the held-out evaluation before the first update, left out)."""
    return [r for line in (run_dir / "metrics.jsonl").read_text().splitlines() if (r := json.loads(line))["step"]]


# The extras run itself is the session fixture `extras_run` (conftest.py): the catalogue's coverage check
# in test_default_run_telemetry.py reads it too.


def test_every_feature_metric_is_in_metrics_jsonl_and_tensorboard(extras_run):
    recs = records(extras_run)
    assert [r["step"] for r in recs] == list(range(1, STEPS + 1))
    expected = {"adaptive_window/current_window", "adaptive_window/num_success_samples",
                "adaptive_window/success_rate", "adaptive_window/success_rate_ema",
                "adaptive_window/exploration_rate", "adaptive_window/epsilon",
                "adaptive_window/cumulative_success_rate", "adaptive_window/explored_step",
                "sgrpo/overall_accuracy", *(f"sgrpo/exit_{k}/accuracy" for k in range(1, EXITS + 1))}
    for rec in recs:
        assert expected <= rec.keys()
        assert any(name.startswith("difficulty/") and name.endswith("/accuracy") for name in rec)
    seen = set().union(*recs)
    # lengths of successful completions and the mean correct exit need something to be right: the
    # shipped model answers some sums correctly from the start
    assert {"adaptive_window/mean_success_length", "adaptive_window/median_success_length",
            "adaptive_window/std_success_length", "adaptive_window/p95_success_length",
            "sgrpo/avg_correct_exit_position"} <= seen
    assert any(name.startswith("eval/difficulty/") for name in recs[-1])
    extras = {n for n in seen if n.split("/")[0] in ("adaptive_window", "sgrpo", "difficulty", "eval")}
    assert all(find_entry(n) is not None for n in extras), sorted(n for n in extras if find_entry(n) is None)

    scalars = SummaryReader(str(extras_run / "tensorboard")).scalars
    for name in extras:
        # the end-of-run summary repeats eval/* at the last step: same value, so drop repeats
        logged = scalars[(scalars.tag == name) & (scalars.step > 0)].drop_duplicates(["step", "value"])
        logged = logged.sort_values("step")  # step 0, the evaluation before the first update, is not in recs
        from_jsonl = [(r["step"], r[name]) for r in recs if name in r]
        assert list(logged.step) == [step for step, _ in from_jsonl], name
        assert list(logged.value) == pytest.approx([value for _, value in from_jsonl], rel=1e-5), name


def test_window_follows_the_previous_steps_successes_and_bounds_the_rollout(extras_run):
    recs = records(extras_run)
    assert recs[0]["adaptive_window/current_window"] == 24  # nothing learned yet: the configured maximum
    for before, rec in zip(recs, recs[1:]):
        window = rec["adaptive_window/current_window"]
        assert rec["completions/length/max"] <= window
        if rec["adaptive_window/explored_step"]:
            assert window == 24
        elif before["adaptive_window/num_success_samples"]:
            # percentile 95 and margin 4, clamped to [min_window 8, 24]
            assert window == min(24, max(8, math.ceil(before["adaptive_window/p95_success_length"]) + 4))
    assert any(r["adaptive_window/current_window"] < 24 for r in recs)


def test_sgrpo_trains_on_the_exits_and_entropy_dumps_cover_them(extras_run):
    recs = records(extras_run)
    for rec in recs:
        exits = [rec[f"sgrpo/exit_{k}/accuracy"] for k in range(1, EXITS + 1)]
        assert rec["sgrpo/overall_accuracy"] == pytest.approx(sum(exits) / EXITS)
    dumps = list_dumps(extras_run)
    assert [int(read_dump(p)["step"]) for p in dumps] == list(range(1, STEPS + 1))
    arrays = read_dump(dumps[0])
    assert arrays["entropy"].shape[0] == BATCH * GROUP * EXITS  # one row per exit: what the update saw
    mask = arrays["response_mask"].astype(bool)
    assert (arrays["entropy"][mask] >= 0).all() and (arrays["varentropy"][mask] >= 0).all()
    assert recs[0]["policy/entropy"] == pytest.approx(float(arrays["entropy"][mask].mean()), rel=1e-4)


def test_features_off_log_none_of_their_metrics(tmp_path):
    run_dir = run(tmp_path, "plain", num_steps=2, eval_every=0)
    seen = set().union(*records(run_dir))
    assert not any(n.startswith(("adaptive_window/", "sgrpo/")) for n in seen)
    assert any(n.startswith("difficulty/") for n in seen)  # the task labels difficulty whatever is on
    assert not (run_dir / "entropy").exists()
