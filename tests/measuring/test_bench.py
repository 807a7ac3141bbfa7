"""`mlx-grpo bench` and `mlx-grpo doctor`, run as a user runs them (a subprocess, so the
OpenBLAS re-exec happens as it would from the shell)."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from tiny_models import make_model_dir

from mlx_grpo.planning import blas, chips

SCHEMA = json.loads((Path(__file__).parents[2] / "docs" / "bench_schema.json").read_text())


def mlx_grpo(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "mlx_grpo.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    model = make_model_dir(tmp_path_factory.mktemp("bench_model"), "llama")
    result = mlx_grpo("bench", "--model", str(model), "--batch-size", "4", "--group-size", "4",
                      "--completion-length", "8", "--repetitions", "1", "--warmup", "0", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_bench_json_validates_and_every_figure_is_positive(report):
    jsonschema.validate(report, SCHEMA)
    assert set(report["paths"]) == {"rollout", "rollout_ceiling", "rollout_sequential", "reward", "reference",
                                    "update", "update_ceiling", "step"}
    for name, path in report["paths"].items():
        assert path["tokens_per_s"]["median"] > 0, name
    assert report["paths"]["rollout"]["tokens"] == 4 * 4 * 8  # every completion runs to the full length
    assert {g["name"] for g in report["goals"]} == {"rollout_vs_ceiling", "rollout_vs_sequential",
                                                    "update_vs_ceiling", "step_overhead", "memory_beta_ratio"}
    assert report["memory"]["lora_beta_peak_bytes"] > 0 and report["memory"]["ratio"] > 0
    # the trainer's own phase timers were read back from the step and cover no more than its wall time
    assert {"rollout", "update", "ref"} <= set(report["paths"]["step"]["phases"])
    assert report["ratios"]["step_vs_own_phases"]["min"] >= 0.99
    # each phase's peak memory, read back from the step: the weights plus what the phase builds
    peaks = report["paths"]["step"]["peak_memory_bytes"]
    assert set(peaks) == {"rollout", "ref", "update"} and min(peaks.values()) > 0
    assert report["machine"]["blas"] in ("OpenBLAS", "reference BLAS", "Accelerate", "other")
    # the roofline: every timed phase's work from the model's shape; its goals wait for full-speed passes
    roof = report["roofline"]
    assert {"rollout", "reference", "update", "step"} <= set(roof["paths"])
    assert roof["paths"]["step"]["flops"] > roof["paths"]["update"]["flops"] > roof["paths"]["reference"]["flops"] > 0
    assert roof["paths"]["rollout"]["bytes"] > 0 and roof["peak_flops_per_s"] > 0
    assert roof["update_pass_flops"] < 5e10 and not any(g["name"].endswith(("of_peak", "of_roofline"))
                                                         for g in report["goals"])


def test_bench_under_lora_says_what_the_heads_sweep_over_the_vocabulary_takes(tmp_path):
    model = make_model_dir(tmp_path / "model", "llama")
    out = tmp_path / "bench.json"
    result = mlx_grpo("bench", "--model", str(model), "--lora", "--batch-size", "2", "--group-size", "2",
                      "--completion-length", "8", "--repetitions", "1", "--warmup", "0", "--no-memory",
                      "--only", "reference,update", "--output", str(out))
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    jsonschema.validate(report, SCHEMA)
    vocabulary = report["roofline"]["vocabulary"]
    assert vocabulary["seconds_per_logit"] > 0 and vocabulary["matmul_seconds_per_logit"] > 0
    assert set(vocabulary["paths"]) == {"reference", "update"}
    # 2 x 2 completions of 8 tokens over the vocabulary; the update's num_iterations passes each sweep it again
    sweep = 2 * 2 * 8 * json.loads((model / "config.json").read_text())["vocab_size"]
    assert vocabulary["paths"]["reference"]["logits"] == sweep
    assert vocabulary["paths"]["update"]["logits"] == sweep * report["settings"]["num_iterations"]
    assert "sweep over the vocabulary" in result.stdout and "of the matmul peak" in result.stdout


def test_schema_rejects_a_report_missing_figures(report):
    broken = copy.deepcopy(report)
    del broken["paths"]["rollout"]["tokens_per_s"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, SCHEMA)
    broken = copy.deepcopy(report)
    broken["paths"]["rollout"]["seconds"]["median"] = 0
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, SCHEMA)


def test_bench_refuses_an_unknown_path_in_one_line():
    result = mlx_grpo("bench", "--only", "rollout,warp_drive", "--json")
    assert result.returncode == 2
    assert "warp_drive" in result.stderr and "Traceback" not in result.stderr


def test_doctor_names_the_blas_in_use():
    result = mlx_grpo("doctor")
    assert "Traceback" not in result.stderr
    if sys.platform.startswith("linux") and blas.find_openblas():
        assert "OpenBLAS, fp32 matmul" in result.stdout  # the command preloaded it
    else:
        assert any(f"{name}, fp32 matmul" in result.stdout for name in ("reference BLAS", "Accelerate"))


@pytest.mark.skipif(not (sys.platform.startswith("linux") and blas.find_openblas()), reason="needs a system OpenBLAS")
def test_doctor_says_openblas_is_switched_off_and_how_to_fix_it():
    result = mlx_grpo("doctor", env={blas.SWITCH: "0"})
    assert "reference BLAS" in result.stdout
    assert "OpenBLAS is available" in result.stdout
    assert f"unset {blas.SWITCH}" in result.stdout
    assert result.returncode == 1


def test_chip_table_tells_bins_apart_and_ceiling_formula():
    assert chips.lookup("Apple M3 Max", 14).bandwidth_gb_s == 300.0
    assert chips.lookup("Apple M3 Max", 16).bandwidth_gb_s == 400.0
    assert chips.lookup("Apple M2 Pro", 12).bandwidth_gb_s == 200.0
    assert chips.lookup("Intel(R) Xeon(R) Processor", 2) is None
    # 100 GB/s, 1 GB of weights, 4 sequences with 0.25 GB of KV each: 4 * 100 / 2 = 200 tokens/s
    assert chips.decode_ceiling_tokens_per_s(100.0, 4, 10**9, 0.25e9) == pytest.approx(200.0)


def test_bandwidth_ceiling_counts_weights_and_kv_cache(tmp_path):
    from mlx_lm import load

    from mlx_grpo.measuring.benchmark import bandwidth_report, weight_bytes

    model, _ = load(str(make_model_dir(tmp_path, "llama")))
    chip = chips.Chip("Apple M2", 100.0, "test")
    report = bandwidth_report(1000.0, model, sequences=8, prompt_length=9, completion_length=24, chip=chip)
    # keys + values, 2 layers x 2 KV heads x head dim 16 in fp32: 512 bytes per token; mean context 9 + 24/2
    expected_bytes = weight_bytes(model) + 8 * 512 * 21
    assert report["bytes_per_step"] == expected_bytes
    assert report["ceiling_tokens_per_s"] == pytest.approx(8 * 100e9 / expected_bytes)
    assert report["percent_of_ceiling"] == pytest.approx(100 * 1000.0 / report["ceiling_tokens_per_s"])
    assert bandwidth_report(1000.0, model, 8, 9, 24, chip=None) is None  # not Apple Silicon


def test_bench_preset_flags_refuse_bad_input_in_one_line(capsys):
    # in-process: test_bench_refuses_an_unknown_path_in_one_line runs the command's refusal as a subprocess
    from mlx_grpo.cli import main

    for flags, words in ((["--layers", "2"], "--layers needs --preset"),
                         (["--preset", "qwen9-1t"], "preset 'qwen9-1t': unknown"),
                         (["--preset", "qwen2.5-0.5b", "--layers", "99"], "expected 1..24")):
        rc = main(["bench", *flags, "--json"])
        err = capsys.readouterr().err
        assert rc == 2 and words in err and len(err.splitlines()) == 1, (flags, err)


def test_bench_report_piped_keeps_each_line_whole(report, capsys):
    from mlx_grpo.commands.bench import print_report

    print_report(report)  # capsys is not a terminal, like `mlx-grpo bench | tee bench.txt`
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("machine: ") and line.endswith(f"load average {report['machine']['load_average']:.1f}")
               for line in lines)


def test_bench_wires_memory_as_training_does_and_names_where_the_matmul_ran(report, monkeypatch, tmp_path):
    """`bench` built the trainer without the wired limit `train` sets, and labelled the Metal GPU's matmul
    speed as the BLAS's (Accelerate serves only MLX's CPU operations)."""
    from mlx_grpo.commands.bench import matmul_line
    from mlx_grpo.config.train_config import load_config
    from mlx_grpo.measuring import workload

    assert "wired_limit_bytes" in report["settings"]  # null on the CPU backend
    wired = []
    monkeypatch.setattr(workload, "wire_memory", lambda resident: wired.append(resident))
    workload.Workload(load_config(None, {"batch_size": 2, "num_generations": 2, "max_generation_steps": 2}),
                       Path.cwd(), 4)
    assert len(wired) == 1 and wired[0] > 0
    gpu = matmul_line({**report["machine"], "device": "gpu", "blas": "Accelerate", "matmul_fp32_gflops": 9000.0})
    assert "Metal GPU (fp32 matmul 9000 GFLOP/s)" in gpu and "BLAS Accelerate for CPU operations" in gpu
    assert "CPU" in matmul_line(report["machine"])
