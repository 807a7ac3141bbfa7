"""`mlx-grpo selftest`: prove the product on this machine, and write one report to send back.

Each check runs the project's own code (the trainer, its update, the memory plan, resume, bench) and
compares two ways of computing the same thing, or a prediction with a measurement, against a stated
tolerance. A check passes, fails, or is skipped with its reason. docs/PLATFORMS.md explains each line.

`MLX_GRPO_SELFTEST_PERTURB=<check>` perturbs the first side of that check's comparison (a relative 1e-3):
only for tests, which prove each check can fail.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .telemetry.metrics.names import EVAL_ACCURACY
from .telemetry.rundir.layout import RunPaths

PERTURB_ENV = "MLX_GRPO_SELFTEST_PERTURB"

# Measured here (Linux x86_64, 2 cores, MLX CPU backend, fp32): the default model's held-out accuracy gain
# over `LEARNING_STEPS` steps of the default config (eval before the first update and at the end). A Mac computes other
# roundings and samples other completions, so the check asks for at least half of it.
LEARNING_STEPS = 60
REFERENCE_GAIN = 0.18  # 32% -> 50% (seed 0, 200 held-out rows; docs/PLATFORMS.md, "selftest")
LEARNING_SHARE = 0.5

PRESET = "qwen2.5-0.5b"  # a published shape (152k vocabulary), cut to PRESET_LAYERS blocks, random weights
PRESET_LAYERS = 2
# The plan is fitted within ~15% of measurements (plan.py, docs/SCALE.md): a phase passes when its planned
# peak is within this band of the measured one (below it, a run the plan accepts could not fit).
PLAN_BAND = (0.85, 1.5)
FLAT_GROWTH = 0.05  # rollout peak above the KV cache may grow by this share of it from T to 8T tokens


@dataclass
class Check:
    name: str
    status: str  # "pass", "fail" or "skip"
    detail: str  # one line: what was compared, the numbers, the tolerance (or why skipped)
    measured: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


def perturbed(check: str, values: np.ndarray) -> np.ndarray:
    """`values`, nudged when the test switch names this check."""
    return values * (1 + 1e-3) + 1e-3 if os.environ.get(PERTURB_ENV) == check else values


def max_difference(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b))) if a.size else 0.0


# ----------------------------------------------------------------------------- environment

def gpu_cores() -> int | None:
    """The Apple GPU's core count (ioreg's gpu-core-count), None elsewhere."""
    if platform.system() != "Darwin":
        return None
    try:
        text = subprocess.run(["ioreg", "-rc", "AGXAccelerator", "-d", "1"], capture_output=True, text=True,
                              timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in text.splitlines():
        if '"gpu-core-count"' in line:
            try:
                return int(line.split("=")[-1].strip())
            except ValueError:
                return None
    return None


def environment() -> dict[str, Any]:
    import mlx.core as mx
    import psutil

    from . import chips
    from .machine import cpu_model, device_info, memory_share, versions, wire_memory, wired_limit

    info = device_info()
    wire_memory(0)  # as `mlx-grpo train` does, so what follows runs as training would
    chip = chips.this_chip()
    return {
        "chip": info.get("device_name") or cpu_model(),
        "cpu": cpu_model(),
        "gpu_cores": gpu_cores(),
        "bandwidth_gb_s": chip.bandwidth_gb_s if chip else None,
        "memory_bytes": info.get("memory_size") or psutil.virtual_memory().total,
        "working_set_bytes": info.get("max_recommended_working_set_size"),
        "wired_limit_bytes": wired_limit(),
        "memory_share": memory_share(),
        "os": platform.platform(),
        "macos": platform.mac_ver()[0] or None,
        "backend": "metal" if mx.metal.is_available() and mx.default_device().type == mx.gpu else "cpu",
        "load_average": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "cores": os.cpu_count(),
        **versions(),
    }


# ----------------------------------------------------------------------------- numerical equivalences

def small_config(**overrides):
    from .config import load_config

    return load_config(None, {"batch_size": 4, "num_generations": 4, "max_generation_steps": 12, "eval_size": 8,
                              "micro_batch_size": 0, "wandb": False, **overrides})


def sample_batch(trainer):
    """A real rollout of the trainer's model on its task, laid out for the update."""
    from .trainer import step_key
    from .update import build_train_batch

    prompts = trainer.draw_prompts()
    rollout = trainer.rollout(prompts, step_key(trainer.config.seed, 1), trainer.config.max_generation_steps)
    batch = build_train_batch(rollout, trainer.policy.pad_id)
    advantages = trainer.advantages(trainer.score(prompts, rollout), prompts.group_size)
    return batch, advantages


def check_shared_prompts(trainer, batch) -> Check:
    from .update import completion_logprobs, shares_prompts

    model, mask, t = trainer.policy.model, np.array(batch.mask), trainer.config.temperature
    if not shares_prompts(model, batch):
        return Check("shared_prompts", "skip", "this model cannot share prompt passes (no plain KV cache)")
    shared = perturbed("shared_prompts", np.array(completion_logprobs(model, batch, t)) * mask)
    whole = np.array(completion_logprobs(model, replace(batch, prompts=[]), t)) * mask
    diff, tol = max_difference(shared, whole), 1e-4
    return Check("shared_prompts", "pass" if diff <= tol else "fail",
                 f"log-probs, one pass per prompt vs whole sequences: max |difference| {diff:.1e} (tolerance {tol:g})",
                 {"max_abs_difference": diff, "tolerance": tol})


def check_chunked_head(trainer, batch) -> Check:
    from .models import has_plain_head
    from .update import completion_logprobs

    model, mask, t = trainer.policy.model, np.array(batch.mask), trainer.config.temperature
    if not has_plain_head(model):
        return Check("chunked_head", "skip", "this model family runs its own head (no chunks)")
    chunked = perturbed("chunked_head", np.array(completion_logprobs(model, batch, t, chunk_size=3)) * mask)
    whole = np.array(completion_logprobs(model, batch, t)) * mask
    diff, tol = max_difference(chunked, whole), 1e-4
    return Check("chunked_head", "pass" if diff <= tol else "fail",
                 f"log-probs, LM head 3 positions at a time vs one pass: max |difference| {diff:.1e} (tolerance {tol:g})",
                 {"max_abs_difference": diff, "tolerance": tol})


def check_micro_batches(base_dir: Path, batch, advantages) -> Check:
    """One update of the same weights on the same batch, whole vs in micro-batches of 3 (cutting groups).
    Plain SGD at rate 1 makes the weight change the (clipped) gradient itself: AdamW's first step is about
    the gradient's sign, which rounding flips for near-zero entries."""
    import mlx.optimizers as optim
    from mlx.utils import tree_flatten

    from .trainer import Trainer

    moved = []
    for micro in (0, 3):
        trainer = replace(Trainer.build(small_config(micro_batch_size=micro), base_dir),
                          optimizer=optim.SGD(learning_rate=1.0))
        before = {k: np.array(v) for k, v in tree_flatten(trainer.policy.model.trainable_parameters())}
        trainer.update(batch, advantages, trainer.reference_logprobs(batch))
        after = tree_flatten(trainer.policy.model.trainable_parameters())
        moved.append(np.concatenate([(np.array(v) - before[k]).ravel() for k, v in after]))
    whole, micro = moved[0], perturbed("micro_batches", moved[1])
    scale = float(np.max(np.abs(whole))) or 1.0
    diff, tol = max_difference(micro, whole) / scale, 1e-4
    return Check("micro_batches", "pass" if diff <= tol else "fail",
                 f"gradient step of one update, micro-batches of 3 vs the whole batch: max difference {diff:.1e} "
                 f"of the largest entry (tolerance {tol:g})", {"relative_difference": diff, "tolerance": tol})


def check_resume(base_dir: Path, work: Path) -> Check:
    """4 steps uninterrupted vs the same run resumed from its step-2 checkpoint: final weights and records."""
    from .run import train

    config = small_config(num_steps=4, checkpoint_every=2, keep_checkpoints=2, eval_every=0, batch_size=2,
                          max_generation_steps=8, monitoring_dir=str(work / "runs"), run_name="uninterrupted")
    whole = Path(train(config, base_dir)["run_dir"])
    resumed = work / "runs" / "resumed"
    shutil.copytree(whole, resumed)
    shutil.rmtree(RunPaths(resumed).checkpoints / "step_4")
    train(replace(config, run_name="resumed"), base_dir, resume_dir=resumed)

    def final_weights(run: Path) -> dict[str, np.ndarray]:
        import mlx.core as mx

        return {k: np.array(v) for k, v in mx.load(str(RunPaths(run).checkpoints / "step_4" / "model.safetensors")).items()}

    a, b = final_weights(whole), final_weights(resumed)
    diff = max(max_difference(perturbed("resume", a[k]), b[k]) for k in a)
    records = [[json.loads(line) for line in RunPaths(run).metrics.read_text().splitlines()] for run in (whole, resumed)]
    clock = ("time", "timing/", "system/", "throughput/", "perf/", "memory/")  # measured, not computed
    computed = [[{k: v for k, v in r.items() if not k.startswith(clock)}
                 for r in rs if r.get("step", 0) > 2] for rs in records]
    same_records = computed[0] == computed[1]
    ok = diff == 0.0 and same_records
    return Check("resume", "pass" if ok else "fail",
                 f"4 steps vs resumed at step 2: final weights max |difference| {diff:.1e} (tolerance 0), "
                 f"steps 3-4 records {'identical' if same_records else 'DIFFER'}",
                 {"max_abs_difference": diff, "records_identical": same_records, "tolerance": 0.0})


# ----------------------------------------------------------------------------- memory

def preset_model_dir(out: Path) -> Path:
    """A random-weight model of PRESET's shape with the shipped tokenizer (ids past it decode to nothing)."""
    from mlx_lm.utils import save_config, save_model

    from .models import DEFAULT_MODEL_DIR
    from .presets import preset_config, preset_model

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

    from .workload import Workload
    from .models import resolve_dtype
    from .fitting import read_model_shape
    from .plan import MemorySettings, Shapes, predict

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
        rows[phase] = {"measured_bytes": float(have), "planned_bytes": want, "planned_over_measured": want / float(have)}
        ok &= PLAN_BAND[0] <= want / float(have) <= PLAN_BAND[1]
    text = ", ".join(f"{p} {r['measured_bytes'] / 2**20:.0f}/{r['planned_bytes'] / 2**20:.0f} MiB" for p, r in rows.items())
    return Check("memory_plan", "pass" if ok else "fail",
                 f"{PRESET} ({PRESET_LAYERS} layers) measured/planned peak: {text} (pass: planned within "
                 f"{PLAN_BAND[0]:g}-{PLAN_BAND[1]:g}x measured)", rows), work


def check_rollout_flat(work) -> Check:
    """The rollout's peak above its KV cache, at T and 8T new tokens: it must not grow with T."""
    import mlx.core as mx

    from .benchmark import kv_bytes_per_token
    from .trainer import step_key

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
    return Check("rollout_flat", "pass" if growth <= FLAT_GROWTH else "fail",
                 f"rollout peak above its KV cache, 8 vs 64 new tokens: {above[8] / 2**20:.1f} -> "
                 f"{above[64] / 2**20:.1f} MiB ({growth:+.1%}, tolerance +{FLAT_GROWTH:.0%})",
                 {"above_kv_bytes": above, "growth": growth, "tolerance": FLAT_GROWTH})


# ----------------------------------------------------------------------------- learning and speed

def check_learning(base_dir: Path, work: Path) -> Check:
    from .config import load_config
    from .run import train

    config = load_config(None, {"num_steps": LEARNING_STEPS, "eval_every": LEARNING_STEPS, "wandb": False,
                                "monitoring_dir": str(work / "runs"), "run_name": "learning"})
    start = time.perf_counter()
    run = Path(train(config, base_dir)["run_dir"])
    seconds = time.perf_counter() - start
    accuracy = [r[EVAL_ACCURACY] for r in map(json.loads, RunPaths(run).metrics.read_text().splitlines())
                if EVAL_ACCURACY in r]
    gain = float(perturbed("learning", np.array(accuracy[-1] - accuracy[0])))
    want = LEARNING_SHARE * REFERENCE_GAIN
    return Check("learning", "pass" if gain >= want else "fail",
                 f"default config, {LEARNING_STEPS} steps: held-out {accuracy[0]:.0%} -> {accuracy[-1]:.0%} "
                 f"({gain * 100:+.0f} points; ours {REFERENCE_GAIN * 100:+.0f}, pass at >= {want * 100:+.0f}) in "
                 f"{seconds:.0f} s", {"first": accuracy[0], "last": accuracy[-1], "gain": gain,
                                      "reference_gain": REFERENCE_GAIN, "seconds": seconds})


def check_bench(base_dir: Path) -> Check:
    from .benchmark import BenchOptions, run_bench
    from .config import load_config

    report = run_bench(BenchOptions(load_config(), base_dir, repetitions=2, warmup=1, memory=False))
    goals = {g["name"]: {"measured": g["measured"], "target": g["target"], "met": g["met"]} for g in report["goals"]}
    ratios = {name: r.get("median") for name, r in report["ratios"].items() if isinstance(r, dict)}
    missed = [name for name, g in goals.items() if g["met"] is False]
    text = ", ".join(f"{n} {g['measured']:.2f}" for n, g in goals.items() if g["measured"] is not None)
    load, cores = (os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0), os.cpu_count() or 1
    measured = {"goals": goals, "ratios": ratios, "load_average": load}
    if missed and load > cores:
        return Check("bench", "skip", f"goals missed ({', '.join(missed)}) with the machine busy (load {load:.1f} "
                     f"on {cores} cores): ratios recorded, not judged; {text}", measured)
    return Check("bench", "fail" if missed else "pass",
                 f"bench goals {'missed: ' + ', '.join(missed) if missed else 'met'}; {text}", measured)


# ----------------------------------------------------------------------------- the whole test

CHECKS = ("shared_prompts", "chunked_head", "micro_batches", "resume", "memory_plan", "rollout_flat", "learning",
          "bench")


def run_selftest(base_dir: Path, skip: set[str] = frozenset(), say: Callable[[str], None] = print) -> dict:
    """Every check in order; a check that raises fails with its error (the others still run)."""
    from .trainer import Trainer

    started = time.perf_counter()
    env = environment()
    results: list[Check] = []
    with tempfile.TemporaryDirectory(prefix="mlx-grpo-selftest-") as tmp:
        work = Path(tmp)
        state: dict[str, Any] = {}

        def prepare_batch() -> tuple:
            if "batch" not in state:
                trainer = Trainer.build(small_config(), base_dir)
                state["trainer"], (state["batch"], state["advantages"]) = trainer, sample_batch(trainer)
            return state["trainer"], state["batch"], state["advantages"]

        def plan_and_flat(name: str) -> Check:
            if "plan" not in state:
                state["plan"], state["work"] = check_plan(base_dir, preset_model_dir(work / "preset"))
            return state["plan"] if name == "memory_plan" else check_rollout_flat(state["work"])

        runners: dict[str, Callable[[], Check]] = {
            "shared_prompts": lambda: check_shared_prompts(*prepare_batch()[:2]),
            "chunked_head": lambda: check_chunked_head(*prepare_batch()[:2]),
            "micro_batches": lambda: check_micro_batches(base_dir, *prepare_batch()[1:]),
            "resume": lambda: check_resume(base_dir, work),
            "memory_plan": lambda: plan_and_flat("memory_plan"),
            "rollout_flat": lambda: plan_and_flat("rollout_flat"),
            "learning": lambda: check_learning(base_dir, work),
            "bench": lambda: check_bench(base_dir),
        }
        for name in CHECKS:
            start = time.perf_counter()
            if name in skip:
                check = Check(name, "skip", "skipped by --skip")
            else:
                try:
                    check = runners[name]()
                except Exception as err:  # noqa: BLE001 - a check that crashes is a failed check, reported
                    check = Check(name, "fail", f"raised {type(err).__name__}: {(str(err).splitlines() or [''])[0]}")
            check.seconds = round(time.perf_counter() - start, 1)
            results.append(check)
            say(summary_line(check))
    report = {"schema": "mlx-grpo-selftest/1", "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "environment": env, "checks": [asdict(c) for c in results],
              "passed": all(c.status != "fail" for c in results), "seconds": round(time.perf_counter() - started, 1)}
    report["summary"] = summary(report)
    return report


def summary_line(check: Check) -> str:
    return f"{check.status.upper():<5} {check.name:<15} {check.detail}  [{check.seconds:.0f} s]"


def summary(report: dict) -> list[str]:
    env = report["environment"]
    gib = lambda n: f"{n / 2**30:.1f} GiB" if n else "n/a"  # noqa: E731
    lines = [
        f"mlx-grpo selftest {report['created']}: {'PASSED' if report['passed'] else 'FAILED'} in {report['seconds']:.0f} s",
        f"machine  {env['chip']}, GPU cores {env['gpu_cores'] or 'n/a'}, memory {gib(env['memory_bytes'])}, "
        f"working set {gib(env['working_set_bytes'])}, wired limit {gib(env['wired_limit_bytes'])}, "
        f"{'macOS ' + env['macos'] if env['macos'] else env['os']}, load {env['load_average']} on {env['cores']} cores",
        f"versions mlx {env['mlx']}, mlx-lm {env['mlx_lm']}, mlx-grpo {env['mlx_grpo']}, python {env['python']}; "
        f"backend {env['backend']}",
    ]
    lines += [summary_line(Check(**c)) for c in report["checks"]]
    return lines
