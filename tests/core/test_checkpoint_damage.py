"""A checkpoint verifies itself (issue 38, S7/S8/S18 of the third reliability review): every file against
the checksum written last, state.json against its schema, weights finite, FIFOs and files in place of
directories refused. Each damage is one line naming the checkpoint and how to move it aside; nothing of
the run is changed; after the move, the resume continues from the checkpoint before."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import yaml
from tiny_models import make_model_dir

from mlx_grpo import checkpoint
from mlx_grpo.cli import main
from mlx_grpo.telemetry.rundir.writer import read_run_info, write_run_info

CONFIG = {"num_steps": 4, "batch_size": 2, "num_generations": 2, "max_generation_steps": 4, "train_size": 6,
          "eval_every": 0, "checkpoint_every": 2, "keep_checkpoints": 2, "samples_per_step": 1, "seed": 3,
          "wandb": False, "tensorboard": False}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    model = make_model_dir(root / "model", "llama")
    config = root / "config.yaml"
    config.write_text(yaml.safe_dump({**CONFIG, "model_id": str(model)}))
    assert main(["train", str(config), "--run-name", "ref", "--monitoring-dir", str(root / "runs")]) == 0
    return root / "runs" / "ref"


def interrupted_copy(finished, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    write_run_info(run_dir, replace(read_run_info(run_dir), status="interrupted"))
    return run_dir, run_dir / "checkpoints" / "step_4"


def edit_state(latest, keep_checksums=False, **changes):
    state = json.loads((latest / "state.json").read_text())
    for key, value in changes.items():
        state[key] = value
    (latest / "state.json").write_text(json.dumps(state))
    if keep_checksums:  # as if the checkpoint had been written so: its checksums agree
        (latest / "checksums.json").write_text(json.dumps(checkpoint.file_checksums(latest)))


def flip(path, count=200):
    data = bytearray(path.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")  # after the safetensors header: the arrays' bytes
    for i in range(start, min(len(data), start + count)):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def nan_weights(latest):
    path = latest / "model.safetensors"
    data = bytearray(path.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")
    data[start:start + 4000] = np.full(1000, np.nan, dtype=np.float32).tobytes()
    path.write_bytes(bytes(data))
    (latest / "checksums.json").write_text(json.dumps(checkpoint.file_checksums(latest)))  # saved so, checksums agree


def unverifiable(latest):
    """Review 4's CK6: the weights' bytes changed, checksums.json removed and state.json's marker with it."""
    flip(latest / "model.safetensors")
    (latest / "checksums.json").unlink()
    state = json.loads((latest / "state.json").read_text())
    state.pop("checksums")
    (latest / "state.json").write_text(json.dumps(state))


DAMAGE = {
    "state_random_bytes": (lambda d: (d / "state.json").write_bytes(os.urandom(300)), "state.json"),
    "state_brace": (lambda d: (d / "state.json").write_text("{"), "state.json has 1 bytes"),
    "state_step_99": (lambda d: edit_state(d, step=99), "state.json has "),
    "state_step_5": (lambda d: edit_state(d, step=5), "state.json does not match its checksum"),
    "state_step_99_checksums_agree": (lambda d: edit_state(d, step=99, keep_checksums=True),
                                 "state.json says step 99 in the directory of step 4"),
    "state_step_text": (lambda d: edit_state(d, step="x", keep_checksums=True), "says step x"),
    "state_run_state": (lambda d: edit_state(d, run_state={"x": [1, 2]}, keep_checksums=True),
                        "'run_state' has no valid 'rewards'"),
    "state_log_positions": (lambda d: edit_state(d, log_positions={"metrics.jsonl": -5}, keep_checksums=True),
                            "'log_positions' is not an object of byte counts"),
    "state_log_beyond": (lambda d: edit_state(d, log_positions={"metrics.jsonl": 10**9}, keep_checksums=True),
                         "beyond its"),
    "weights_flipped": (lambda d: flip(d / "model.safetensors"), "model.safetensors does not match its checksum"),
    "optimizer_flipped": (lambda d: flip(d / "optimizer.safetensors"),
                          "optimizer.safetensors does not match its checksum"),
    "weights_nan": (nan_weights, "holds NaN or Inf"),
    "checksums_gone": (lambda d: (d / "checksums.json").unlink(), "checksums.json: No such file"),
    # review 4, U9: nothing inside the checkpoint turns verification off
    "checksums_and_marker_gone_weights_flipped": (unverifiable, "checksums.json: No such file"),
    "checksums_random_bytes": (lambda d: (d / "checksums.json").write_bytes(os.urandom(300)),
                               "checksums.json is not a JSON object"),
    "step_dir_a_file": (lambda d: (shutil.rmtree(d), d.write_text("x")), "not a directory"),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_damaged_checkpoint_is_one_line_naming_it_and_the_run_is_untouched(finished, tmp_path, capsys, case):
    run_dir, latest = interrupted_copy(finished, tmp_path)
    damage, expected = DAMAGE[case]
    damage(latest)
    metrics_before = (run_dir / "metrics.jsonl").read_bytes()
    capsys.readouterr()
    code = main(["train", "--resume", str(run_dir), "--num-steps", "6"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert f"{latest}: checkpoint is damaged" in err[0] and expected in err[0], err[0]
    assert (run_dir / "metrics.jsonl").read_bytes() == metrics_before  # nothing cut, nothing lost
    assert read_run_info(run_dir).status == "interrupted"
    if case == "weights_flipped":  # doing what the line says resumes from the checkpoint before
        move = err[0].rpartition("move it aside to resume from the one before: ")[2]
        subprocess.run(shlex.split(move), check=True)
        assert main(["train", "--resume", str(run_dir), "--num-steps", "6"]) == 0
        steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert steps == list(range(1, 7))


def test_a_fifo_in_place_of_the_weights_is_one_line_not_a_hang(finished, tmp_path):
    run_dir, latest = interrupted_copy(finished, tmp_path)
    (latest / "model.safetensors").unlink()
    os.mkfifo(latest / "model.safetensors")
    result = subprocess.run([sys.executable, "-m", "mlx_grpo.cli", "train", "--resume", str(run_dir),
                             "--num-steps", "6"], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "WANDB_MODE": "disabled"})
    assert result.returncode == 2 and "checkpoint is damaged (model.safetensors is not a regular file)" in result.stderr


def test_a_checkpoint_lists_the_checksum_of_every_file(finished):
    latest = finished / "checkpoints" / "step_4"
    listed = json.loads((latest / "checksums.json").read_text())["files"]
    assert sorted(listed) == sorted(p.name for p in latest.iterdir() if p.name != "checksums.json")
    assert listed == checkpoint.file_checksums(latest)["files"]
