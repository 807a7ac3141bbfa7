"""`mlx-grpo export` and `mlx-grpo eval` on real runs of the shipped model, checked with mlx-lm itself."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm import generate, load

from mlx_grpo.cli import main
from mlx_grpo.config.train_config import load_config
from mlx_grpo.run.export import load_trained
from mlx_grpo.run.loop import train

SMALL = {"num_steps": 3, "batch_size": 4, "num_generations": 4, "train_size": 12, "eval_every": 3, "eval_size": 40,
         "checkpoint_every": 2, "tensorboard": False, "samples_per_step": 1, "learning_rate": 1e-3}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A full fine-tune and a LoRA run of the shipped model, 3 steps each, evaluated at the last step."""
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for name, extra in (("full", {}), ("lora", {"use_lora": True, "lora_rank": 4})):
        config = load_config(None, {**SMALL, **extra, "monitoring_dir": str(root), "run_name": name})
        out[name] = Path(train(config, root)["run_dir"])
    return out


def final_eval_accuracy(run_dir: Path) -> float:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return next(r["eval/accuracy"] for r in reversed(records) if "eval/accuracy" in r)


def cli_json(capsys, *argv: str) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def last_logits(model, tokenizer, text: str = "12+7=") -> np.ndarray:
    logits = model(mx.array([tokenizer.encode(text)]))[0, -1]
    return np.array(logits.astype(mx.float32))


def test_eval_of_a_run_agrees_with_its_own_held_out_accuracy(runs, capsys):
    for run_dir in runs.values():
        result = cli_json(capsys, "eval", str(run_dir), "--json")
        assert result["eval/accuracy"] == final_eval_accuracy(run_dir)
        assert result["rows"] == 40 and result["correct"] == round(40 * result["eval/accuracy"])
        assert set(result["rewards"]) == {"format_exact", "format_approx", "answer_check", "number_check", "digit_match",
                                         "total"}
        assert result["target"].endswith("(step_3)")


def test_eval_reads_a_jsonl_dataset_with_the_runs_fields(runs, tmp_path, capsys):
    from mlx_grpo.data import load_datasets

    trained = load_trained(runs["full"])
    heldout = load_datasets(trained.config, trained.base_dir)[1][:12]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"prompt": r["prompt"], "answer": r["answer"]}) + "\n" for r in heldout))
    from_file = cli_json(capsys, "eval", str(runs["full"]), "--dataset", str(path), "--json")
    own_split = cli_json(capsys, "eval", str(runs["full"]), "--limit", "12", "--json")
    assert from_file["rows"] == 12 and from_file["dataset"] == str(path)
    assert from_file["eval/accuracy"] == own_split["eval/accuracy"] and from_file["rewards"] == own_split["rewards"]


def test_full_fine_tune_export_loads_and_generates_with_mlx_lm_and_evaluates_the_same(runs, tmp_path, capsys):
    out = tmp_path / "full"
    assert main(["export", str(runs["full"]), "--out", str(out)]) == 0
    assert "exported step 3" in capsys.readouterr().out
    assert {"config.json", "tokenizer.json", "model.safetensors", "export.json"} <= {p.name for p in out.iterdir()}
    model, tokenizer = load(str(out))
    text = generate(model, tokenizer, prompt="12+7=", max_tokens=12)
    assert isinstance(text, str) and text
    trained = load_trained(runs["full"])
    np.testing.assert_allclose(last_logits(model, tokenizer), last_logits(trained.model, trained.tokenizer),
                               rtol=1e-5, atol=1e-5)
    # The exported directory is a MODEL for `mlx-grpo eval`: same weights, same held-out rows, same accuracy.
    assert cli_json(capsys, "eval", str(out), "--json")["eval/accuracy"] == final_eval_accuracy(runs["full"])


def test_lora_export_fused_or_with_adapters_gives_the_trained_policy(runs, tmp_path, capsys):
    fused, unfused = tmp_path / "fused", tmp_path / "unfused"
    assert main(["export", str(runs["lora"]), "--out", str(fused), "--fuse"]) == 0
    assert main(["export", str(runs["lora"]), "--out", str(unfused), "--step", "2"]) == 0
    assert "--adapter-path" in capsys.readouterr().out
    assert not (fused / "adapters.safetensors").exists() and (unfused / "adapters.safetensors").is_file()
    assert json.loads((unfused / "export.json").read_text())["step"] == 2

    fused_model, tokenizer = load(str(fused))
    assert not any("lora" in name for name, _ in fused_model.named_modules())
    trained = load_trained(runs["lora"])
    np.testing.assert_allclose(last_logits(fused_model, tokenizer), last_logits(trained.model, trained.tokenizer),
                               rtol=1e-4, atol=1e-4)
    with_adapters, tokenizer = load(str(unfused), adapter_path=str(unfused))
    at_step_2 = load_trained(runs["lora"], step=2)
    np.testing.assert_allclose(last_logits(with_adapters, tokenizer), last_logits(at_step_2.model, tokenizer),
                               rtol=1e-5, atol=1e-5)
    # mlx-lm's own command line loads the fused directory as it is.
    result = subprocess.run([sys.executable, "-m", "mlx_lm", "generate", "--model", str(fused), "--prompt", "3+4=",
                             "--max-tokens", "8"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "Generation:" in result.stdout


@pytest.mark.parametrize("argv,expected", [
    (["export", "{run}", "--out", "{run}"], "exists and is not an empty directory"),
    (["export", "{run}", "--out", "{tmp}/x", "--step", "7"], "no checkpoint of step 7; there are checkpoints of steps 2, 3"),
    (["export", "{tmp}", "--out", "{tmp}/x"], "not a run directory (no run.json)"),
    (["eval", "{run}", "--dataset", "{tmp}/missing.jsonl"], "--dataset {tmp}/missing.jsonl: file not found"),
    (["eval", "{run}", "--config", "c.yaml"], "a run directory keeps its own config"),
    (["eval", "{tmp}/nowhere", "--step", "2"], "--step 2: only for a run directory"),
    (["eval", "{run}", "--limit", "0"], "--limit 0: must be at least 1"),
])
def test_mistakes_end_in_one_line(runs, tmp_path, capsys, argv, expected):
    fill = {"run": str(runs["full"]), "tmp": str(tmp_path)}
    code = main([a.format(**fill) for a in argv])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and expected.format(**fill) in err, err


def test_eval_of_a_model_names_the_configs_eval_dataset_and_reads_the_last_number(tmp_path, capsys):
    from mlx_grpo.tasks import arithmetic

    rows = arithmetic.make_split("heldout", 12, seed=0)
    for name in ("train.jsonl", "heldout.jsonl"):
        (tmp_path / name).write_text("".join(json.dumps({"prompt": r["prompt"], "answer": r["answer"]}) + "\n"
                                             for r in rows))
    config = tmp_path / "run.yaml"
    config.write_text("dataset: train.jsonl\neval_dataset: heldout.jsonl\n")
    tags = cli_json(capsys, "eval", "default", "--config", str(config), "--json")
    config.write_text("dataset: train.jsonl\neval_dataset: heldout.jsonl\ncorrectness: last_number\n"
                      "rewards: [last_number_check]\n")
    last = cli_json(capsys, "eval", "default", "--config", str(config), "--json")
    assert tags["dataset"] == last["dataset"] and last["dataset"].endswith("heldout.jsonl") and last["rows"] == 12
    # The shipped model ends every reply with its answer block, so its last number is the answer it wrote.
    assert last["correct"] == tags["correct"] > 0
    assert last["rewards"]["last_number_check"] == 2.0 * last["correct"] / 12


def test_export_suggests_a_prompt_in_the_form_the_run_trained_on(tmp_path):
    import json as _json

    from mlx_grpo.commands.export import example_prompt
    from mlx_grpo.tasks.arithmetic import make_split
    from mlx_grpo.telemetry.rundir.writer import RunInfo, write_run_info

    write_run_info(tmp_path, RunInfo(run_id="r", name="r", status="finished", config={"dataset": "arithmetic"}))
    prompt = example_prompt(tmp_path)
    assert prompt == "012+007=" and all(row["prompt"][-1] == "=" and len(row["prompt"]) == len(prompt)
                                        for row in make_split("train", 5, 0))  # was '12+7=', answered wrongly
    write_run_info(tmp_path, RunInfo(run_id="r", name="r", status="finished", config={"dataset": "/d/qa.jsonl"}))
    (tmp_path / "samples.jsonl").write_text(_json.dumps({"prompt": "What is 2+2?"}) + "\n")
    assert example_prompt(tmp_path) == "What is 2+2?"
