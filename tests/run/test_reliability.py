"""A run survives what goes wrong around it: Ctrl-C, a NaN, a failing TensorBoard or W&B, a full disk,
and never writes a secret down. In-process, on a tiny model, a few steps each."""

import errno
import json
import math
import os
import shutil
import signal
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
import pytest
from mlx.utils import tree_flatten
from tiny_models import make_model_dir

import mlx_grpo.trainer as trainer_module
from mlx_grpo.checkpoint import file_checksums
from mlx_grpo.cli import main
from mlx_grpo.common.errors import UserError
from mlx_grpo.config.train_config import load_config
from mlx_grpo.rollout import Rollout
from mlx_grpo.telemetry import sinks as sinks_module
from mlx_grpo.telemetry.events import Sink
from mlx_grpo.telemetry.rundir.writer import read_run_info, write_run_info
from mlx_grpo.trainer import Trainer
from mlx_grpo.update import build_train_batch, update_policy

# train_size: not the default 20,000 rows, whose drawing and tokenizing took ~1 s of each short run
FAST = {"num_steps": 5, "batch_size": 2, "num_generations": 4, "num_iterations": 1, "max_generation_steps": 8,
        "eval_every": 0, "checkpoint_every": 2, "samples_per_step": 1, "wandb": False, "learning_rate": 0.01,
        "train_size": 64}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("model") / "llama", "llama")


def flags(tmp_path, model, **overrides):
    values = {**FAST, "model_id": str(model), "monitoring_dir": str(tmp_path / "runs"), "run_name": "r",
              **overrides}
    return ["train", *(f"--set={k}={json.dumps(v)}" for k, v in values.items())]


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def weights(checkpoint: Path) -> dict[str, np.ndarray]:
    return {k: np.array(v) for k, v in mx.load(str(checkpoint / "model.safetensors")).items()}


def at_step(monkeypatch, action):
    """Call action(step) at the start of every training step."""
    original = Trainer.step

    def step(self, n):
        action(n)
        return original(self, n)

    monkeypatch.setattr(Trainer, "step", step)


# ----------------------------------------------------------------------------- signals


def test_ctrl_c_finishes_the_step_checkpoints_and_exits_130(tmp_path, model, monkeypatch, capsys):
    handler_before = signal.getsignal(signal.SIGINT)  # SIG_IGN when the suite itself runs in the background
    at_step(monkeypatch, lambda n: n == 3 and os.kill(os.getpid(), signal.SIGINT))
    assert main(flags(tmp_path, model)) == 130
    run_dir = tmp_path / "runs" / "r"
    err = capsys.readouterr().err
    assert f"interrupted after step 3, checkpoint saved; continue with: mlx-grpo train --resume {run_dir}" in err
    assert [r["step"] for r in lines(run_dir / "metrics.jsonl")] == [1, 2, 3]
    assert (run_dir / "checkpoints" / "step_3" / "state.json").is_file()
    assert read_run_info(run_dir).status == "interrupted"
    assert signal.getsignal(signal.SIGINT) is handler_before  # handlers are put back

    monkeypatch.undo()
    assert main(["train", "--resume", str(run_dir)]) == 0
    assert [r["step"] for r in lines(run_dir / "metrics.jsonl")] == [1, 2, 3, 4, 5]


def test_second_ctrl_c_stops_inside_the_step_without_a_new_checkpoint(tmp_path, model, monkeypatch, capsys):
    def twice(n):
        if n == 4:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)

    at_step(monkeypatch, twice)
    assert main(flags(tmp_path, model)) == 130
    run_dir = tmp_path / "runs" / "r"
    err = capsys.readouterr().err
    assert f"stopped during step 4; the last checkpoint is step 2; continue from it with: " \
           f"mlx-grpo train --resume {run_dir}" in err
    assert [r["step"] for r in lines(run_dir / "metrics.jsonl")] == [1, 2, 3]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_2"]
    assert read_run_info(run_dir).status == "interrupted"


# ----------------------------------------------------------------------------- non-finite updates


def poison(monkeypatch, bad_steps):
    """Make the loss (and so every gradient) NaN during the given steps."""
    current = {"step": 0}
    at_step(monkeypatch, lambda n: current.update(step=n))
    make_loss_fn = trainer_module.make_loss_fn

    def poisoned_make_loss_fn(config):
        loss_fn = make_loss_fn(config)

        def wrapped(model, batch, *args):
            loss, aux = loss_fn(model, batch, *args)
            return (loss * math.nan if current["step"] in bad_steps else loss), aux

        return wrapped

    monkeypatch.setattr(trainer_module, "make_loss_fn", poisoned_make_loss_fn)


def test_a_nan_loss_is_skipped_counted_and_alerted(tmp_path, model, monkeypatch):
    poison(monkeypatch, {3})
    assert main(flags(tmp_path, model, checkpoint_every=1, keep_checkpoints=10)) == 0
    run_dir = tmp_path / "runs" / "r"
    records = {r["step"]: r for r in lines(run_dir / "metrics.jsonl")}
    assert records[3]["policy/skipped_updates"] == 1 and records[3]["policy/loss"] is None  # null, never NaN
    assert all(records[s]["policy/skipped_updates"] == 0 for s in (1, 2, 4, 5))
    ckpt = run_dir / "checkpoints"
    before, after = weights(ckpt / "step_2"), weights(ckpt / "step_3")
    assert all(np.array_equal(before[k], after[k]) for k in before)  # the NaN step left the weights alone
    assert not all(np.array_equal(after[k], weights(ckpt / "step_4")[k]) for k in after)  # training went on
    alerts = [a for a in lines(run_dir / "alerts.jsonl") if a["rule"] == "non_finite"]
    assert [(a["step"], a["level"]) for a in alerts] == [(3, "error")]
    assert "policy/loss=NaN" in alerts[0]["message"]


def test_nan_updates_in_a_row_stop_the_run_with_its_last_good_checkpoint(tmp_path, model, monkeypatch, capsys):
    poison(monkeypatch, {3, 4, 5})
    code = main(flags(tmp_path, model, checkpoint_every=1, max_consecutive_nonfinite=2))
    run_dir = tmp_path / "runs" / "r"
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 3
    assert len(err) == 1 and "2 updates in a row had a NaN or Inf loss or gradient" in err[0]
    assert f"stopped at step 4. Continue from the last checkpoint with a lower learning rate: " \
           f"mlx-grpo train --resume {run_dir} --learning-rate 0.001" in err[0]
    assert read_run_info(run_dir).status == "failed"
    assert [r["step"] for r in lines(run_dir / "metrics.jsonl")] == [1, 2, 3, 4]
    latest = max((run_dir / "checkpoints").iterdir(), key=lambda p: int(p.name.split("_")[1]))
    assert latest.name == "step_3"
    assert all(np.isfinite(v).all() for v in weights(latest).values())

    monkeypatch.undo()
    assert main(["train", "--resume", str(run_dir), "--learning-rate", "0.001"]) == 0
    records = lines(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    assert records[-1]["policy/skipped_updates"] == 0 and records[-1]["policy/lr"] <= 0.001


def test_an_infinite_gradient_with_a_finite_loss_never_reaches_the_weights():
    model = nn.Linear(3, 2)
    optimizer = optim.AdamW(learning_rate=0.1)
    before = {k: np.array(v) for k, v in tree_flatten(model.parameters())}
    config = load_config(None, {"num_iterations": 2, "beta": 0.0})

    def loss_and_grad(model, batch, advantages, old_logp, ref_logp, totals):
        grads = {k: mx.full(v.shape, math.inf) for k, v in model.parameters().items()}
        return (mx.array(1.0), (mx.zeros((1, 1)), mx.full((1, 1), 0.5), {})), grads

    batch = build_train_batch(Rollout([[1, 2]], [[3]], [[0.0]], [False], 0.0), pad_id=0)
    result = update_policy(model, optimizer, loss_and_grad, batch, mx.zeros(1), None, config)
    assert result.skipped == 2 and result.loss == 1.0 and math.isinf(result.grad_norm)
    assert all(np.array_equal(before[k], np.array(v)) for k, v in tree_flatten(model.parameters()))
    assert optimizer.state.get("step", mx.array(0)).item() == 0



def test_a_step_with_nothing_to_learn_leaves_the_weights_and_adam_alone():
    """Every group flat and no KL term: a zero gradient. Adam would still move the weights on its momentum (and
    decay them, AdamW) and average a zero into its second moment; the step is taken only with a gradient."""
    model = nn.Linear(3, 2)
    optimizer = optim.AdamW(learning_rate=0.1)
    config = load_config(None, {"num_iterations": 1, "beta": 0.0})
    gradient = {"value": 1.0}

    def loss_and_grad(model, batch, advantages, old_logp, ref_logp, totals):
        grads = {k: mx.full(v.shape, gradient["value"]) for k, v in model.parameters().items()}
        return (mx.array(0.0), (mx.zeros((1, 1)), mx.full((1, 1), 0.5), {})), grads

    batch = build_train_batch(Rollout([[1, 2]], [[3]], [[0.0]], [False], 0.0), pad_id=0)
    update_policy(model, optimizer, loss_and_grad, batch, mx.ones(1), None, config)  # a real step: momentum
    after_first = {k: np.array(v) for k, v in tree_flatten(model.parameters())}
    moments = {k: np.array(v) for k, v in tree_flatten(optimizer.state)}
    gradient["value"] = 0.0
    result = update_policy(model, optimizer, loss_and_grad, batch, mx.zeros(1), None, config)
    assert result.grad_norm == 0.0 and result.skipped == 0  # not an error: nothing to learn
    assert all(np.array_equal(after_first[k], np.array(v)) for k, v in tree_flatten(model.parameters()))
    assert all(np.array_equal(moments[k], np.array(v)) for k, v in tree_flatten(optimizer.state))


# ----------------------------------------------------------------------------- failing sinks


def assert_complete_run_despite(run_dir: Path, sink: str, detail: str):
    records = lines(run_dir / "metrics.jsonl")  # every line parses
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    failed = [a for a in lines(run_dir / "alerts.jsonl") if a["rule"] == "sink_failed"]
    assert len(failed) == 1 and failed[0]["message"].startswith(f"{sink} logging failed") and detail in failed[0][
        "message"]
    assert read_run_info(run_dir).status == "finished"


def test_full_disk_under_tensorboard_warns_and_training_continues(tmp_path, model, monkeypatch, capsys):
    from tensorboardX import record_writer

    def no_space(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    # From step 2 on, every event write fails, in tensorboardX's own writer thread.
    at_step(monkeypatch, lambda n: n == 2 and monkeypatch.setattr(record_writer.RecordWriter, "write", no_space))
    assert main(flags(tmp_path, model)) == 0
    assert "tensorboard logging failed" in capsys.readouterr().out
    assert_complete_run_despite(tmp_path / "runs" / "r", "tensorboard", "No space left on device")


def test_a_tensorboard_write_error_warns_and_training_continues(tmp_path, model, monkeypatch):
    def broken(self, *args):
        raise PermissionError("events file is read-only")

    monkeypatch.setattr(sinks_module.TensorBoardSink, "handle", broken)
    assert main(flags(tmp_path, model)) == 0
    assert_complete_run_despite(tmp_path / "runs" / "r", "tensorboard", "read-only")


class FakeWandb(Sink):
    """Stands in for W&B: records what it was given; `fail_in` names the call that raises."""

    name = "wandb"
    fail_in = ""
    seen: list = []

    def __init__(self, options):
        self.options = options

    def handle(self, event):
        method = type(event).__name__.lower()
        FakeWandb.seen.append((method, event))
        if method == self.fail_in:
            raise ConnectionError("wandb.init() timed out, check your network")


@pytest.mark.parametrize("fail_in", ["start", "scalars"])
def test_a_wandb_failure_warns_and_training_continues(tmp_path, model, monkeypatch, fail_in):
    monkeypatch.setattr(FakeWandb, "fail_in", fail_in)
    monkeypatch.setattr(sinks_module, "WandbSink", FakeWandb)
    assert main(flags(tmp_path, model, wandb=True, tensorboard=False)) == 0
    assert_complete_run_despite(tmp_path / "runs" / "r", "wandb", "timed out")


# ----------------------------------------------------------------------------- secrets


def test_secrets_never_reach_the_run_directory_tensorboard_or_wandb(tmp_path, model, monkeypatch):
    secrets = {"WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567",
               "HF_TOKEN": "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345",
               "OPENAI_API_KEY": "sk-proj-AbCdEfGhIjKlMnOpQrStUvWx"}
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(FakeWandb, "seen", [])
    monkeypatch.setattr(sinks_module, "WandbSink", FakeWandb)
    # Secrets pasted where config values go: a W&B note and tag, and a key-shaped string elsewhere.
    argv = flags(tmp_path, model, wandb=True, wandb_notes=secrets["WANDB_API_KEY"],
                 wandb_tags=["baseline", secrets["HF_TOKEN"]], wandb_entity=secrets["OPENAI_API_KEY"])
    assert main(argv) == 0
    run_dir = tmp_path / "runs" / "r"
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert any(p.parent.name == "tensorboard" for p in files)
    for path in files:
        data = path.read_bytes()
        for name, value in secrets.items():
            assert value.encode() not in data, f"{name} in {path.relative_to(run_dir)}"
    given_to_wandb = json.dumps(FakeWandb.seen, default=str)
    assert not any(value in given_to_wandb for value in secrets.values())
    config = read_run_info(run_dir).config
    assert config["wandb_tags"] == ["baseline"] and "wandb_notes" not in config


# ----------------------------------------------------------------------------- a resume never changes the model


@pytest.mark.parametrize("flag,value", [("--lora-rank", "4"), ("--use-lora", None), ("--model-id", "other-dir"),
                                        ("--dtype", "bfloat16")])
def test_a_resume_that_would_change_the_model_is_refused(tmp_path, model, capsys, flag, value):
    assert main(flags(tmp_path, model, num_steps=2, checkpoint_every=1)) == 0
    run_dir = tmp_path / "runs" / "r"
    before = (run_dir / "metrics.jsonl").read_bytes()
    code = main(["train", "--resume", str(run_dir), "--num-steps", "3", flag, *([value] if value else [])])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "cannot change on resume" in err[0] and f"mlx-grpo export {run_dir} --out DIR" in err[0]
    assert (run_dir / "metrics.jsonl").read_bytes() == before  # nothing touched
    assert main(["train", "--resume", str(run_dir), "--num-steps", "3"]) == 0  # other keys still may change


def test_a_checkpoint_never_half_loads_into_another_model(tmp_path, model):
    from mlx_grpo.checkpoint import load_checkpoint
    from mlx_grpo.trainer import make_optimizer

    assert main(flags(tmp_path, model, num_steps=1, checkpoint_every=1, use_lora=True, lora_rank=8)) == 0
    checkpoint = tmp_path / "runs" / "r" / "checkpoints" / "step_1"
    config = load_config(None, {"model_id": str(model), "use_lora": True, "lora_rank": 4})
    from mlx_grpo.models.policy import load_policy_for_training

    policy = load_policy_for_training(config, tmp_path)
    with pytest.raises(UserError, match=r"has shape .* in the checkpoint and .* in this model"):
        load_checkpoint(checkpoint, policy.model, make_optimizer(config))
    full = load_policy_for_training(load_config(None, {"model_id": str(model)}), tmp_path)
    with pytest.raises(UserError, match="which this model does not have"):
        load_checkpoint(checkpoint, full.model, make_optimizer(config))


# ----------------------------------------------------------------------------- one process per run directory


def test_runs_started_at_once_with_the_same_name_get_their_own_directories(tmp_path):
    import threading

    from mlx_grpo.run.run_lock import create_run_dir

    made, start = [], threading.Barrier(8)

    def claim():
        start.wait()
        made.append(create_run_dir(tmp_path / "runs", "grpo-20261124-120000"))  # (directory, lock held)

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    made = [path for path, _ in made]
    assert len(set(made)) == 8 and all(p.is_dir() for p in made)
    assert sorted(p.name for p in made)[:2] == ["grpo-20261124-120000", "grpo-20261124-120000-2"]


def test_a_run_being_trained_cannot_be_resumed_by_a_second_process(tmp_path, model, capsys):
    from mlx_grpo.run.run_lock import RunLock

    assert main(flags(tmp_path, model, num_steps=2, checkpoint_every=1)) == 0
    run_dir = tmp_path / "runs" / "r"
    before = (run_dir / "metrics.jsonl").read_bytes()
    held = RunLock(run_dir).acquire()  # as the process training it would hold it
    try:
        code = main(["train", "--resume", str(run_dir), "--num-steps", "3"])
    finally:
        held.release()
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "another process" in err[0] and "is training this run" in err[0]
    assert (run_dir / "metrics.jsonl").read_bytes() == before
    assert main(["train", "--resume", str(run_dir), "--num-steps", "3"]) == 0  # free again: resumes


def test_an_unwritable_monitoring_dir_is_one_line(tmp_path, model, capsys):
    (tmp_path / "file").write_text("not a directory")
    code = main(flags(tmp_path, model, monitoring_dir=str(tmp_path / "file" / "runs")))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "cannot create the run directory" in err[0]


def test_resume_cuts_only_the_trainers_logs_and_only_where_it_knows(tmp_path, model):
    """A checkpoint saved without log positions (an older or hand-edited one) and a JSONL file of the
    user's own: the resume cuts the trainer's logs after the checkpoint's step and nothing else."""
    assert main(flags(tmp_path, model, num_steps=4, checkpoint_every=2)) == 0
    run_dir = tmp_path / "runs" / "r"
    mine = run_dir / "my_notes.jsonl"
    mine.write_text('{"note": "kept"}\n')
    state_file = run_dir / "checkpoints" / "step_4" / "state.json"
    shutil.rmtree(state_file.parent)  # resume from step 2, whose state has no log positions
    state_file = run_dir / "checkpoints" / "step_2" / "state.json"
    state = json.loads(state_file.read_text())
    del state["log_positions"]  # as an older version wrote it
    state_file.write_text(json.dumps(state))
    (state_file.parent / "checksums.json").write_text(json.dumps(file_checksums(state_file.parent)))
    samples_before = [s["step"] for s in lines(run_dir / "samples.jsonl")]
    assert main(["train", "--resume", str(run_dir)]) == 0
    assert [r["step"] for r in lines(run_dir / "metrics.jsonl")] == [1, 2, 3, 4]  # 3 and 4 once each
    assert [s["step"] for s in lines(run_dir / "samples.jsonl")] == samples_before
    assert mine.read_text() == '{"note": "kept"}\n'


def test_a_checkpoint_state_that_is_not_ours_is_one_line(tmp_path, model, capsys):
    assert main(flags(tmp_path, model, num_steps=2, checkpoint_every=1)) == 0
    run_dir = tmp_path / "runs" / "r"
    state = run_dir / "checkpoints" / "step_2" / "state.json"
    fields = json.loads(state.read_text())
    del fields["rng"]  # checksums that agree: the schema, not only the checksum, finds it
    state.write_text(json.dumps(fields))
    (state.parent / "checksums.json").write_text(json.dumps(file_checksums(state.parent)))
    code = main(["train", "--resume", str(run_dir), "--num-steps", "3"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "checkpoint is damaged (state.json 'rng' is not two 32-bit numbers" in err[0]


def test_lora_keys_that_match_nothing_are_refused_before_training(tmp_path, model, capsys):
    code = main(flags(tmp_path, model, use_lora=True, lora_keys=["no_such.module"]))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "matches no layer" in err[0]


def test_a_checkpoint_that_cannot_be_written_stops_the_run_in_one_line_and_leaves_no_partial_copy(
        tmp_path, model, capsys, monkeypatch):
    import mlx_grpo.checkpoint as checkpoint_module

    writes = {"n": 0}
    real_save = checkpoint_module.mx.save_safetensors

    def disk_fills_up(path, arrays, *args, **kwargs):
        writes["n"] += 1
        if ".step_4.tmp" in str(path):
            raise RuntimeError("[save_safetensors] Failed to write: No space left on device")
        return real_save(path, arrays, *args, **kwargs)

    monkeypatch.setattr(checkpoint_module.mx, "save_safetensors", disk_fills_up)
    code = main(flags(tmp_path, model, num_steps=5, checkpoint_every=2))
    run_dir = tmp_path / "runs" / "r"
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "writing checkpoint step_4 failed (" in err[0] and f"mlx-grpo train --resume {run_dir}" in err[0]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_2"]  # no .step_4.tmp left
    assert read_run_info(run_dir).status == "failed"
    monkeypatch.undo()
    assert main(["train", "--resume", str(run_dir)]) == 0
    assert [r["step"] for r in lines(run_dir / "metrics.jsonl")] == [1, 2, 3, 4, 5]


def test_a_resume_cannot_move_the_run(tmp_path, model, capsys):
    assert main(flags(tmp_path, model, num_steps=2, checkpoint_every=1)) == 0
    run_dir = tmp_path / "runs" / "r"
    code = main(["train", "--resume", str(run_dir), "--num-steps", "3", "--run-name", "elsewhere"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "'run_name' cannot change on resume" in err[0]


def test_a_bad_value_in_a_runs_saved_config_names_its_run_json(tmp_path, model, capsys):
    assert main(flags(tmp_path, model, num_steps=2, checkpoint_every=1)) == 0
    run_dir = tmp_path / "runs" / "r"
    info = read_run_info(run_dir)
    info.config["temperature"] = "hot"
    write_run_info(run_dir, info)
    assert main(["train", "--resume", str(run_dir), "--num-steps", "3"]) == 2
    assert f"{run_dir / 'run.json'}: key 'temperature' is 'hot'" in capsys.readouterr().err


def test_two_ctrl_c_that_arrive_together_stop_at_once():
    """CPython runs the handler once for signals that arrive while MLX runs native code; the wakeup
    pipe still holds one byte per signal, so two presses are two (reliability review D21)."""
    from mlx_grpo.run.signals import StopRequest

    stop = StopRequest()
    with stop:
        os.write(stop._wakeup[1], bytes([signal.SIGINT, signal.SIGINT]))  # what two merged SIGINTs leave
        with pytest.raises(KeyboardInterrupt):
            stop._handle(signal.SIGINT, None)
    assert stop.requested == "SIGINT"
    single = StopRequest()
    with single:
        os.write(single._wakeup[1], bytes([signal.SIGINT]))
        single._handle(signal.SIGINT, None)  # one press: finish the step
        assert single.requested == "SIGINT"
    assert signal.getsignal(signal.SIGINT) is not single._handle  # handlers and wakeup fd restored


def test_the_best_held_out_checkpoint_is_kept_when_the_run_ends_below_it(tmp_path, model, monkeypatch, capsys):
    # A run that peaks mid-way and falls (the gemma recipe without clipping: 46% -> 88% -> 48%) kept only its
    # last checkpoints: the 88% policy was gone. Each new best evaluation is checkpointed and never pruned.
    scripted = iter([0.3, 0.6, 0.5, 0.4, 0.2])  # steps 0, 2, 4, 6, 8

    def evaluate(self, peaks=None):
        return {"eval/accuracy": next(scripted)}

    monkeypatch.setattr(Trainer, "evaluate", evaluate)
    assert main(flags(tmp_path, model, num_steps=8, eval_every=2, checkpoint_every=0, keep_checkpoints=1)) == 0
    run_dir = tmp_path / "runs" / "r"
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_2", "step_8"]
    assert "best 60.0% at step 2" in capsys.readouterr().out
    state = json.loads((run_dir / "checkpoints" / "step_8" / "state.json").read_text())
    assert state["best_eval"] == [2, 0.6]
