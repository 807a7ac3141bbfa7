"""A short run of the default config writes every catalogued metric that applies to it, everywhere."""

import json
from pathlib import Path

from tbparse import SummaryReader

from mlx_grpo.config.train_config import load_config
from mlx_grpo.run.loop import train
from mlx_grpo.telemetry.metrics.catalogue import CATALOGUE, find_entry
from mlx_grpo.telemetry.rundir.layout import RUN_JSON
from mlx_grpo.telemetry.rundir.writer import read_run_info, write_run_info

# Emitted only when the batch holds such completions (none of 128 truncated, say): not every step has them.
DEPENDS_ON_THE_BATCH = {"completions/truncated_correct_frac"}

# Catalogue entries neither the default run nor the extras run (conftest.py) can write on this machine,
# and where each is checked instead. Every other entry must appear in one of the two runs.
WANDB_ONLY = {  # W&B media: tests/telemetry/test_telemetry_wandb.py
    "charts/reward_breakdown", "charts/reward_landscape_3d", "charts/reward_components_3d",
    "charts/policy_evolution_3d", "charts/criteria_heatmap", "charts/criteria_over_time", "charts/reward_heatmap",
    "final/rubric_criteria_summary"}
# macOS, and Metal's working-set limit (the CPU backend reports none): read in tests/telemetry/test_alert_actions.py
MAC_ONLY = {"system/gpu_utilization_percent", "memory/peak_percent", "system/accel_limit_gb",
            "system/accel_memory_percent", "system/accel_held_percent", "system/memory_pressure_level",
            # macOS's physical state (pmset): tests/telemetry/test_mac_state.py
            "system/cpu_speed_limit_percent", "system/low_power_mode", "system/on_battery",
            "system/thermal_warning_level"}
# a judge server: tests/rewards/test_judge.py
JUDGE_ONLY = {"judge/api_tokens", "judge/api_tokens_total", "judge/failed_requests"}
WHEN_AN_ALERT_FIRES = {"alerts"}  # a healthy run fires none: tests/telemetry/test_telemetry_sinks.py
# opt-in sampled held-out metrics (eval_samples: N), which cost N more decodes per prompt:
# tests/telemetry/test_verdicts.py
OPT_IN = {"eval/mean@<k>", "eval/pass@<k>"}
# multi-turn runs with tools or an environment: written in tests/multiturn/test_multiturn.py's run
MULTITURN = {"tools/call_frequency", "tools/failure_frequency", "tools/called_frac", "tools/<tool>/calls",
             "tools/<tool>/failures", "multiturn/turns_mean", "multiturn/model_tokens_mean",
             "multiturn/environment_tokens_mean", "multiturn/environment_reward_mean", "multiturn/ended_frac"}
NOT_IN_THESE_RUNS = WANDB_ONLY | MAC_ONLY | JUDGE_ONLY | WHEN_AN_ALERT_FIRES | DEPENDS_ON_THE_BATCH | OPT_IN | MULTITURN


def expected_every_step_names(reward_names):
    names = set()
    for entry in CATALOGUE:
        if entry.kind != "scalar" or entry.when != "every logged step":
            continue
        if "<fn>" in entry.name:
            names.update(entry.name.replace("<fn>", fn) for fn in reward_names)
        else:
            names.add(entry.name)
    return names - DEPENDS_ON_THE_BATCH


def test_every_record_is_complete_and_catalogued(default_run):
    run_dir, records = default_run
    # step 0: the held-out evaluation before the first update, and nothing else
    assert [r["step"] for r in records] == list(range(0, 7))
    assert all(k.startswith("eval/") or k in ("step", "time", "timing/eval_s", "timing/elapsed_s") for k in records[0])
    assert "eval/accuracy" in records[0]
    seen = set().union(*records)
    uncatalogued = sorted(k for k in seen - {"step", "time"} if find_entry(k) is None)
    assert uncatalogued == []
    functions = ["format_exact", "format_approx", "answer_check", "number_check"]
    missing = sorted(expected_every_step_names(functions) - seen)
    assert missing == []
    for name in ("eval/accuracy", "eval/difficulty/3/accuracy", "epoch/reward/mean", "epoch/reward/trend",
                 "epoch/loss/trend", "difficulty/3/accuracy", "timing/checkpoint_s", "timing/eval_s"):
        assert name in seen, name
    final = json.loads((run_dir / "final_metrics.json").read_text())
    for fn in functions + ["total"]:
        for stat in ("mean", "std", "min", "max", "total_samples"):
            assert f"final/{fn}/{stat}" in final


def test_tensorboard_holds_the_same_scalars_and_histograms(default_run):
    run_dir, records = default_run
    reader = SummaryReader(str(run_dir / "tensorboard"))
    scalar_tags = set(reader.scalars["tag"])
    logged = {k for r in records for k, v in r.items() if k not in ("step", "time") and v is not None}
    assert sorted(logged - scalar_tags) == []
    histogram_tags = set(reader.histograms["tag"]) if len(reader.histograms) else set()
    assert {"rewards/total/hist", "rewards/answer_check/hist", "advantages/hist"} <= histogram_tags
    steps = reader.scalars[reader.scalars["tag"] == "rewards/total/mean"]["step"].tolist()
    assert steps == list(range(1, 7))


def test_epochs_close_at_the_step_that_draws_their_last_prompt(default_run):
    _, records = default_run
    G = load_config(Path(__file__).parents[2] / "configs" / "default.yaml", {}).num_generations
    closed = {r["step"]: r for r in records if "epoch/index" in r}
    assert sorted(closed) == [2, 4, 6]  # 8 rows, 4 prompts a step: every second step ends an epoch
    assert [closed[s]["epoch/index"] for s in (2, 4, 6)] == [1, 2, 3]
    assert all(r["epoch/num_samples"] == 2 * 4 * G and r["epoch/partial"] == 0 for r in closed.values())


def test_checkpoint_time_is_in_the_record_of_the_step_it_saved(default_run):
    run_dir, records = default_run
    assert [r["step"] for r in records if "timing/checkpoint_s" in r] == [3, 6]  # the last one is not lost
    assert all(r["timing/checkpoint_s"] > 0 for r in records if "timing/checkpoint_s" in r)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_3", "step_6"]


def test_a_run_ending_inside_an_epoch_reports_the_partial_epoch(tmp_path):
    config = load_config(Path(__file__).parents[2] / "configs" / "default.yaml", {
        "num_steps": 3, "batch_size": 4, "train_size": 8, "eval_every": 0, "tensorboard": False,
        "monitoring_dir": str(tmp_path / "runs"), "wandb": False})
    result = train(config, tmp_path)
    records = [json.loads(line) for line in (Path(result["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    epochs = [(r["step"], r["epoch/index"], r["epoch/partial"], r["epoch/num_samples"]) for r in records
              if "epoch/index" in r]
    G = config.num_generations
    assert epochs == [(2, 1, 0, 2 * 4 * G), (3, 2, 1, 4 * G)]


def test_run_json_round_trips_through_run_info(default_run, tmp_path):
    """Old runs and new ones are one format: RunInfo knows every key the trainer writes, and writes them back
    byte for byte."""
    run_dir, _ = default_run
    info = read_run_info(run_dir)
    assert info.extra == {} and info.status == "finished" and info.world_size == 1
    assert info.to_dict() == json.loads((run_dir / RUN_JSON).read_text())
    write_run_info(tmp_path, info)
    assert (tmp_path / RUN_JSON).read_bytes() == (run_dir / RUN_JSON).read_bytes()


def written_names(run_dir: Path) -> set[str]:
    """Every metric name a run directory holds: metrics.jsonl, TensorBoard's tags, final_metrics.json."""
    names = set().union(*(json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()))
    reader = SummaryReader(str(run_dir / "tensorboard"), pivot=False, extra_columns=set())
    for frame in (reader.scalars, reader.histograms, reader.text):
        if len(frame):
            names.update(frame["tag"])
    names.update(json.loads((run_dir / "final_metrics.json").read_text()))
    return names - {"step", "time"}


def test_every_catalogue_entry_is_written_by_the_default_or_the_extras_run(default_run, extras_run):
    written = written_names(default_run[0]) | written_names(extras_run)
    covered = {find_entry(name).name for name in written if find_entry(name) is not None}
    listed = {entry.name for entry in CATALOGUE} & NOT_IN_THESE_RUNS
    assert listed == NOT_IN_THESE_RUNS  # every exception names a real entry
    never = sorted(entry.name for entry in CATALOGUE if entry.name not in covered | NOT_IN_THESE_RUNS)
    assert never == [], " ".join(never)
    assert sorted(covered & NOT_IN_THESE_RUNS) == []  # an exception these runs do write is no exception
