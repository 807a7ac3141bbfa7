"""Configs as TRL, open-r1, mlx-lm and mlx-lm-lora users write them (tests/data/other_tools/, written from each
tool's documented keys) start a run on the first try: each trains one step on the built-in model, printing at
most one note line and one warning line about other tools' keys, and never an error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mlx_grpo.cli import main
from mlx_grpo.config.train_config import load_config

CORPUS = Path(__file__).parents[1] / "data" / "other_tools"
CONFIGS = sorted(CORPUS.glob("*.yaml"))
TOOLS = {"trl": "TRL", "openr1": "open-r1", "mlx": "mlx-lm"}  # mlx_lm_lora_grpo is mlx-lm-lora's


def test_the_corpus_covers_four_tools():
    names = [p.stem for p in CONFIGS]
    assert len(names) >= 8
    assert {n.split("_")[0] for n in names} >= {"trl", "openr1", "mlx"} and "mlx_lm_lora_grpo" in names


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_each_config_trains_one_step_on_its_first_try(path, tmp_path, monkeypatch, capsys):
    folder = tmp_path / "project"
    shutil.copytree(CORPUS, folder)
    monkeypatch.chdir(folder)
    # the built-in model and a tiny step in place of the file's hub model and its length
    code = main(["train", path.name, "--model-id", "default", "--num-steps", "1", "--batch-size", "2",
                 "--num-generations", "2", "--max-generation-steps", "8", "--eval-every", "0",
                 "--monitoring-dir", str(tmp_path / "runs"), "--run-name", path.stem, "--no-tensorboard"])
    err = capsys.readouterr().err
    assert code == 0, err
    lines = err.splitlines()
    assert "mlx-grpo train: error" not in err
    assert len([line for line in lines if line.startswith("mlx-grpo: warning:")]) <= 1, err
    assert len([line for line in lines if line.startswith(f"mlx-grpo: note: {path.name}:")]) <= 1, err
    records = [json.loads(line) for line in (tmp_path / "runs" / path.stem / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "step" in r and r.get("kind", "step") == "step"][-1] == 1


def test_open_r1_recipe_is_read_as_trl_means_it(monkeypatch, capsys):
    monkeypatch.chdir(CORPUS)
    config = load_config("openr1_distill_recipe.yaml")
    err = capsys.readouterr().err
    assert config.epochs == 1.0  # max_steps: -1 leaves the length to num_train_epochs, as in TRL
    assert config.dtype == "auto"  # bf16: true is mixed precision over float32 weights, not bf16 weights
    assert config.batch_size == 4  # 16 completions x 4 accumulation steps / 16 per prompt
    assert config.prompt_field == "problem" and config.lr_schedule == "cosine"
    assert [r.name for r in config.rewards] == ["answer_check", "format_exact"]
    warning = [line for line in err.splitlines() if "warning" in line]
    assert len(warning) == 1
    for key in ("model_revision", "hub_model_id", "log_level", "logging_first_step", "vllm_device",
                "lr_scheduler_kwargs", "chat_template"):
        assert key in warning[0]
    assert "did you mean" not in err


def test_mlx_lm_example_is_read_key_by_key(monkeypatch, capsys):
    monkeypatch.chdir(CORPUS)
    config = load_config("mlx_lm_lora_config.yaml")
    assert (config.lora_rank, config.lora_alpha, config.lora_dropout) == (8, 160.0, 0.0)  # alpha = scale x rank
    assert config.lora_keys == ["self_attn.q_proj", "self_attn.v_proj"] and config.use_lora
    assert (config.lr_schedule, config.warmup_fraction, config.learning_rate) == ("cosine", 0.1, 1e-5)
    assert config.weight_decay == 0.05 and config.num_steps == 1000
    err = capsys.readouterr().err
    assert "train, test, test_batches" not in err  # one warning line names them, in the file's order
    assert len([line for line in err.splitlines() if "warning" in line]) == 1


def test_epochs_become_steps_over_the_training_rows(tmp_path, capsys):
    from mlx_grpo.data import epoch_steps

    config = load_config(CORPUS / "openr1_config_demo.yaml", {"model_id": "default"})
    assert config.epochs == 1.0 and config.batch_size == 4  # 16 x 4 / 16
    steps = epoch_steps(config, CORPUS)
    rows = 48 - max(1, 48 // 20)  # 5% held out
    assert (steps.num_steps, steps.epochs) == (-(-rows // 4), None)
    assert f"epochs: 1 is {steps.num_steps} steps ({rows} training rows, 4 prompts per step)" in capsys.readouterr().err
