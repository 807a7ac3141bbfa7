"""Paths as people type them (command line: the current directory; YAML: the file's folder) and other
tools' names for our keys and flags (TRL, mlx-lm)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mlx_grpo.cli import main
from mlx_grpo.config.alias_table import ALIASES, NO_EQUIVALENT, TRANSLATED, markdown_table
from mlx_grpo.config.train_config import load_config

ROOT = Path(__file__).resolve().parents[2]
GSM8K_ROWS = (ROOT / "tests" / "data" / "gsm8k_sample.jsonl").read_text()
MODEL_DIR = ROOT / "mlx_grpo" / "default_model"


@pytest.fixture
def two_places(tmp_path, monkeypatch):
    """A config folder and a separate working directory, each holding files of the same names."""
    cfg, cwd = tmp_path / "cfg", tmp_path / "work"
    for where in (cfg, cwd):
        where.mkdir()
        (where / "data.jsonl").write_text(GSM8K_ROWS)
        (where / "rewards.py").write_text("def brevity(completions, **kw):\n    return [0.0 for _ in completions]\n")
        (where / "rubric.yaml").write_text("name: r\n")
        (where / "alerts.yaml").write_text("rules: []\n")
        shutil.copytree(MODEL_DIR, where / "model")
    (cfg / "run.yaml").write_text("num_steps: 3\n")
    monkeypatch.chdir(cwd)
    return cfg, cwd


PATH_KEYS = {  # key -> (value as typed, how to read the resolved path back from the config)
    "dataset": ("data.jsonl", lambda c: c.dataset),
    "eval_dataset": ("data.jsonl", lambda c: c.eval_dataset),
    "model_id": ("model", lambda c: c.model_id),
    "rewards": (["rewards.py:brevity"], lambda c: c.rewards[0].name.rsplit(":", 1)[0]),
    "rubric_file": ("rubric.yaml", lambda c: c.rubric_file),
    "alerts_file": ("alerts.yaml", lambda c: c.alerts_file),
}
RESOLVED = {"dataset": "data.jsonl", "eval_dataset": "data.jsonl", "model_id": "model", "rewards": "rewards.py",
            "rubric_file": "rubric.yaml", "alerts_file": "alerts.yaml"}


@pytest.mark.parametrize("key", sorted(PATH_KEYS))
def test_a_path_on_the_command_line_is_relative_to_the_current_directory(two_places, key):
    cfg, cwd = two_places
    value, read = PATH_KEYS[key]
    config = load_config(cfg / "run.yaml", {key: value})
    assert Path(read(config)) == cwd / RESOLVED[key]


@pytest.mark.parametrize("key", sorted(PATH_KEYS))
def test_a_path_in_a_yaml_file_is_relative_to_that_file(two_places, key):
    cfg, cwd = two_places
    value, read = PATH_KEYS[key]
    (cfg / "run.yaml").write_text(json.dumps({key: value}))  # JSON is YAML
    config = load_config(cfg / "run.yaml")
    assert Path(read(config)) == cfg / RESOLVED[key]


@pytest.mark.parametrize("key", ["monitoring_dir", "tensorboard_dir"])
def test_output_directories_follow_the_current_directory_wherever_they_are_written(two_places, key):
    cfg, _ = two_places
    (cfg / "run.yaml").write_text(f"{key}: out\n")
    assert getattr(load_config(cfg / "run.yaml"), key) == "out"  # the trainer opens it from the cwd
    assert getattr(load_config(cfg / "run.yaml", {key: "elsewhere"}), key) == "elsewhere"


def test_names_that_are_not_paths_stay_as_written(two_places):
    cfg, _ = two_places
    config = load_config(cfg / "run.yaml", {"dataset": "openai/gsm8k:main", "model_id": "Qwen/Qwen2.5-0.5B",
                                            "rewards": ["answer_check"]})
    assert (config.dataset, config.model_id, config.rewards[0].name) == ("openai/gsm8k:main", "Qwen/Qwen2.5-0.5B",
                                                                         "answer_check")
    assert load_config(cfg / "run.yaml").dataset == "arithmetic" and load_config().model_id == "default"
    assert load_config(None, {"model_id": "preset:qwen2.5-1.5b"}).model_id == "preset:qwen2.5-1.5b"


def test_the_readme_example_trains_on_a_dataset_next_to_where_it_is_typed(two_places):
    """README: `mlx-grpo train configs/lora_qwen_gsm8k.yaml --dataset my_gsm8k.jsonl`, the data in the cwd."""
    from mlx_grpo.data import load_datasets
    from mlx_grpo.rewards.loading import load_rewards

    cfg, cwd = two_places
    (cwd / "my_gsm8k.jsonl").write_text(GSM8K_ROWS)
    config = load_config(ROOT / "configs" / "lora_qwen_gsm8k.yaml",
                         {"dataset": "my_gsm8k.jsonl", "rewards": ["answer_check", "rewards.py:brevity"]})
    train, heldout = load_datasets(config, ROOT / "configs")  # the trainer's base_dir: the config's folder
    assert len(train) + len(heldout) == len(GSM8K_ROWS.splitlines())
    assert [f.name for f in load_rewards(config, ROOT / "configs")] == ["answer_check", "brevity"]


# ----------------------------------------------------------------------------- other tools' names

SAMPLE_VALUES = {"max_completion_length": 64, "iters": 9, "warmup_ratio": 0.1, "num_train_epochs": 2,
                 "dataset_prompt_column": "question", "use_peft": True, "lora_r": 4, "group_size": 4,
                 "grpo_loss_type": "dr_grpo", "reward_functions": ["answer_check"],
                 "reward_funcs": ["answer_check"], "logging_steps": 2, "steps_per_report": 2, "save_steps": 5,
                 "save_every": 5, "eval_steps": 4, "steps_per_eval": 4, "save_total_limit": 2,
                 "lr": 1e-5, "gradient_checkpointing": True, "model": "default",
                 "model_name_or_path": "default", "data": "arithmetic", "dataset_name": "arithmetic",
                 "num_layers": 4, "logging_dir": "tb"}


def test_every_alias_has_a_sample_and_no_alias_shadows_a_real_key():
    from mlx_grpo.config.train_config import top_level_fields

    assert set(SAMPLE_VALUES) == set(ALIASES)
    assert not (set(ALIASES) | set(TRANSLATED) | set(NO_EQUIVALENT)) & set(top_level_fields())
    assert all(alias.ours in top_level_fields() for alias in ALIASES.values())


@pytest.mark.parametrize("name", sorted(ALIASES))
def test_each_alias_works_as_a_yaml_key_and_as_a_flag(tmp_path, name, capsys):
    from mlx_grpo.cli import build_parser
    from mlx_grpo.commands.train import collect_overrides

    ours, value = ALIASES[name].ours, SAMPLE_VALUES[name]
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps({name: value}))
    from_file = getattr(load_config(path), ours)
    flag = "--" + name.replace("_", "-")
    argv = ["train", flag] if value is True else ["train", flag, *map(str, value if isinstance(value, list)
                                                                       else [value])]
    from_flag = getattr(load_config(None, collect_overrides(build_parser().parse_args(argv))), ours)
    expected = getattr(load_config(None, {ours: value}), ours)
    assert from_file == from_flag == expected, name
    err = capsys.readouterr().err
    assert f"read as ours: ({ALIASES[name].tool}) {name} as {ours}" in err, err


def test_translated_names_as_flags(tmp_path, capsys):
    from mlx_grpo.cli import build_parser
    from mlx_grpo.commands.train import collect_overrides

    def config(*argv):
        return load_config(None, collect_overrides(build_parser().parse_args(["train", *argv])))

    assert config("--report-to", "none").tensorboard is False
    assert config("--report-to", "wandb", "tensorboard").wandb is True
    assert config("--per-device-train-batch-size", "32", "--num-generations", "8").batch_size == 4
    run = config("--output-dir", "out/grpo-a")
    assert (run.monitoring_dir, run.run_name) == ("out", "grpo-a")
    assert config("--adapter-path", "adapters").run_name == "adapters"
    assert config("--fine-tune-type", "dora").use_dora is True and config("--fine-tune-type", "full").use_lora is False
    assert config("--bf16", "--use-lora").dtype == "auto"  # TRL's bf16: mixed precision over float32 weights
    assert config("--max-steps", "7").num_steps == 7
    assert config("--lr-scheduler-type", "constant_with_warmup").lr_schedule == "constant"
    assert config("--eval-strategy", "no").eval_every == 0
    assert config("--per-device-train-batch-size", "8", "--gradient-accumulation-steps", "4",
                  "--num-generations", "8").batch_size == 4


def test_no_abbreviations_a_prefix_is_never_a_longer_flag(capsys):
    assert main(["train", "--lr-sched", "constant"]) == 2  # was read as --lr-schedule
    assert "did you mean --lr-schedule?" in capsys.readouterr().err
    assert main(["train", "--model-i", "x"]) == 2  # was read as --model-id
    from mlx_grpo.cli import build_parser

    args = build_parser().parse_args(["train", "--lr", "1e-5"])  # was "--lr-schedule 1e-5"
    assert args.lr == "1e-5" and "lr_schedule" not in vars(args)


def test_did_you_mean_names_only_a_real_key_or_alias(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    for key, expected in [("repetition_penalty", "has no equivalent: sampling has no repetition penalty"),
                          ("logging_step", "did you mean 'logging_steps', TRL's name for log_every?"),
                          ("num_step", "did you mean 'num_steps'?"),
                          ("gradient_accumulation_steps", "multiplies per_device_train_batch_size, which is not set")]:
        path.write_text(f"{key}: 3\n")
        assert main(["train", str(path)]) == 2, key
        err = capsys.readouterr().err
        assert expected in err and "num_iterations" not in err, (key, err)
    for key in ("hub_model_id", "log_level", "logging_first_step"):  # TRL's: ignored, never a wrong guess
        path.write_text(f"{key}: x\nnum_steps: 0\n")
        assert main(["train", str(path)]) == 2
        err = capsys.readouterr().err
        assert "did you mean" not in err and f"ignored, as they change nothing here: {key} (TRL)" in err


def test_the_alias_table_is_in_the_readme_and_in_train_help(capsys):
    readme = (ROOT / "README.md").read_text()
    assert markdown_table() in readme  # regenerate with: python -c "from mlx_grpo.config.alias_table import *; print(markdown_table())"
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    help_text = capsys.readouterr().out
    for name in [*ALIASES, *TRANSLATED, *NO_EQUIVALENT]:
        assert f"\n  {name} " in help_text, name
