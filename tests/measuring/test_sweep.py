"""Sweeps (mlx-grpo sweep) and run comparison (mlx-grpo compare)."""

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from run_writer import start_sinks

from mlx_grpo.cli import main
from mlx_grpo.common.errors import UserError
from mlx_grpo.config.typed_yaml import parse_override
from mlx_grpo.measuring.sweep import load_sweep, plan_trials, trial_command, trial_config, trial_env
from mlx_grpo.telemetry.analysis.compare import config_differences, expand_run_dirs, load_summary
from mlx_grpo.telemetry.events import Scalars
from mlx_grpo.telemetry.rundir.writer import RunDirWriter, read_run_info, write_run_info

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path, monkeypatch):
    """Sweeps write where the command runs (output_dir is relative to the working directory)."""
    monkeypatch.chdir(tmp_path)
DEFAULT = ROOT / "configs" / "default.yaml"


def write_sweep(tmp_path, text, name="sweep.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


# ----------------------------------------------------------------------------- planning and checking

def test_example_sweep_is_a_checked_grid_over_the_default_config():
    spec = load_sweep(ROOT / "configs" / "sweep_example.yaml")
    trials = plan_trials(spec)
    assert [t.name for t in trials] == [f"trial-{i:03d}" for i in range(6)]
    assert sorted({t.params["learning_rate"] for t in trials}) == [5e-5, 1e-4, 2e-4]
    assert sorted({t.params["beta"] for t in trials}) == [0.0, 0.04]
    for trial in trials:
        config = trial_config(spec, trial)
        assert config.learning_rate == trial.params["learning_rate"] and config.num_steps == 100
    assert spec.directory == Path.cwd() / "sweeps" / "lr-beta"  # where the user stands, not in configs/


def test_random_search_draws_reproducibly_within_ranges(tmp_path):
    path = write_sweep(tmp_path, f"""
base: {DEFAULT}
method: random
trials: 20
seed: 3
parameters:
  learning_rate: {{min: 1.0e-5, max: 1.0e-3, distribution: log_uniform}}
  batch_size: {{min: 2, max: 9}}
  epsilon: {{min: 0.1, max: 0.3, step: 0.1}}
  loss_type: [grpo, dapo]
""")
    trials = plan_trials(load_sweep(path))
    assert trials == plan_trials(load_sweep(path))
    lrs = [t.params["learning_rate"] for t in trials]
    assert all(1e-5 <= lr <= 1e-3 for lr in lrs)
    assert min(lrs) < 1e-4 < max(lrs)  # log-uniform: about half the draws below the geometric middle
    assert all(isinstance(t.params["batch_size"], int) and 2 <= t.params["batch_size"] <= 9 for t in trials)
    assert {t.params["epsilon"] for t in trials} <= {0.1, 0.2, 0.3}
    assert {t.params["loss_type"] for t in trials} == {"grpo", "dapo"}


@pytest.mark.parametrize("body, message", [
    ("parameters: {learnin_rate: [1.0e-4]}",
     r"'parameters.learnin_rate' is not a run-config key \(did you mean 'learning_rate'"),
    ("paramters: {beta: [0.0]}", r"unknown key 'paramters' \(did you mean 'parameters'"),
    ("parameters: {beta: {min: 0.0, max: 0.1}}", r"'parameters.beta': a grid needs values, or a range with step"),
    ("parameters: {beta: {min: 0.2, max: 0.1, step: 0.1}}", r"'parameters.beta': min 0.2 is above max 0.1"),
    ("parameters: {learning_rate: {min: 0.0, max: 0.1, num: 3, distribution: log_uniform}}", r"needs min > 0"),
    ("parameters: {beta: {values: []}}", r"'parameters.beta.values' must be a non-empty list"),
    ("fixed: {run_name: x}\nparameters: {beta: [0.0]}", r"'fixed.run_name' is set by the sweep"),
    ("method: random\nparameters: {beta: [0.0]}", r"'trials' is None; random search needs a number of trials"),
    ("parameters: {learning_rate: [1.0e-4, 2.0]}", r"trial-001: learning_rate=2\): key 'learning_rate' is 2.0"),
    ("parameters: {adaptive_window.enable: [yes-please]}",
     r"key 'adaptive_window.enable' is 'yes-please'; expected true/false"),
    ("base: missing.yaml\nparameters: {beta: [0.0]}", r"key 'base': config file .*missing.yaml not found"),
])
def test_sweep_mistakes_name_the_file_and_the_key(tmp_path, body, message):
    path = write_sweep(tmp_path, body + "\n")
    with pytest.raises(UserError, match=message) as err:
        spec = load_sweep(path)
        for trial in plan_trials(spec):
            trial_config(spec, trial)
    assert str(path) in str(err.value)


def test_trial_commands_pass_exact_values_and_group_the_sweep_in_wandb(tmp_path, monkeypatch):
    path = write_sweep(tmp_path, f"""
name: tags
base: {DEFAULT}
fixed: {{system_prompt: "007", wandb_tags: [a, b]}}
parameters: {{temperature: [0.5, 1.0]}}
""")
    spec = load_sweep(path)
    trial = plan_trials(spec)[0]
    command = trial_command(spec, trial, resume=False)
    sets = dict(parse_override(command[i + 1]) for i, word in enumerate(command) if word == "--set")
    assert sets == {"system_prompt": "007", "wandb_tags": ["a", "b"], "temperature": 0.5,
                    "monitoring_dir": str(tmp_path / "sweeps" / "tags"), "run_name": "trial-000"}
    assert command[command.index("train") + 1] == str(DEFAULT)
    assert trial_command(spec, trial, resume=True)[-2:] == ["--resume", str(spec.directory / "trial-000")]
    monkeypatch.delenv("WANDB_RUN_GROUP", raising=False)
    assert trial_env(spec)["WANDB_RUN_GROUP"] == "tags"
    monkeypatch.setenv("WANDB_RUN_GROUP", "mine")
    assert trial_env(spec)["WANDB_RUN_GROUP"] == "mine"


# ----------------------------------------------------------------------------- compare

def _fake_run(root: Path, name: str, config: dict, rewards: list, eval_accuracy=None, torn=False, world_size=1):
    writer = RunDirWriter(root / name)
    start_sinks(writer, root / name, name, {"run_name": name, "monitoring_dir": str(root), **config}, versions={},
                device={"world_size": world_size}, total_steps=len(rewards))
    for step, reward in enumerate(rewards, 1):
        writer.handle(Scalars(step, {"rewards/total/mean": reward, "tokens/total": 100.0, "timing/step_s": 0.5,
                                     "accuracy/train": reward / 2, "timing/elapsed_s": step * 0.5,
                                     **({"eval/accuracy": eval_accuracy} if eval_accuracy is not None else {})}))
    writer.close("finished")
    if torn:
        with open(root / name / "metrics.jsonl", "a") as fh:
            fh.write('{"step": 99, "rewards/total/me')
    return root / name


def test_compare_summarises_runs_and_shows_only_the_config_keys_that_differ(tmp_path):
    a = _fake_run(tmp_path, "a", {"learning_rate": 1e-4, "beta": 0.04, "sgrpo": {"enable": False}}, [0.1, 0.5],
                  eval_accuracy=0.3)
    b = _fake_run(tmp_path, "b", {"learning_rate": 2e-4, "beta": 0.04, "sgrpo": {"enable": True}}, [0.2, 0.9],
                  torn=True, world_size=2)
    summaries = [load_summary(p) for p in expand_run_dirs([tmp_path])]
    assert [s.name for s in summaries] == ["a", "b"]
    assert config_differences(summaries) == ["learning_rate", "sgrpo.enable", "world_size"]
    assert summaries[1].steps == 2 and summaries[1].final_reward == 0.9  # the torn line is ignored
    assert summaries[0].eval_accuracy == 0.3 and summaries[1].eval_accuracy is None
    assert summaries[0].tokens_per_s == pytest.approx(200.0)

    env = dict(os.environ, COLUMNS="200")
    code = ("import sys; from mlx_grpo.cli import main; rc = main(['compare', '--sort', 'final_reward', "
            f"{str(a)!r}, {str(b)!r}]); "
            "assert not [m for m in sys.modules if m == 'mlx' or m.startswith('mlx.')], 'mlx imported'; sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if "finished" in line]
    assert [row.split()[1] for row in rows] == ["b", "a"]  # best final reward first
    assert "learning_rate" in done.stdout and "run_name" not in done.stdout and "30.0%" in done.stdout


def test_compare_refuses_a_directory_without_runs(tmp_path, capsys):
    assert main(["compare", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err


# ----------------------------------------------------------------------------- real trials

@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from tiny_models import make_model_dir

    return make_model_dir(tmp_path_factory.mktemp("model") / "llama", "llama")


FAST_FIXED = """
  num_steps: 2
  batch_size: 2
  num_generations: 4
  max_generation_steps: 8
  eval_every: 2
  eval_size: 4
  tensorboard: false
"""


def test_small_sweep_of_the_default_config_runs_once_and_compares(tmp_path, tiny_model, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    path = write_sweep(tmp_path, f"""
name: small
base: {DEFAULT}
fixed:
  model_id: {tiny_model}{FAST_FIXED}
parameters:
  learning_rate: [1.0e-4, 3.0e-4]
  beta: [0.0, 0.04]
""")
    assert main(["sweep", str(path), "--parallel", "2"]) == 0
    out = capsys.readouterr().out
    directory = tmp_path / "sweeps" / "small"
    trials = sorted(p for p in directory.iterdir() if p.name.startswith("trial-"))
    assert [p.name for p in trials] == ["trial-000", "trial-001", "trial-002", "trial-003"]
    for p in trials:
        info = read_run_info(p)
        assert info.status == "finished" and info.config["model_id"] == str(tiny_model)
        assert len((p / "metrics.jsonl").read_text().splitlines()) == 3  # step 0's evaluation and two steps
    assert read_run_info(trials[3]).config["learning_rate"] == 3e-4
    assert read_run_info(trials[3]).config["beta"] == 0.04
    assert out.count("finished in") == 4

    stamps = [(p / "run.json").stat().st_mtime_ns for p in trials]
    assert main(["sweep", str(path)]) == 0  # nothing left to do
    assert capsys.readouterr().out.count("already finished") == 4
    assert [(p / "run.json").stat().st_mtime_ns for p in trials] == stamps

    assert main(["compare", str(directory)]) == 0
    table = capsys.readouterr().out
    assert all(f"trial-00{i}" in table for i in range(4))
    header = next(line for line in table.splitlines() if "run" in line and "status" in line)
    assert "learning_rate" in header and "beta" in header and "num_steps" not in header
    assert table.count("finished") == 4 and "2/2" in table

    path.write_text(path.read_text().replace("[0.0, 0.04]", "[0.0, 0.08]"))
    with pytest.raises(UserError, match="'trials' differs from the sweep already in"):
        main(["--debug", "sweep", str(path)])


@pytest.mark.slow  # 8 s: trains a trial twice; test_resume.py keeps resuming itself in the default suite
def test_an_unfinished_trial_is_resumed_not_restarted(tmp_path, tiny_model, capsys):
    path = write_sweep(tmp_path, f"""
name: one
base: {DEFAULT}
fixed:
  model_id: {tiny_model}
  checkpoint_every: 1{FAST_FIXED}
parameters:
  beta: [0.0]
""")
    assert main(["sweep", str(path)]) == 0
    run_dir = tmp_path / "sweeps" / "one" / "trial-000"
    # make it look stopped after step 1: its step-1 checkpoint is the latest and run.json says interrupted
    shutil.rmtree(run_dir / "checkpoints" / "step_2")
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()  # step 0 (the evaluation), 1, 2
    (run_dir / "metrics.jsonl").write_text(lines[0] + "\n" + lines[1] + "\n")
    write_run_info(run_dir, replace(read_run_info(run_dir), status="interrupted"))
    first = json.loads(lines[1])

    assert main(["sweep", str(path)]) == 0
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    assert records[1] == first  # step 1 kept, not trained again
    assert read_run_info(run_dir).status == "finished"
    assert "trial-000: resumed" in capsys.readouterr().out
