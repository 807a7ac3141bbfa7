"""Run configs: defaults, YAML files, overrides, and one clear line for every mistake."""

import json
from pathlib import Path

import pytest

from mlx_grpo.cli import main
from mlx_grpo.common.errors import UserError
from mlx_grpo.config.train_config import TrainConfig, load_config

CONFIGS = Path(__file__).parents[2] / "configs"


def test_shipped_default_yaml_is_the_built_in_default():
    assert load_config(CONFIGS / "default.yaml") == TrainConfig()


def test_every_shipped_config_loads():
    for path in CONFIGS.glob("*.yaml"):
        if path.name.startswith(("rubric", "sweep", "alerts")):
            continue  # other file kinds, checked by their own tests
        load_config(path)


def test_seed_document_config_fields_exist():
    fields = set(TrainConfig.__dataclass_fields__)
    for name in ("model_id", "num_steps", "learning_rate", "batch_size", "use_lora", "lora_rank", "lora_alpha",
                 "num_generations", "beta", "epsilon", "temperature", "max_prompt_length", "max_generation_steps",
                 "weight_decay", "max_grad_norm", "warmup_fraction", "seed", "rubric_file", "rubric_weight"):
        assert name in fields


def test_overrides_beat_the_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("num_steps: 10\nlearning_rate: 2.0e-4\n")
    config = load_config(path, {"num_steps": 3, "adaptive_window.enable": True})
    assert (config.num_steps, config.learning_rate, config.adaptive_window.enable) == (3, 2e-4, True)


@pytest.mark.parametrize("text, message", [
    ("num_step: 5\n", "unknown key 'num_step' (did you mean 'num_steps'?)"),
    ("num_steps: many\n", "key 'num_steps' is 'many'; expected an integer"),
    ("num_steps: 0\n", "key 'num_steps' is 0; expected between 1 and 2^53"),
    ("loss_type: ppo\n", "key 'loss_type' is 'ppo'; expected one of grpo, bnpo, dr_grpo, dapo"),
    ("adaptive_window:\n  enabel: true\n", "unknown key 'adaptive_window.enabel'"),
    ("rewards: [answer_check, {name: format_exact, weight: high}]\n", "key 'rewards[1].weight'"),
    ("num_steps: [1\n", "not valid YAML"),
    ("- a\n- b\n", "expected a mapping"),
])
def test_mistakes_name_the_file_and_key(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as err:
        load_config(path)
    assert message in str(err.value) and str(path) in str(err.value)


def test_malformed_yaml_gives_the_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("num_steps: 3\nbeta: [0.1\nseed: 2\n")
    with pytest.raises(UserError, match=r"bad.yaml:\d+: not valid YAML"):
        load_config(path)


def test_cli_reports_a_bad_config_in_one_line(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("learning_rate: -1\n")
    assert main(["train", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"mlx-grpo train: error: {path}: key 'learning_rate' is -1.0; expected at least 0 and below 1"]


def test_cli_flag_overrides_are_type_checked(capsys):
    assert main(["train", "--num-steps", "lots"]) == 2
    assert "command line: key 'num_steps' is 'lots'; expected an integer" in capsys.readouterr().err


def test_exponent_without_a_dot_is_a_number(tmp_path):
    path = tmp_path / "lr.yaml"
    path.write_text("learning_rate: 1e-5\n")
    assert load_config(path, {"beta": "4e-2"}).learning_rate == 1e-5


def test_dtype_auto_is_float32_on_the_cpu_and_for_full_fine_tuning_and_bf16_for_lora_on_a_gpu():
    from mlx_grpo.models.policy import resolve_dtype

    full, lora = load_config(None, {}), load_config(None, {"use_lora": True})
    assert full.dtype == "auto" and resolve_dtype(full) == "float32" and resolve_dtype(lora) == "float32"
    assert resolve_dtype(lora, gpu=True) == "bfloat16" and resolve_dtype(full, gpu=True) == "float32"
    assert resolve_dtype(load_config(None, {"dtype": "float16", "use_lora": True})) == "float16"


def test_a_half_precision_full_fine_tune_is_refused_because_adamw_steps_vanish_in_bf16():
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    import numpy as np

    with pytest.raises(UserError, match="key 'dtype' is 'bfloat16'.*round to zero"):
        load_config(None, {"dtype": "bfloat16", "use_lora": False})
    # why: one AdamW step at the default learning rate moves float32 weights and leaves bf16 ones as they were
    moved = {}
    for dtype in (mx.float32, mx.bfloat16):
        layer = nn.Linear(64, 64)
        layer.set_dtype(dtype)
        before = np.array(layer.weight.astype(mx.float32))
        grads = {"weight": mx.random.normal(layer.weight.shape).astype(dtype), "bias": mx.zeros(64, dtype=dtype)}
        optim.AdamW(learning_rate=3e-5).update(layer, grads)
        moved[dtype] = float((np.array(layer.weight.astype(mx.float32)) != before).mean())
    assert moved[mx.float32] > 0.99 and moved[mx.bfloat16] < 0.5  # measured: 100% and 24%


def test_log_distributions_is_an_alias_of_histogram_every():
    # the seed's flag: a file key and a command-line flag, True meaning every logged step
    assert load_config(None, {"log_distributions": True}).histogram_every == 1
    assert load_config(None, {"log_distributions": 5}).histogram_every == 5
    assert load_config(None, {"log_distributions": False}).histogram_every == 10  # an old run.json's value
    with pytest.raises(UserError, match="histogram_every"):
        load_config(None, {"log_distributions": 0})
    import argparse

    from mlx_grpo.commands.train import add_arguments, collect_overrides

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert collect_overrides(parser.parse_args(["--log-distributions"]))["histogram_every"] == 1
    assert collect_overrides(parser.parse_args(["--log-distributions", "3"]))["histogram_every"] == 3


def test_every_config_key_works_as_a_flag():
    """Each top-level key through its generated --flag gives the same config as the key in a file."""
    import argparse
    import typing

    from mlx_grpo.commands.train import add_arguments, collect_overrides
    from mlx_grpo.config.train_config import top_level_fields

    samples = {bool: ("--{}", True), int: ("7", 7), float: ("0.5", 0.5), str: ("x", "x")}
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    for name, tp in top_level_fields().items():
        flag = "--" + name.replace("_", "-")
        args = typing.get_args(tp)
        base = next((a for a in args if a is not type(None)), tp) if typing.get_origin(tp) is not list else tp
        if typing.get_origin(base) is list:
            argv, expected = [flag, "answer_check" if name == "rewards" else "a", "b" if name != "rewards" else
                              "format_exact"], None
        elif base is bool:
            argv, expected = [flag], True
        else:
            text, expected = samples.get(base, ("x", "x"))
            argv = [flag, text]
        overrides = collect_overrides(parser.parse_args(argv))
        assert name in overrides, name
        if expected is None:
            assert isinstance(overrides[name], list) and len(overrides[name]) == 2, (name, overrides[name])
        else:
            assert overrides[name] == expected, (name, overrides[name])
    config = load_config(None, collect_overrides(_parsed(["--rewards", "answer_check", "--wandb-tags", "a", "b"])))
    assert [r.name for r in config.rewards] == ["answer_check"] and config.wandb_tags == ["a", "b"]


def _parsed(argv):
    import argparse

    from mlx_grpo.commands.train import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_a_trl_config_is_read_with_a_note_per_renamed_key(tmp_path, capsys):
    path = tmp_path / "trl.yaml"
    path.write_text("max_steps: 50\nmax_completion_length: 64\nwarmup_ratio: 0.1\nnum_generations: 4\n"
                    "per_device_train_batch_size: 16\nreward_funcs: [format_exact, answer_check]\n"
                    "reward_weights: [0.5, 2.0]\nreport_to: none\n")
    config = load_config(path)
    assert (config.num_steps, config.max_generation_steps, config.warmup_fraction) == (50, 64, 0.1)
    assert config.batch_size == 4  # 16 completions / 4 per prompt: our batch_size counts prompts
    assert [(r.name, r.weight) for r in config.rewards] == [("format_exact", 0.5), ("answer_check", 2.0)]
    assert config.tensorboard is False and config.wandb is False
    notes = capsys.readouterr().err
    assert len(notes.splitlines()) == 1 and notes.startswith(f"mlx-grpo: note: {path}: read as ours: (TRL) ")
    assert "max_steps as num_steps" in notes
    assert "per_device_train_batch_size as batch_size: 4 (16 completions / 4 per prompt)" in notes
    with pytest.raises(UserError, match="both 'max_steps' .* and 'num_steps' are set"):
        load_config(None, {"max_steps": 3, "num_steps": 4})


def test_every_config_key_has_help_and_is_in_the_readme():
    from pathlib import Path

    from mlx_grpo.config.train_config import key_help, top_level_fields

    helps = key_help()
    assert [k for k in top_level_fields() if not helps.get(k)] == []  # shown by `mlx-grpo train --help`
    # nested keys too, read from the fields' metadata (not scraped from the source)
    assert [k for k, text in helps.items() if not text] == []
    assert {"adaptive_window.enable", "entropy_logging.enable", "sgrpo.enable", "sgrpo.decay"} <= set(helps)
    assert helps["num_generations"] == "completions per prompt (G)"
    config_source = (Path(__file__).resolve().parents[2] / "mlx_grpo" / "config" / "train_config.py").read_text()
    assert "inspect" not in config_source
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert [k for k in top_level_fields() if f"`{k}`" not in readme] == []


def test_bounds_and_choices_are_field_metadata_and_help_prints_the_choices():
    import dataclasses
    import subprocess
    import sys

    from mlx_grpo.config.train_config import CHOICES, LOSS_TYPES, TrainConfig

    fields = {f.name: f.metadata for f in dataclasses.fields(TrainConfig)}
    assert fields["loss_type"]["choices"] == LOSS_TYPES and fields["batch_size"]["check"].expected == "at least 1"
    assert CHOICES["loss_type"] == LOSS_TYPES and fields["adaptive_window"]["check"] is None
    shown = subprocess.run([sys.executable, "-m", "mlx_grpo.cli", "train", "--help"], capture_output=True, text=True,
                           timeout=120).stdout
    assert "{grpo,bnpo,dr_grpo,dapo}" in shown and "{group,batch,none}" in shown


def test_a_zero_learning_rate_trains_and_the_monitoring_says_the_policy_does_not_move(tmp_path):
    # T9: learning_rate 0 was refused ("expected between 0 and 1"), yet it is the standard check that the
    # monitoring reports a run that learns nothing
    from mlx_grpo.run.loop import train

    config = load_config(None, {"learning_rate": 0, "num_steps": 8, "batch_size": 2, "num_generations": 4,
                                "train_size": 16, "eval_every": 0, "checkpoint_every": 0, "tensorboard": False,
                                "monitoring_dir": str(tmp_path / "runs")})
    result = train(config, tmp_path)
    assert result["status"] == "finished"
    alerts = [json.loads(line) for line in (Path(result["run_dir"]) / "alerts.jsonl").read_text().splitlines()]
    assert [(a["step"], a["rule"]) for a in alerts if a["level"] != "info"] == [(8, "kl_flat")]
