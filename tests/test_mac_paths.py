"""Paths the second Mac review found (docs/PLATFORMS.md): the held-out evaluation inside the plan's batch size
and the peak meter, what stays resident counted before it exists, memory shares of trainers on one machine,
and which model families chunk their LM head."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from mlx_grpo import machine
from mlx_grpo.config import load_config
from mlx_grpo.distributed import World
from mlx_grpo.models import chunk_ignored, has_plain_head
from mlx_grpo.trainer import Trainer
from mlx_grpo.update import build_train_batch, completion_logprobs
from tiny_models import grouped_rollout, random_model


@pytest.fixture(scope="module")
def trainer():
    config = load_config(None, {"batch_size": 2, "num_generations": 3, "max_generation_steps": 6,
                                "eval_size": 10, "micro_batch_size": 0})
    return Trainer.build(config, Path.cwd())


def test_held_out_evaluation_decodes_at_most_a_steps_rows_at_once_and_is_metered(trainer, monkeypatch):
    """100 rows at once was outside what the plan checked (B x G rows) and outside the peak meter."""
    import mlx_grpo.evaluate as evaluate_module

    sizes = []
    real = evaluate_module.generate

    def counting(model, prompts, *args, **kwargs):
        sizes.append(len(prompts))
        return real(model, prompts, *args, **kwargs)

    monkeypatch.setattr(evaluate_module, "generate", counting)
    peaks: dict[str, float] = {"update": 1.0}
    record = trainer.evaluate(peaks)
    assert record["eval/num_samples"] == 10
    assert sizes == [6, 4]
    assert peaks["eval"] > 0 and peaks["update"] == 1.0
    assert mx.get_cache_memory() == 0  # the evaluation's cached buffers are released (wired on a Mac)


def test_what_stays_resident_counts_the_optimiser_state_before_it_exists(trainer):
    """Full fine-tuning with a reference copy: weights, the frozen copy and AdamW's two moments, 16 bytes
    per parameter in float32. The allocator's counter reads 8 before the first update builds the moments."""
    params = sum(v.size for _, v in tree_flatten(trainer.policy.model.parameters()))
    assert trainer.config.use_lora is False and trainer.reference is not None
    assert trainer.resident_bytes() == 16 * params
    # what the old warning read: the arrays that exist before the first update (weights and the frozen copy),
    # counted from the trainer itself, not the process-wide allocator that earlier tests also fill
    existing = sum(v.nbytes for _, v in tree_flatten(trainer.policy.model.parameters()))
    assert existing == 4 * params and 2 * existing < trainer.resident_bytes()


def test_ranks_of_one_launch_on_one_host_share_its_memory(monkeypatch):
    monkeypatch.setenv(machine.MEMORY_SHARE_ENV, "1")  # so monkeypatch restores it, whatever share_memory_with sets
    monkeypatch.delenv(machine.MEMORY_SHARE_ENV)
    world = World(group=None, rank=0, size=3)
    monkeypatch.setattr(World, "gather_json", lambda self, obj: [obj, obj, "another-mac"])
    assert world.ranks_on_this_host() == 2
    machine.share_memory_with(world.ranks_on_this_host())
    assert machine.memory_share() == 2
    machine.share_memory_with(4)  # set once (a parallel sweep's share stands)
    assert machine.memory_share() == 2


def test_the_memory_alert_reads_against_this_trainers_share(monkeypatch):
    """A parallel sweep's trial (or a rank sharing the Mac) at 3x its share read under 90% of the whole
    working set, so the memory-pressure alert never fired."""
    monkeypatch.setattr(machine, "device_info", lambda: {"max_recommended_working_set_size": 16e9})
    monkeypatch.setenv(machine.MEMORY_SHARE_ENV, "4")
    assert machine.accel_memory()["limit"] == 4e9


def test_a_logits_chunk_the_models_head_cannot_honour_is_said_once():
    config = load_config(None, {"logits_chunk_size": 16})
    assert chunk_ignored(random_model("gemma3_text"), config) is not None
    assert chunk_ignored(random_model("llama"), config) is None
    assert chunk_ignored(random_model("gemma3_text"), replace(config, logits_chunk_size=0)) is None


def test_a_mixture_of_experts_head_is_chunked_and_scores_as_one_pass():
    model = random_model("qwen3_moe", vocab=300)
    assert has_plain_head(model)
    batch = build_train_batch(grouped_rollout(np.random.default_rng(0), 2, 3, ids=(1, 300), prompt_lengths=(2, 6),
                                              completion_lengths=(1, 9)), pad_id=0)
    whole = np.array(completion_logprobs(model, batch, 1.0)) * np.array(batch.mask)
    chunked = np.array(completion_logprobs(model, batch, 1.0, chunk_size=3)) * np.array(batch.mask)
    np.testing.assert_allclose(chunked, whole, rtol=1e-5, atol=1e-5)


def test_a_quantized_model_computes_in_the_dtype_the_run_reports(tmp_path):
    """A 4-bit model stored with float16 scales kept computing in float16 while run.json said otherwise."""
    import mlx.nn as nn
    from mlx_lm import load
    from mlx_lm.utils import save_config, save_model

    from mlx_grpo.models import load_policy, resolve_dtype
    from tiny_models import make_model_dir

    source = make_model_dir(tmp_path / "plain", "llama")
    model, _ = load(str(source))
    nn.quantize(model, group_size=64, bits=4)
    model.set_dtype(mx.float16)
    quantized = tmp_path / "q4"
    quantized.mkdir()
    save_model(quantized, model)
    config_json = __import__("json").loads((source / "config.json").read_text())
    save_config({**config_json, "quantization": {"group_size": 64, "bits": 4}}, quantized / "config.json")
    for name in source.iterdir():
        if "token" in name.name:
            (quantized / name.name).write_bytes(name.read_bytes())
    config = load_config(None, {"model_id": str(quantized), "use_lora": True})
    loaded, _ = load_policy(config, tmp_path)
    floating = {v.dtype for _, v in tree_flatten(loaded.parameters()) if mx.issubdtype(v.dtype, mx.floating)}
    assert floating == {getattr(mx, resolve_dtype(config))}
    assert any(v.dtype == mx.uint32 for _, v in tree_flatten(loaded.parameters()))  # still packed 4-bit
