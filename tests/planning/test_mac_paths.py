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
from tiny_models import grouped_rollout, random_model

from mlx_grpo.config.train_config import load_config
from mlx_grpo.distributed import World
from mlx_grpo.models.policy import chunk_ignored, has_plain_head
from mlx_grpo.planning import machine
from mlx_grpo.trainer import Trainer
from mlx_grpo.update import build_train_batch, completion_logprobs


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
    assert chunk_ignored(random_model("gemma2"), config) is not None  # its soft-capped logits
    assert chunk_ignored(random_model("llama"), config) is None
    assert chunk_ignored(random_model("gemma3_text"), config) is None  # the tied embedding, plain
    assert chunk_ignored(random_model("gemma2"), replace(config, logits_chunk_size=0)) is None


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
    from tiny_models import make_model_dir

    from mlx_grpo.models.policy import load_policy, resolve_dtype

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


# ----------------------------------------------------------------------------- third Mac review (N5-N9, M7)

def test_the_sampler_takes_the_first_crossing_when_a_parallel_scan_steps_down():
    """N5: a GPU's parallel scan can make the cumulative sum dip by an ulp; counting sums at or below the
    threshold then lands past the first crossing."""
    from mlx_grpo.sampling import first_crossing

    cumulative = mx.array([[0.1, 0.5, 0.3, 1.0], [0.1, 0.5, 0.3, 1.0], [0.2, 0.2, 1.0, 1.0]])
    threshold = mx.array([[0.4], [1.0], [1.0]])
    # row 1: the first crossing is id 1 (a count would say 2); rows 2-3: a threshold at the total takes the
    # first id that reaches it, never an id past the last one with mass
    assert first_crossing(cumulative, threshold).tolist() == [1, 3, 2]


def test_the_sampler_draws_through_the_first_crossing(monkeypatch):
    import mlx_grpo.sampling as sampling

    real = mx.cumsum
    monkeypatch.setattr(mx, "cumsum", lambda x, axis=-1: real(x, axis=axis) * mx.array([1.0, 1.0, 0.5, 1.0]))
    logits = mx.zeros((1, 4))  # cumulative 1, 2, 1.5 (the dip), 4
    threshold_key = next(seed for seed in range(100)
                         if 1.5 < float(mx.random.uniform(shape=(1, 1), key=mx.random.key(seed))[0, 0]) * 4 < 2)
    ids, _ = sampling.sample_with_logprobs(logits, mx.random.key(threshold_key))
    assert ids.tolist() == [1]


def test_the_buffer_cache_is_held_to_what_the_plans_peak_adds_to_the_resident_weights(monkeypatch):
    """M7: GRPO's shapes change every step, so Metal's cache grows until active + cache reach 95% of the
    working set (wired) unless a limit holds it; the run sets one from its plan, on every backend."""
    assert machine.cache_limit_for(2e9, 5e9) == 3e9
    assert machine.cache_limit_for(2e9, None) is None and machine.cache_limit_for(2e9, 1e9) is None
    before = mx.set_cache_limit(0)
    try:
        machine.wire_memory(2 * 2**20, 5 * 2**20)
        assert mx.set_cache_limit(before) == 3 * 2**20
    finally:
        mx.set_cache_limit(before)


def test_cache_plus_active_memory_near_the_working_set_is_alerted():
    from mlx_grpo.telemetry.alerts.config import default_rules
    from mlx_grpo.telemetry.alerts.engine import AlertEngine
    from mlx_grpo.telemetry.metrics.system import GB, accel_metrics

    held = accel_metrics({"active": 4 * GB, "peak": 4 * GB, "cache": 5.8 * GB, "limit": 10 * GB})
    assert held["system/accel_held_percent"] == pytest.approx(98.0) and held["system/accel_memory_percent"] == 40
    records = [{"step": s, **held} for s in range(1, 5)]
    fired = {a.rule for a in AlertEngine(default_rules()).check_all(records)}
    assert "accel_held_high" in fired and "accel_memory_high" not in fired


def test_swap_and_macos_memory_pressure_are_sampled(monkeypatch):
    """N9: swap growth and memory pressure are where a Mac's wired cache shows."""
    from mlx_grpo.telemetry.alerts.config import default_rules
    from mlx_grpo.telemetry.alerts.engine import AlertEngine
    from mlx_grpo.telemetry.metrics import system

    monkeypatch.setattr(system, "memory_pressure_level", lambda: 2)
    sampler = system.SystemSampler(gpu_utilization=lambda: None).start()
    snap = sampler.snapshot()
    sampler.stop()
    assert snap["system/swap_used_gb"] >= 0 and snap["system/memory_pressure_level"] == 2
    records = [{"step": s, "system/memory_pressure_level": 2.0} for s in range(1, 5)]
    assert "memory_pressure_high" in {a.rule for a in AlertEngine(default_rules()).check_all(records)}


def test_mac_facts_read_pmset_and_say_when_the_os_has_none(monkeypatch):
    """The selftest's power source, Low Power Mode and thermal state (peers see several-fold slow-downs)."""
    outputs = {("-g", "batt"): "Now drawing from 'Battery Power'\n -InternalBattery-0 80%; discharging\n",
               ("-g",): "System-wide power settings:\n lowpowermode         1\n sleep 1\n",
               ("-g", "therm"): "Note: No thermal warning level has been recorded\n"
                                "CPU_Scheduler_Limit \t= 100\nCPU_Speed_Limit \t= 70\n"}
    monkeypatch.setattr(machine.sys, "platform", "darwin")
    monkeypatch.setattr(machine, "_pmset", lambda *args: outputs[args])
    assert machine.power_source() == "Battery Power" and machine.low_power_mode() == "on"
    assert "CPU_Speed_Limit \t= 70" in machine.thermal_state()
    monkeypatch.setattr(machine.sys, "platform", "linux")
    assert machine.power_source() == machine.low_power_mode() == machine.thermal_state() == machine.NOT_ON_THIS_OS


def test_the_wired_limit_is_read_back_and_macos_14_is_said_to_wire_nothing(monkeypatch):
    """N6: the limit shown was the one requested, recomputed; before macOS 15 MLX wires nothing."""
    import platform

    monkeypatch.setattr(platform, "mac_ver", lambda: ("14.6.1", ("", "", ""), "arm64"))
    assert machine.wiring_takes_effect() is False
    monkeypatch.setattr(platform, "mac_ver", lambda: ("15.1", ("", "", ""), "arm64"))
    assert machine.wiring_takes_effect() is True
    monkeypatch.setattr(platform, "mac_ver", lambda: ("", ("", "", ""), ""))
    assert machine.wiring_takes_effect() is None
    held = []
    monkeypatch.setattr(mx.metal, "is_available", lambda: True)
    monkeypatch.setattr(mx, "set_wired_limit", lambda n: held.append(n) or 7)
    assert machine.wired_limit_in_effect() == 7 and held == [0, 7]


def test_moe_lora_counts_an_adapter_per_expert_and_the_router():
    """N4: mlx-lm gives every expert its own adapters; the plan counted one dense MLP's (0.3 GB planned vs
    8.5 GB on Qwen3-30B-A3B)."""
    from mlx_lm.tuner.utils import linear_to_lora_layers

    from mlx_grpo.planning.plan import ModelShape

    model = random_model("qwen3_moe", vocab=300)
    model.freeze()
    linear_to_lora_layers(model, 2, {"rank": 8, "scale": 2.0, "dropout": 0.0})
    real = sum(v.size for _, v in tree_flatten(model.trainable_parameters()))
    assert ModelShape.from_config(dict(model.args.__dict__)).lora_parameters(8, 2) == real


def test_a_metal_failure_mid_run_is_one_line_with_its_cause_what_helps_and_the_resume_command(tmp_path, capsys,
                                                                                              monkeypatch):
    """MLX 0.32 and later raise a failed Metal command buffer (the GPU watchdog, out of memory) as a
    RuntimeError; train names it instead of a traceback, and says how to go on."""
    from mlx_grpo.cli import main
    from mlx_grpo.run import loop as run_module

    def watchdog(run, stop):
        raise RuntimeError("[METAL] Command buffer execution failed: Impacting Interactivity "
                           "(0000000e:kIOGPUCommandBufferCallbackErrorImpactingInteractivity)")

    monkeypatch.setattr(run_module, "run_steps", watchdog)
    code = main(["train", "--num-steps", "2", "--batch-size", "2", "--num-generations", "2", "--eval-every", "0",
                 "--no-tensorboard", "--no-wandb", "--monitoring-dir", str(tmp_path), "--run-name", "m"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "Traceback" not in err[0], err
    assert "watchdog" in err[0] and "let the display sleep" in err[0] and "mlx-grpo train --resume" in err[0]
    assert run_module.metal_failure(RuntimeError("shape mismatch")) is None
    out_of_memory = run_module.metal_failure(RuntimeError(
        "[METAL] Command buffer execution failed: Insufficient Memory (kIOGPUCommandBufferCallbackErrorOutOfMemory)"))
    assert "ran out of memory" in out_of_memory and "mlx-grpo plan" in out_of_memory
