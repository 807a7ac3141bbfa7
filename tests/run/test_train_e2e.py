"""The trainer end to end on model directories the project did not ship (random weights)."""

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.utils import save_config, save_model
from tiny_models import make_model_dir

from mlx_grpo.cli import main
from mlx_grpo.config.train_config import load_config
from mlx_grpo.run.loop import train
from mlx_grpo.telemetry.rundir.writer import read_run_info

DATA = Path(__file__).parents[1] / "data"
# train_size: not the default 20,000 rows, whose drawing and tokenizing took ~1 s of each short run
FAST = {"num_steps": 3, "batch_size": 2, "num_generations": 4, "max_generation_steps": 8, "eval_every": 3,
        "eval_size": 8, "checkpoint_every": 0, "tensorboard": False, "samples_per_step": 2, "train_size": 64}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {kind: make_model_dir(root / kind, kind) for kind in ("llama", "qwen2")}


def run(tmp_path, **overrides):
    config = load_config(None, {**FAST, "monitoring_dir": str(tmp_path / "runs"), **overrides})
    return train(config, tmp_path)


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("lora", [False, True])
def test_trains_any_hf_directory(tmp_path, models, kind, lora):
    result = run(tmp_path, model_id=str(models[kind]), use_lora=lora, beta=0.04)
    assert result["status"] == "finished"
    run_dir = Path(result["run_dir"])
    records = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert all(r["policy/grad_norm"] > 0 for r in records[1:])
    assert "eval/accuracy" in records[-1] and "policy/kl" in records[-1]
    # held-out accuracy before the first update (step 0), so the curve starts where the model started
    assert ["eval/accuracy" in r for r in records] == [True, False, False, True]
    assert not any(k.startswith("policy/") for k in records[0])
    info = read_run_info(run_dir)
    assert info.status == "finished" and info.config["model_id"] == str(models[kind])
    checkpoint = run_dir / "checkpoints" / "step_3"
    assert (checkpoint / ("adapters.safetensors" if lora else "model.safetensors")).is_file()


def test_lora_changes_only_adapters_and_reference_is_the_base(tmp_path, models):
    from mlx_grpo.trainer import Trainer

    config = load_config(None, {**FAST, "model_id": str(models["llama"]), "use_lora": True, "beta": 0.1})
    trainer = Trainer.build(config, tmp_path)
    model = trainer.policy.model
    frozen_before = {k: mx.array(v) for k, v in nn.utils.tree_flatten(model.parameters()) if "lora" not in k}
    for step in (1, 2):
        trainer.step(step)
    for k, v in nn.utils.tree_flatten(model.parameters()):
        if "lora" not in k:
            assert mx.array_equal(frozen_before[k], v), k
    assert trainer.reference.model is model  # no second copy under LoRA
    assert trainer.step(3).update.stats["kl"] > 0  # adapters moved the policy away from the base


def test_beta_zero_builds_no_reference(tmp_path, models):
    from mlx_grpo.telemetry.metrics.step_data import step_record
    from mlx_grpo.trainer import Trainer

    config = load_config(None, {**FAST, "model_id": str(models["llama"]), "beta": 0.0})
    trainer = Trainer.build(config, tmp_path)
    assert trainer.reference is None
    assert "policy/kl" not in step_record(trainer.step(1))


def test_dora_and_quantized_base_with_lora(tmp_path, models):
    result = run(tmp_path, model_id=str(models["llama"]), use_lora=True, use_dora=True)
    assert result["status"] == "finished"
    from mlx_lm import load

    model, _ = load(str(models["qwen2"]))
    nn.quantize(model, group_size=32, bits=4)
    quantized = tmp_path / "qwen2-4bit"
    save_model(quantized, model)
    config = json.loads((models["qwen2"] / "config.json").read_text())
    config["quantization"] = {"group_size": 32, "bits": 4}
    save_config(config, quantized / "config.json")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (quantized / name).write_text((models["qwen2"] / name).read_text())
    result = run(tmp_path, model_id=str(quantized), use_lora=True, dtype="float32")
    assert result["status"] == "finished"
    # full fine-tuning of a base kept 4-bit is refused (quantized_base: auto on this CPU backend would
    # dequantize it, and then every weight trains: tests/models/test_gguf.py)
    assert main(["train", "--model-id", str(quantized), "--num-steps", "1", "--set", "quantized_base=keep"]) == 2


def test_gsm8k_jsonl_dataset(tmp_path, models):
    result = run(tmp_path, model_id=str(models["llama"]), dataset=str(DATA / "gsm8k_sample.jsonl"),
                 system_prompt="Answer in tags.", eval_size=2)
    samples = read_jsonl(Path(result["run_dir"]) / "samples.jsonl")
    assert samples and {s["answer"] for s in samples} <= {"27", "42", "180", "2000", "72"}


def test_user_mistakes_end_in_one_line(tmp_path, models, capsys):
    assert main(["train", "--model-id", str(tmp_path / "nope"), "--num-steps", "1"]) == 2
    assert capsys.readouterr().err.strip().endswith("directory not found")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer": \n')
    assert main(["train", "--model-id", str(models["llama"]), "--dataset", str(broken)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{broken}:2: malformed JSON" in err[0]


def test_runs_go_where_the_user_stands_and_config_paths_stay_next_to_the_config(tmp_path, monkeypatch):
    from mlx_grpo.cli import main

    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "tiny.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n' * 8)
    (tmp_path / "cfg" / "my.yaml").write_text("num_steps: 1\nbatch_size: 2\nnum_generations: 2\n"
                                              "max_generation_steps: 4\neval_every: 0\ndataset: tiny.jsonl\n"
                                              "eval_dataset: tiny.jsonl\nrun_name: r\n")
    monkeypatch.chdir(tmp_path)
    assert main(["train", "cfg/my.yaml"]) == 0
    assert (tmp_path / "runs" / "r" / "run.json").is_file()  # not cfg/runs: where watch and tensorboard look
    assert not (tmp_path / "cfg" / "runs").exists()


def test_a_conversational_dataset_trains(tmp_path):
    from mlx_grpo.cli import main

    data = tmp_path / "chat.jsonl"
    data.write_text("".join(f'{{"prompt": [{{"role": "user", "content": "{a}+{b}="}}], "answer": {a + b}}}\n'
                            for a in range(4) for b in range(2)))
    assert main(["train", "--dataset", str(data), "--eval-dataset", str(data), "--num-steps", "1",
                 "--batch-size", "2", "--num-generations", "2", "--max-generation-steps", "4",
                 "--monitoring-dir", str(tmp_path / "runs"), "--run-name", "chat"]) == 0
    sample = json.loads((tmp_path / "runs" / "chat" / "samples.jsonl").read_text().splitlines()[0])
    assert sample["prompt"].startswith("user: ")
