"""Memory: the plan's parameter counts, its predicted peaks against measured ones, a flat rollout, and the
cache limit a run sets."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from ...telemetry.rundir.layout import RunPaths
from .common import Check, device_name, perturbed, small_config, verdict
from .environment import cache_limit_now, memory_state

PRESET = "qwen2.5-0.5b"  # a published shape (152k vocabulary), cut to PRESET_LAYERS blocks, random weights
PRESET_LAYERS = 2
# The plan is fitted within ~15% of measurements (plan.py, docs/SCALE.md): a phase passes when its planned
# peak is within this band of the measured one (below it, a run the plan accepts could not fit).
PLAN_BAND = (0.85, 1.5)
FLAT_GROWTH = 0.05  # rollout peak above the KV cache may grow by this share of it from T to 8T tokens

# Two small in-memory shapes the plan must count exactly: a dense block and a mixture of experts
PLAN_SHAPES = {
    "llama": {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 300, "rms_norm_eps": 1e-6,
              "rope_theta": 10000.0, "tie_word_embeddings": False},
    "qwen3_moe": {"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 300, "rms_norm_eps": 1e-6,
                  "rope_theta": 1000000.0, "tie_word_embeddings": False, "head_dim": 16, "num_experts": 4,
                  "num_experts_per_tok": 2, "moe_intermediate_size": 32, "decoder_sparse_step": 1,
                  "mlp_only_layers": [], "norm_topk_prob": True, "max_position_embeddings": 512},
}


# the plan leaves out vectors such as qwen3's per-head norms (0.06% of the small MoE here); a family counted
# wrong is off by whole matrices (the MoE's expert adapters were 26x under)
PLAN_COUNT_TOLERANCE = 0.01


def check_plan_counts() -> Check:
    """The plan's parameter counts (weights, and LoRA adapters at rank 8 on every block) against the models
    mlx-lm builds: a dense block and a mixture of experts, whose experts each get their own adapters."""
    import importlib

    from mlx.utils import tree_flatten
    from mlx_lm.tuner.utils import linear_to_lora_layers

    from ...planning.plan import ModelShape

    rows, ok = {}, True
    for family, args in PLAN_SHAPES.items():
        module = importlib.import_module(f"mlx_lm.models.{family}")
        model = module.Model(module.ModelArgs.from_dict(args))
        real = sum(v.size for _, v in tree_flatten(model.parameters()))
        model.freeze()
        linear_to_lora_layers(model, args["num_hidden_layers"], {"rank": 8, "scale": 2.0, "dropout": 0.0})
        real_lora = sum(v.size for _, v in tree_flatten(model.trainable_parameters()))
        shape = ModelShape.from_config(args)
        planned = shape.parameters()
        planned_lora = shape.lora_parameters(8, args["num_hidden_layers"])
        rows[family] = {"parameters": real, "planned": planned, "lora": real_lora, "planned_lora": planned_lora}
        ok &= (abs(planned / real - 1) <= PLAN_COUNT_TOLERANCE
               and abs(planned_lora / real_lora - 1) <= PLAN_COUNT_TOLERANCE)
    text = ", ".join(f"{f} {r['planned']:.0f}/{r['parameters']} weights, {r['planned_lora']}/{r['lora']} LoRA"
                     for f, r in rows.items())
    return Check("plan_counts", verdict(ok), f"planned/real parameters: {text} (tolerance "
                 f"{PLAN_COUNT_TOLERANCE:.0%})", rows,
                 dtype="float32", device=device_name())


def preset_model_dir(out: Path) -> Path:
    """A random-weight model of PRESET's shape with the shipped tokenizer (ids past it decode to nothing)."""
    from mlx_lm.utils import save_config, save_model

    from ...models.policy import DEFAULT_MODEL_DIR
    from ...planning.presets import preset_config, preset_model

    out.mkdir(parents=True, exist_ok=True)
    save_model(out, preset_model(PRESET, layers=PRESET_LAYERS))
    save_config(dict(preset_config(PRESET, layers=PRESET_LAYERS)), out / "config.json")
    for name in DEFAULT_MODEL_DIR.iterdir():
        if "token" in name.name:
            shutil.copy(name, out / name.name)
    return out


def check_plan(base_dir: Path, model_dir: Path) -> tuple[Check, Any]:
    """The plan's peak of each phase against the trainer's measured peak, one step at full lengths."""
    import mlx.core as mx

    from ...models.policy import resolve_dtype
    from ...planning.fitting import read_model_shape
    from ...planning.plan import MemorySettings, Shapes, predict
    from ..workload import Workload

    prompt_length = 16
    config = small_config(model_id=str(model_dir), use_lora=True, lora_layers=-1, batch_size=2,
                          max_generation_steps=32, max_prompt_length=prompt_length, beta=0.04)
    # MLX's peak counter is process-wide: arrays alive before the check (a caller's own, e.g. a test session's)
    # are not this step's and are taken off
    already_alive = mx.get_active_memory()
    work = Workload(config, base_dir, prompt_length)
    _, measured = work.step(1)
    measured = {phase: peak - already_alive for phase, peak in measured.items()}
    planned = predict(read_model_shape(str(model_dir), base_dir),
                      Shapes(config.batch_size, config.num_generations, prompt_length, config.max_generation_steps),
                      config, MemorySettings(0, 0, False), resolve_dtype(config))
    rows, ok = {}, True
    for phase, attribute in (("rollout", "rollout"), ("ref", "reference"), ("update", "update")):
        have = perturbed("plan", np.array(measured[phase]))
        want = getattr(planned, attribute)
        rows[phase] = {"measured_bytes": float(have), "planned_bytes": want,
                       "planned_over_measured": want / float(have)}
        ok &= PLAN_BAND[0] <= want / float(have) <= PLAN_BAND[1]
    text = ", ".join(f"{p} {r['measured_bytes'] / 2**20:.0f}/{r['planned_bytes'] / 2**20:.0f} MiB"
                     for p, r in rows.items())
    return Check("memory_plan", verdict(ok),
                 f"{PRESET} ({PRESET_LAYERS} layers) measured/planned peak: {text} (pass: planned within "
                 f"{PLAN_BAND[0]:g}-{PLAN_BAND[1]:g}x measured)", rows, dtype=resolve_dtype(config),
                 device=device_name()), work


def check_rollout_flat(work) -> Check:
    """The rollout's peak above its KV cache, at T and 8T new tokens: it must not grow with T."""
    import mlx.core as mx

    from ...models.policy import resolve_dtype
    from ...trainer import step_key
    from ..benchmark import kv_bytes_per_token

    prompt = max(len(e.tokens) for e in work.fixed.encoded)
    rows = work.sequences
    above = {}
    for steps in (8, 64):
        mx.clear_cache()
        mx.reset_peak_memory()
        base = mx.get_active_memory()
        work.trainer.rollout(work.fixed, step_key(0, steps), steps)
        kv = kv_bytes_per_token(work.model) * rows * (prompt + steps)
        above[steps] = float(perturbed("rollout_flat", np.array(mx.get_peak_memory() - base - kv)))
    growth = (above[64] - above[8]) / max(above[8], 1.0)
    return Check("rollout_flat", verdict(growth <= FLAT_GROWTH),
                 f"rollout peak above its KV cache, 8 vs 64 new tokens: {above[8] / 2**20:.1f} -> "
                 f"{above[64] / 2**20:.1f} MiB ({growth:+.1%}, tolerance +{FLAT_GROWTH:.0%})",
                 {"above_kv_bytes": above, "growth": growth, "tolerance": FLAT_GROWTH},
                 dtype=resolve_dtype(work.trainer.config), device=device_name())


def check_memory(base_dir: Path, work: Path, initial_cache_limit: int) -> Check:
    """A short LoRA `train` run as a user starts it: the wired limit it set, read back (Metal); the buffer cache
    limit it set from its plan, read back, and the cache logged between its steps against it; swap and
    memory pressure before and after."""
    import mlx.core as mx

    from ...models.policy import resolve_dtype
    from ...planning.fitting import fit_run
    from ...planning.machine import cache_limit_for, wired_limit, wired_limit_in_effect, wiring_takes_effect
    from ...run.loop import train
    from ...trainer import Trainer

    config = small_config(num_steps=3, eval_every=0, checkpoint_every=0, use_lora=True, lora_layers=-1,
                          batch_size=2, monitoring_dir=str(work / "runs"), run_name="memory")
    if mx.metal.is_available():
        mx.set_wired_limit(0)  # what follows reads back train's own wiring, not an earlier check's
    mx.set_cache_limit(initial_cache_limit)
    before = memory_state()
    run = Path(train(config, base_dir)["run_dir"])
    after = memory_state()
    wired, wanted_wired = wired_limit_in_effect(), wired_limit()
    cache_limit = cache_limit_now()
    planned_peak = fit_run(config, base_dir)[2]
    wanted_cache = cache_limit_for(Trainer.build(config, base_dir).resident_bytes(), planned_peak)
    cached = [r.get("system/accel_cache_gb") for r in map(json.loads, RunPaths(run).metrics.read_text().splitlines())
              if "step" in r]
    cached = [c * 1e9 for c in cached if c is not None]
    worst_cache = float(perturbed("memory", np.array(max(cached, default=0.0))))
    problems = []
    if wanted_wired is not None and wired != wanted_wired:
        problems.append(f"wired limit read back {wired} B, train asks for {wanted_wired} B")
    if wanted_cache is None or cache_limit != wanted_cache:
        problems.append(f"cache limit read back {cache_limit / 2**20:.1f} MiB, the plan gives "
                        f"{(wanted_cache or 0) / 2**20:.1f} MiB")
    if wanted_cache is not None and worst_cache > wanted_cache:
        problems.append(f"cache between steps {worst_cache / 2**20:.1f} MiB, above the limit")
    effect = {True: "", False: " (macOS < 15: MLX wires nothing)", None: ""}[wiring_takes_effect()]
    wired_text = f"wired limit {wired / 2**30:.2f} GiB read back{effect}" if wired is not None else \
        "wired limit n/a (no Metal)"
    swap = lambda s: "n/a" if s["swap_used_bytes"] is None else f"{s['swap_used_bytes'] / 2**30:.2f} GiB"  # noqa: E731
    pressure = lambda s: s["memory_pressure"] or "n/a"  # noqa: E731
    detail = (f"{wired_text}; cache limit {cache_limit / 2**20:.1f} MiB (plan: {(wanted_cache or 0) / 2**20:.1f}), "
              f"cache between steps <= {worst_cache / 2**20:.1f} MiB; swap {swap(before)} -> {swap(after)}, "
              f"pressure {pressure(before)} -> {pressure(after)}")
    return Check("memory", verdict(not problems), detail + ("; " + "; ".join(problems) if problems else ""),
                 {"wired_limit_read_back": wired, "wired_limit_wanted": wanted_wired,
                  "wiring_takes_effect": wiring_takes_effect(), "cache_limit_read_back": cache_limit,
                  "cache_limit_planned": wanted_cache, "cache_between_steps_bytes": cached,
                  "before": before, "after": after}, dtype=resolve_dtype(config), device=device_name())


