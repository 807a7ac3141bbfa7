"""Entropy dumps: entropy/varentropy values, the file format, the summariser, and what a training step writes."""

import json
import math
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from tiny_models import make_model_dir

from mlx_grpo.config.train_config import load_config
from mlx_grpo.extras.entropy_dump import build_dump, list_dumps, read_dump, write_dump
from mlx_grpo.extras.token_entropy import entropy_and_varentropy
from mlx_grpo.rollout import Rollout
from mlx_grpo.run.loop import train
from mlx_grpo.tools import summarize_entropy
from mlx_grpo.trainer import Trainer
from mlx_grpo.update import build_train_batch

LN2 = math.log(2)


def test_entropy_and_varentropy_of_hand_computed_distributions():
    logits = mx.log(mx.array([[0.5, 0.25, 0.25, 0.0], [0.25, 0.25, 0.25, 0.25]]))
    entropy, varentropy = entropy_and_varentropy(logits)
    # p = (1/2, 1/4, 1/4): surprisals ln2, 2ln2, 2ln2; H = 1.5 ln2; E[s^2] = 2.5 ln2^2, so Var = 0.25 ln2^2.
    # The zero-probability token (-inf logit) adds nothing. Uniform over 4: H = ln4, every surprisal equal, Var = 0.
    np.testing.assert_allclose(np.array(entropy), [1.5 * LN2, 2 * LN2], rtol=1e-6)
    np.testing.assert_allclose(np.array(varentropy), [0.25 * LN2**2, 0.0], atol=1e-6)


def test_values_do_not_depend_on_a_shift_of_the_logits():
    logits = mx.array([[3.0, 1.0, -2.0, 0.5]])
    a = entropy_and_varentropy(logits)
    b = entropy_and_varentropy(logits + 1000.0)
    np.testing.assert_allclose(np.array(a[0]), np.array(b[0]), rtol=1e-5)
    np.testing.assert_allclose(np.array(a[1]), np.array(b[1]), rtol=1e-4)


def test_dump_round_trip_masks_padding_and_the_summary_counts_only_real_tokens(tmp_path):
    entropy = np.array([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]], dtype=np.float32)  # 9 sits on padding
    varentropy = np.array([[0.5, 0.5, 9.0], [1.5, 9.0, 9.0]], dtype=np.float32)
    arrays = build_dump(7, entropy, varentropy, prompts=[[1, 2, 3], [4]], completions=[[5, 6], [7]])
    path = write_dump(tmp_path, arrays)
    assert path == tmp_path / "entropy" / "step_7.npz"
    back = read_dump(path)
    assert int(back["step"]) == 7
    np.testing.assert_array_equal(back["responses"], [[5, 6], [7, -1]])
    np.testing.assert_array_equal(back["response_mask"], [[1, 1], [1, 0]])
    np.testing.assert_array_equal(back["prompts"], [[1, 2, 3], [4, -1, -1]])
    np.testing.assert_array_equal(back["attention_mask"], [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    np.testing.assert_array_equal(back["entropy"], [[1.0, 2.0], [3.0, 0.0]])
    row = summarize_entropy.summarize_dump(back)
    assert (row["rows"], row["tokens"]) == (2, 3)
    assert row["entropy_mean"] == pytest.approx(2.0) and row["entropy_max"] == 3.0
    assert row["varentropy_mean"] == pytest.approx(2.5 / 3)
    assert summarize_entropy.entropy_by_position([back], 3) == [2.0, 2.0, None]


def test_summarize_script_reads_a_run_and_says_when_there_is_nothing(tmp_path, capsys):
    assert summarize_entropy.main([str(tmp_path)]) == 2
    assert "no entropy dumps" in capsys.readouterr().err
    for step in (10, 2):
        write_dump(tmp_path, build_dump(step, np.ones((1, 2)), np.zeros((1, 2)), [[1]], [[5, 6]]))
    assert [p.name for p in list_dumps(tmp_path)] == ["step_2.npz", "step_10.npz"]
    assert summarize_entropy.main([str(tmp_path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert [s["step"] for s in summary["steps"]] == [2, 10]
    assert summarize_entropy.main([str(tmp_path)]) == 0
    assert "entropy_mean" in capsys.readouterr().out


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("tiny"), "llama", seed=1)


def small_config(model_dir: Path, tmp_path: Path, **overrides):
    # one update per step: policy/entropy is then the sampling policy's, as the dump's
    return load_config(None, {"model_id": str(model_dir), "num_steps": 4, "batch_size": 2, "num_generations": 3,
                              "num_iterations": 1,
                              "max_generation_steps": 8, "train_size": 40, "eval_every": 0, "checkpoint_every": 0,
                              "tensorboard": False, "monitoring_dir": str(tmp_path / "runs"), "run_name": "r",
                              "entropy_logging.enable": True, **overrides})


def test_a_step_dumps_the_sampling_policy_entropy_of_every_completion_token(tiny_model, tmp_path):
    config = small_config(tiny_model, tmp_path, beta=0.0)
    trainer = Trainer.build(config, tmp_path)
    before = {k: mx.array(v) for k, v in tree_flatten(trainer.policy.model.parameters())}
    result = trainer.step(1)
    arrays = result.entropy_dump
    assert arrays is not None and arrays["entropy"].shape[0] == 6
    # recompute with the weights the rollout was sampled with (the update has changed them since)
    trainer.policy.model.load_weights(list(before.items()))
    lengths = arrays["response_mask"].sum(axis=1)
    prompts = [list(p[:n]) for p, n in zip(arrays["prompts"], arrays["prompt_lengths"])]
    completions = [list(r[:n]) for r, n in zip(arrays["responses"], lengths)]
    batch = build_train_batch(Rollout(prompts, completions, [[]] * 6, [False] * 6, 0.0), trainer.policy.pad_id)
    logits = mx.take_along_axis(trainer.policy.model(batch.inputs), batch.positions[:, :, None], axis=1)
    logits = logits / config.temperature
    entropy, varentropy = entropy_and_varentropy(logits)
    mask = arrays["response_mask"].astype(bool)
    np.testing.assert_allclose(arrays["entropy"][mask], np.array(entropy)[mask], rtol=1e-4)
    np.testing.assert_allclose(arrays["varentropy"][mask], np.array(varentropy)[mask], rtol=1e-3, atol=1e-5)
    assert result.update.stats["entropy"] == pytest.approx(float(arrays["entropy"][mask].mean()), rel=1e-4)


def test_a_run_writes_a_dump_every_n_steps_and_none_when_off(tiny_model, tmp_path):
    result = train(small_config(tiny_model, tmp_path, **{"entropy_logging.every": 2}), tmp_path)
    assert [p.name for p in list_dumps(Path(result["run_dir"]))] == ["step_2.npz", "step_4.npz"]
    off = train(small_config(tiny_model, tmp_path, **{"entropy_logging.enable": False, "run_name": "off"}), tmp_path)
    assert not (Path(off["run_dir"]) / "entropy").exists()
