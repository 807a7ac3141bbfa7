"""Never lose a run: SIGKILL, SIGTERM and Ctrl-C at random steps, then resume; the result must be the run
that was never stopped: every step logged exactly once, the same records, the same final weights."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml
from tiny_models import make_model_dir

from mlx_grpo.cli import main
from mlx_grpo.telemetry.rundir.writer import read_run_info, write_run_info

OPENBLAS = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0"
NUM_STEPS = 10
# Small enough for ~0.1 s steps; train_size 6 with batch 2 crosses an epoch every 3 steps, eval_every
# and histogram_every make evaluation and histograms part of what must survive a resume.
CONFIG = {"num_steps": NUM_STEPS, "batch_size": 2, "num_generations": 4, "max_generation_steps": 8,
          "learning_rate": 0.01, "train_size": 6, "eval_every": 4, "eval_size": 4, "checkpoint_every": 3,
          "keep_checkpoints": 2, "histogram_every": 2, "samples_per_step": 1, "seed": 3, "wandb": False}
# Wall-clock measurements differ between any two runs; everything else must be identical.
CLOCK_PREFIXES = ("timing/", "system/", "throughput/", "perf/", "memory/")  # measured, not computed


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    model = make_model_dir(root / "model", "llama")
    config = root / "config.yaml"
    config.write_text(yaml.safe_dump({**CONFIG, "model_id": str(model)}))
    return root, config


def env():
    out = {**os.environ, "WANDB_MODE": "disabled"}
    if os.path.exists(OPENBLAS):
        out["LD_PRELOAD"] = OPENBLAS  # what the CLI would re-exec with; set here so the pid stays the same
    return out


def start(args, cwd):
    return subprocess.Popen([sys.executable, "-m", "mlx_grpo.cli", "train", *args], cwd=cwd, env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc, timeout=120):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def new_run(setup, name, **overrides):
    root, config = setup
    flags = [f"--set={k}={v}" for k, v in overrides.items()]
    return start([str(config), "--run-name", name, "--monitoring-dir", str(root / "runs"), *flags], root)


def resume(setup, name, *flags):
    """Continue a run in a new process: `name` under the shared runs folder, or a path."""
    root, _ = setup
    return start(["--resume", str(root / "runs" / name), *flags], root)


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for_step(proc, run_dir, step, timeout=60):
    """Block until metrics.jsonl holds `step` records (or the process ended)."""
    deadline = time.monotonic() + timeout
    path = run_dir / "metrics.jsonl"
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists() and path.read_bytes().count(b"\n") >= step:
            return
        time.sleep(0.01)
    assert proc.poll() is None, f"training ended before step {step}: {proc.communicate()}"


def comparable(record):
    return {k: v for k, v in record.items() if k != "time" and not k.startswith(CLOCK_PREFIXES)}


def final_weights(run_dir):
    import mlx.core as mx

    return mx.load(str(run_dir / "checkpoints" / f"step_{NUM_STEPS}" / "model.safetensors"))


@pytest.fixture(scope="module")
def reference(setup):
    """The run nobody interrupted."""
    code, out, err = finish(new_run(setup, "reference"))
    assert code == 0, err
    return setup[0] / "runs" / "reference"


def assert_same_run(run_dir, reference):
    records = lines(run_dir / "metrics.jsonl")
    # step 0: the held-out evaluation before the first update, once however often the run was restarted
    assert [r["step"] for r in records] == list(range(0, NUM_STEPS + 1))
    expected = lines(reference / "metrics.jsonl")
    for got, want in zip(records, expected):
        assert comparable(got) == comparable(want), f"step {got['step']} differs"
    assert [s["step"] for s in lines(run_dir / "samples.jsonl")] == list(range(1, NUM_STEPS + 1))
    assert [comparable(a) for a in lines(run_dir / "alerts.jsonl") if not a["metric"].startswith(CLOCK_PREFIXES)] \
        == [comparable(a) for a in lines(reference / "alerts.jsonl") if not a["metric"].startswith(CLOCK_PREFIXES)]
    final = json.loads((run_dir / "final_metrics.json").read_text())
    assert final == json.loads((reference / "final_metrics.json").read_text())
    got_w, want_w = final_weights(run_dir), final_weights(reference)
    assert got_w.keys() == want_w.keys()
    for name in want_w:
        np.testing.assert_allclose(np.array(got_w[name]), np.array(want_w[name]), rtol=0, atol=1e-6, err_msg=name)
    info = read_run_info(run_dir)
    assert info.status == "finished" and info.end_time >= info.start_time
    assert info.to_dict() == json.loads((run_dir / "run.json").read_text())  # resumes included
    assert not list((run_dir / "checkpoints").glob(".step_*.tmp"))
    return info


def tensorboard_steps(run_dir, tag="rewards/total/mean"):
    """Steps of a scalar as TensorBoard shows them (events after a resume point are purged)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0}, purge_orphaned_data=True)
    acc.Reload()
    return [e.step for e in acc.Scalars(tag)]


def test_sigkill_at_random_steps_then_resume_is_the_uninterrupted_run(setup, reference):
    rng = random.Random(7)
    # The first kill lands before the first checkpoint (step 3): that resume starts the run over.
    # The last kill stays clear of the final step, whose end-of-run close is not a resumable point.
    kill_steps = [1, rng.randint(3, 5), rng.randint(6, 8)]
    name = "killed"
    run_dir = setup[0] / "runs" / name
    run_ids = set()
    proc = new_run(setup, name)
    for k in kill_steps:
        wait_for_step(proc, run_dir, k)
        time.sleep(rng.uniform(0, 0.15))  # anywhere inside the next step: rollout, logging, a checkpoint
        if proc.poll() is not None:
            break  # a fast machine finished the run before this kill: nothing left to interrupt
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        info = read_run_info(run_dir)
        run_ids.add(info.run_id)
        if info.status == "finished":
            proc = None  # the run finished between the poll and the kill: nothing was interrupted
            break
        proc = resume(setup, name)
    if proc is not None:
        code, out, err = finish(proc)
        assert code == 0, err
    info = assert_same_run(run_dir, reference)
    assert run_ids == {info.run_id}
    assert [r.step for r in info.resumes] == sorted(r.step for r in info.resumes)
    assert 1 <= len(info.resumes) <= len(kill_steps)
    assert tensorboard_steps(run_dir) == list(range(1, NUM_STEPS + 1))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])  # SIGHUP: the terminal closed, ssh dropped
def test_sigterm_checkpoints_the_step_and_says_how_to_resume(setup, reference, sig):
    name = f"terminated-{sig.name}"
    run_dir = setup[0] / "runs" / name
    proc = new_run(setup, name)
    wait_for_step(proc, run_dir, 4)
    proc.send_signal(sig)
    code, out, err = finish(proc)
    assert code == 130
    assert f"mlx-grpo train --resume {run_dir}\n" in err
    assert "warning" not in out + err  # every sink closed cleanly
    last = lines(run_dir / "metrics.jsonl")[-1]["step"]
    assert last < NUM_STEPS
    assert (run_dir / "checkpoints" / f"step_{last}" / "state.json").is_file()  # the step it was in
    assert read_run_info(run_dir).status == "interrupted"

    code, out, err = finish(resume(setup, name))
    assert code == 0, err
    info = assert_same_run(run_dir, reference)
    assert (info.resumes[0].step, info.resumes[0].previous_status) == (last, "interrupted")


def test_second_ctrl_c_stops_at_once_and_keeps_the_last_checkpoint(setup, reference):
    name = "double-ctrl-c"
    run_dir = setup[0] / "runs" / name
    proc = new_run(setup, name)
    wait_for_step(proc, run_dir, 5)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    t = time.monotonic()
    code, out, err = finish(proc, timeout=30)
    assert time.monotonic() - t < 10
    # Where the second Ctrl-C lands decides how far the shutdown got: a clean exit (130) after the
    # first one's cleanup, or an immediate stop by the signal itself (-SIGINT) with run.json still
    # saying "running". Either way the last checkpoint must be intact and resumable.
    assert code in (130, -signal.SIGINT)
    assert "Traceback" not in err
    assert read_run_info(run_dir).status in ("interrupted", "running")

    code, out, err = finish(resume(setup, name))
    assert code == 0, err
    assert_same_run(run_dir, reference)


def test_resume_refuses_a_finished_run_and_extends_it_with_more_steps(setup, reference, tmp_path):
    import shutil

    run_dir = tmp_path / "extended"
    shutil.copytree(reference, run_dir)
    assert main(["train", "--resume", str(run_dir)]) == 2
    code = main(["train", "--resume", str(run_dir), "--num-steps", str(NUM_STEPS + 2)])
    assert code == 0
    records = lines(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(0, NUM_STEPS + 3))
    assert comparable(records[NUM_STEPS]) == comparable(lines(reference / "metrics.jsonl")[-1])
    info = read_run_info(run_dir)
    assert info.total_steps == NUM_STEPS + 2 and info.config["num_steps"] == NUM_STEPS + 2


# ----------------------------------------------------------------------------- in-process: crashes staged on disk


def staged_crash(run_dir, keep_checkpoints_up_to):
    """Make a finished run look like one killed mid-write after step `keep_checkpoints_up_to`'s checkpoint:
    later checkpoints gone, a torn line at the end of each log, run.json still 'running'."""
    import shutil

    for ckpt in (run_dir / "checkpoints").iterdir():
        if int(ckpt.name.split("_")[1]) > keep_checkpoints_up_to:
            shutil.rmtree(ckpt)
    (run_dir / "checkpoints" / f".step_{NUM_STEPS}.tmp").mkdir()  # a checkpoint cut short
    for name in ("metrics.jsonl", "samples.jsonl", "alerts.jsonl"):
        with open(run_dir / name, "a") as fh:
            fh.write('{"step": 99, "policy/lo')
    write_run_info(run_dir, replace(read_run_info(run_dir), status="running", pid=2 ** 22 + 1))


@pytest.mark.parametrize("last_checkpoint", [0, 9, NUM_STEPS])
def test_torn_lines_and_missing_checkpoints_are_repaired_on_resume(setup, reference, tmp_path, last_checkpoint):
    """0: killed before the first checkpoint, the run starts over; 9: it continues from step 9; 10: killed
    after the last checkpoint, while finishing up: the resume only writes the final files.
    Resumed in a new process, like the reference run, so both use the same BLAS and compare exactly."""
    import shutil

    run_dir = tmp_path / "crashed"
    shutil.copytree(reference, run_dir)
    staged_crash(run_dir, last_checkpoint)
    code, out, err = finish(resume(setup, run_dir))
    assert code == 0, err
    info = assert_same_run(run_dir, reference)
    assert (info.resumes[-1].step, info.resumes[-1].previous_status) == (last_checkpoint, "running")
    assert tensorboard_steps(run_dir) == list(range(1, NUM_STEPS + 1))


def test_resume_refuses_a_run_another_process_is_still_writing(reference, tmp_path, capsys):
    import shutil

    run_dir = tmp_path / "busy"
    shutil.copytree(reference, run_dir)
    parent = os.getppid()  # alive, and started before this run's session did
    write_run_info(run_dir, replace(read_run_info(run_dir), status="running", pid=parent, start_time=time.time()))
    assert main(["train", "--resume", str(run_dir)]) == 2
    assert f"still being trained by process {parent}" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path / "nothing-here")]) == 2
    assert "not a run directory (no readable run.json)" in capsys.readouterr().err


def test_a_damaged_checkpoint_is_one_line_naming_it(reference, tmp_path, capsys):
    import shutil

    run_dir = tmp_path / "damaged"
    shutil.copytree(reference, run_dir)
    write_run_info(run_dir, replace(read_run_info(run_dir), status="interrupted"))
    latest = run_dir / "checkpoints" / f"step_{NUM_STEPS}"
    (latest / "model.safetensors").write_bytes(b"\x00" * 64)
    assert main(["train", "--resume", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{latest}: checkpoint is damaged" in err[0] and "move it aside" in err[0]


def test_adaptive_window_state_survives_a_resume(setup, tmp_path):
    """The controller's window, epsilon and success average decide each rollout's budget after a resume."""
    import shutil

    from mlx_grpo.config.train_config import load_config
    from mlx_grpo.run.loop import train

    root, config_path = setup
    values = {**yaml.safe_load(config_path.read_text()), "monitoring_dir": str(tmp_path / "runs"),
              "tensorboard": False, "adaptive_window.enable": True, "adaptive_window.epsilon": 0.5,
              "adaptive_window.epsilon_decay": 0.7}  # exploration and its decay: state a restart would lose
    whole = Path(train(load_config(None, {**values, "run_name": "whole"}), root)["run_dir"])
    run_dir = tmp_path / "runs" / "crashed"
    shutil.copytree(whole, run_dir)
    staged_crash(run_dir, 9)
    main(["train", "--resume", str(run_dir)])

    def window_metrics(path):
        return [{k: v for k, v in r.items() if k.startswith("adaptive_window/")} for r in lines(path)]

    expected = window_metrics(whole / "metrics.jsonl")
    assert expected[1] and window_metrics(run_dir / "metrics.jsonl") == expected  # [0]: the evaluation before step 1
