"""Every user mistake ends in one line on stderr that names the file, line or key, a non-zero exit and no
traceback (unless --debug). One test per kind of mistake, through the real command line."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_models import make_model_dir

from mlx_grpo.cli import main
from mlx_grpo.common.errors import UserError

# train_size: not the default 20,000 rows, whose drawing and tokenizing took ~1 s of each short run
FAST = ["--num-steps", "1", "--batch-size", "2", "--num-generations", "2", "--max-generation-steps", "4",
        "--eval-every", "0", "--no-tensorboard", "--no-wandb", "--train-size", "64"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("model") / "llama", "llama")


def one_line_error(capsys, argv, *expected):
    """Run `mlx-grpo argv`; the one stderr line must contain every `expected` text."""
    code = main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code != 0
    assert len(lines) == 1 and lines[0].startswith("mlx-grpo train: error: "), err
    assert "Traceback" not in err
    for text in expected:
        assert text in lines[0], (text, lines[0])
    return lines[0]


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def train_with(tmp_path, model, *flags):
    return ["train", "--model-id", str(model), "--monitoring-dir", str(tmp_path / "runs"), *FAST, *flags]


# ----------------------------------------------------------------------------- config


def test_malformed_yaml_names_file_and_line(tmp_path, capsys):
    config = write(tmp_path / "run.yaml", "num_steps: 3\nbatch_size: [1, 2\nseed: 1\n")
    one_line_error(capsys, ["train", str(config)], f"{config}:3: not valid YAML")


def test_unknown_key_names_it_and_suggests_the_right_one(tmp_path, capsys):
    config = write(tmp_path / "run.yaml", "num_step: 3\n")
    one_line_error(capsys, ["train", str(config)], str(config), "unknown key 'num_step'", "did you mean 'num_steps'")


@pytest.mark.parametrize("text, expected", [
    ("num_steps: many\n", "key 'num_steps' is 'many'; expected an integer"),
    ("use_lora: maybe\n", "key 'use_lora' is 'maybe'; expected true/false"),
    ("learning_rate: 2\n", "key 'learning_rate' is 2.0; expected at least 0 and below 1"),
    ("num_generations: 1\n", "key 'num_generations' is 1; expected at least 2"),
    ("loss_type: ppo\n", "key 'loss_type' is 'ppo'; expected one of grpo, bnpo, dr_grpo, dapo"),
])
def test_wrong_type_or_impossible_value_names_the_key(tmp_path, capsys, text, expected):
    config = write(tmp_path / "run.yaml", text)
    one_line_error(capsys, ["train", str(config)], str(config), expected)


def test_wrong_flag_value_names_the_key(capsys):
    one_line_error(capsys, ["train", "--batch-size", "0"], "key 'batch_size' is 0; expected at least 1")


# ----------------------------------------------------------------------------- model


def test_missing_model_directory(tmp_path, capsys):
    one_line_error(capsys, ["train", "--model-id", str(tmp_path / "nope")], "directory not found")


@pytest.mark.parametrize("files, expected", [
    ({}, "not a model directory (no config.json)"),
    ({"config.json": "{}"}, "not a model directory (no *.safetensors weights)"),
    ({"config.json": "not json", "model.safetensors": None}, "could not be loaded: JSONDecodeError"),
    ({"config.json": '{"model_type": "llama"}', "model.safetensors": None}, "missing 6 required positional"),
    ({"config.json": '{"model_type": "nonesuch"}', "model.safetensors": None}, "Model type nonesuch not supported"),
    ({"config.json": None, "model.safetensors": "garbage"}, "could not be loaded: RuntimeError"),
])
def test_a_directory_that_is_not_a_model(tmp_path, model, capsys, files, expected):
    target = tmp_path / "not_a_model"
    target.mkdir()
    for name, text in files.items():
        if text is None:  # the tiny model's own file
            (target / name).write_bytes((model / name).read_bytes())
        else:
            (target / name).write_text(text)
    one_line_error(capsys, ["train", "--model-id", str(target), *FAST], f"model '{target}'", expected)


# ----------------------------------------------------------------------------- dataset


def test_missing_dataset(tmp_path, model, capsys):
    one_line_error(capsys, train_with(tmp_path, model, "--dataset", str(tmp_path / "none.jsonl")),
                   f"{tmp_path / 'none.jsonl'}: dataset file not found")


def test_empty_dataset(tmp_path, model, capsys):
    data = write(tmp_path / "empty.jsonl", "\n\n")
    one_line_error(capsys, train_with(tmp_path, model, "--dataset", str(data)), f"{data}: dataset is empty")


@pytest.mark.parametrize("text, expected", [
    ('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer": \n', ":2: malformed JSON"),
    ('{"prompt": "1+1=", "answer": "2"}\n\n["a list"]\n', ":3: expected a JSON object per line"),
    ('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2="}\n', ":2: missing field 'answer'"),
    ('{"prompt": 7, "answer": "2"}\n', ":1: field 'prompt' must be a string"),
])
def test_malformed_dataset_names_the_line(tmp_path, model, capsys, text, expected):
    data = write(tmp_path / "data.jsonl", text)
    one_line_error(capsys, train_with(tmp_path, model, "--dataset", str(data)), f"{data}{expected}")


# ----------------------------------------------------------------------------- reward functions


def test_reward_file_that_fails_to_import(tmp_path, model, capsys):
    rewards = write(tmp_path / "rewards.py", "def score(prompts, completions, answers, **kw)\n    return []\n")
    one_line_error(capsys, train_with(tmp_path, model, "--set", f"rewards=['{rewards}:score']"),
                   f"cannot import reward file {rewards}", "SyntaxError")


def test_reward_file_without_the_function(tmp_path, model, capsys):
    rewards = write(tmp_path / "rewards.py", "def other(prompts, completions, answers, **kw):\n    return []\n")
    one_line_error(capsys, train_with(tmp_path, model, "--set", f"rewards=['{rewards}:score']"),
                   f"reward file {rewards} has no function 'score'")


def test_missing_reward_file(tmp_path, model, capsys):
    one_line_error(capsys, train_with(tmp_path, model, "--set", f"rewards=['{tmp_path / 'gone.py'}:score']"),
                   f"reward file not found: {tmp_path / 'gone.py'}")


def test_reward_returning_the_wrong_number_of_scores(tmp_path, model, capsys):
    rewards = write(tmp_path / "rewards.py", "def score(prompts, completions, answers, **kw):\n    return [1.0]\n")
    line = one_line_error(capsys, train_with(tmp_path, model, "--set", f"rewards=['{rewards}:score']"),
                          "reward function 'score' returned 1 scores for 4 completions")
    assert line  # the run directory records the failure too
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert '"status": "failed"' in (run_dir / "run.json").read_text()


# ----------------------------------------------------------------------------- rubric and alert files


@pytest.mark.parametrize("text, expected", [
    ("name: r\ncriteria:\n  - name: a\n    weight: 1\n    scorer: regex\n    pattern: '('\n",
     ":6: criterion 'a': pattern"),
    ("name: r\ncriteria: [\n", ": not valid YAML"),
    ("name: r\ncriteria:\n  - name: a\n    scorer: regex\n    patern: x\n", ":5: criterion 'a': patern: unknown key"),
    ("name: r\ncriteria:\n  - name: a\n    scorer: regex\n    pattern: x\n", ":3: criterion 'a': weight: required"),
])
def test_rubric_file_errors(tmp_path, model, capsys, text, expected):
    rubric = write(tmp_path / "rubric.yaml", text)
    one_line_error(capsys, train_with(tmp_path, model, "--rubric-file", str(rubric)), f"{rubric}", expected)


def test_missing_rubric_file(tmp_path, model, capsys):
    one_line_error(capsys, train_with(tmp_path, model, "--rubric-file", str(tmp_path / "none.yaml")),
                   "rubric file not found")


@pytest.mark.parametrize("text, expected", [
    ("rules:\n  - name: x\n    kind: threshold\n    metric: policy/loss\n    op: '>'\n", "value"),
    ("rules:\n  - name: x\n    kind: teleport\n    metric: a\n", "teleport"),
    ("rules: [\n", "YAML"),
])
def test_alert_file_errors(tmp_path, model, capsys, text, expected):
    alerts = write(tmp_path / "alerts.yaml", text)
    one_line_error(capsys, train_with(tmp_path, model, "--alerts", str(alerts)), str(alerts), expected)


# ----------------------------------------------------------------------------- the real command


def run_cli(*argv):
    env = {**os.environ, "WANDB_MODE": "disabled"}
    return subprocess.run([sys.executable, "-m", "mlx_grpo.cli", *argv], capture_output=True, text=True, env=env,
                          timeout=120)


def test_the_command_prints_one_line_and_debug_prints_the_traceback(tmp_path):
    config = write(tmp_path / "run.yaml", "num_steps: 3\nnum_step: 4\n")
    plain = run_cli("train", str(config))
    assert plain.returncode == 2
    expected = f"mlx-grpo train: error: {config}: unknown key 'num_step' (did you mean 'num_steps'?)"
    assert plain.stderr.strip().splitlines() == [expected]
    # --debug lets the error through to Python, which prints its traceback (in-process: one launch is enough)
    with pytest.raises(UserError, match="unknown key 'num_step'"):
        main(["--debug", "train", str(config)])


# ----------------------------------------------------------------------------- every value checked (review D9-D19)


@pytest.mark.parametrize("flag,value,says", [
    ("--temperature", ".inf", "key 'temperature' is inf; expected a finite number"),
    ("--weight-decay", ".nan", "expected a finite number"),
    ("--seed", "-1", "key 'seed' is -1"),
    ("--seed", str(10**20), "key 'seed'"),
    ("--run-name", "../../escaped", "key 'run_name'"),
    ("--run-name", "x" * 300, "key 'run_name'"),
])
def test_values_that_would_break_a_run_later_are_refused_at_once(tmp_path, capsys, flag, value, says):
    code = main(["train", flag, value, "--monitoring-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and says in err[0], err
    assert not (tmp_path / "runs").exists()


def test_non_utf8_config_and_dataset_files_are_one_line_with_the_place(tmp_path, capsys):
    config = tmp_path / "b.yaml"
    config.write_bytes(b"num_steps: 1\nsystem_prompt: caf\xe9\n")
    assert main(["train", str(config)]) == 2
    assert capsys.readouterr().err.strip() == f"mlx-grpo train: error: {config}:2: not UTF-8 text (byte 0xe9)"
    data = tmp_path / "d.jsonl"
    data.write_bytes(b'{"prompt": "1+1=", "answer": "2"}\n{"prompt": "caf\xe9", "answer": "3"}\n')
    assert main(["train", "--dataset", str(data), "--monitoring-dir", str(tmp_path / "runs")]) == 2
    assert f"{data}:2: not UTF-8 text" in capsys.readouterr().err


def test_a_null_or_structured_answer_is_refused_with_its_line(tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer": null}\n')
    assert main(["train", "--dataset", str(data), "--monitoring-dir", str(tmp_path / "runs")]) == 2
    assert f"{data}:2: field 'answer' must be a string or a number, got null" in capsys.readouterr().err


def test_a_reward_function_calling_sys_exit_is_a_reward_error_not_the_end_of_the_run():
    from mlx_grpo.rewards.scoring import RewardFunction, score_completions

    def leaves(prompts, completions, answers, **columns):
        raise SystemExit(0)

    scores = score_completions([RewardFunction("leaves", leaves, 1.0)], ["p"], ["c"], ["a"])
    assert "reward function 'leaves' raised SystemExit" in scores.new_errors[0]


def test_a_generation_budget_that_cannot_fit_is_refused_by_the_memory_plan(tmp_path, capsys):
    code = main(["train", "--max-generation-steps", "100000000", "--monitoring-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "this run needs ~" in err[0]  # not a segfault in the KV cache


def test_reward_totals_that_overflow_stop_the_run_instead_of_skipping_every_update():
    from mlx_grpo.rewards.scoring import RewardFunction, score_completions

    def huge(prompts, completions, answers, **columns):
        return [1e308] * len(completions)

    functions = [RewardFunction("huge", huge, 1.0), RewardFunction("also_huge", huge, 1.0)]
    with pytest.raises(UserError, match="reward function 'huge' scores up to 1e\\+308"):
        score_completions(functions, ["p"], ["c"], ["a"])


def test_an_oversized_lora_rank_and_a_list_key_given_a_scalar_are_one_clear_line(tmp_path, capsys):
    code = main(["train", "--use-lora", "--lora-rank", "100000", "--no-memory-check", "--monitoring-dir",
                 str(tmp_path / "runs")])
    assert code == 2 and "key 'lora_rank' is 100000; expected at most the model's hidden size" in \
        capsys.readouterr().err
    config = tmp_path / "c.yaml"
    config.write_text("rewards: answer_check\n")
    assert main(["train", str(config)]) == 2
    assert "expected a list of reward names (or mappings with name and weight)" in capsys.readouterr().err


def test_a_dataset_column_named_like_a_reward_argument_is_refused_with_its_line(tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2", "completions": 3}\n')
    assert main(["train", "--dataset", str(data), "--monitoring-dir", str(tmp_path / "runs")]) == 2
    assert f"{data}:1: column 'completions' has the name of a reward function's own argument" in \
        capsys.readouterr().err
