"""Throughput of the trainer's own paths, each next to the best plain MLX can do on the same shapes.

Every measured path runs once per repetition, interleaved with the others, so a
slow moment on a busy machine hits all of them alike; ratios are taken within a
repetition and then summarised (median, min, max). Warm-up repetitions compile
kernels and fill allocator caches and are not reported.

Shapes are fixed so paths are comparable: `batch_size` prompts of exactly
`prompt_length` random non-special token ids, `group_size` completions each, and
every completion runs to exactly `completion_length` tokens (EOS is not honoured:
a batch that stops early would make token counts differ between paths).

Paths (names used in the JSON report, docs/bench_schema.json):
  rollout             mlx_grpo.rollout.generate: the trainer's batched KV-cache sampler
  rollout_ceiling     a minimal hand-written batched KV-cache decode (prefill shared per group)
  rollout_sequential  the same decode, one sequence at a time (timed on a sample of sequences)
  reward              decode to text, every configured reward function, group advantages
  reference           reference-policy log-probs for the KL term (only when beta > 0)
  update              the trainer's update_policy: GRPO loss, value_and_grad, clipping, AdamW step
  update_ceiling      a bare value_and_grad + AdamW loop: masked cross-entropy on the same tokens
  step                Trainer.step, as `mlx-grpo train` runs it: prompts, rollout, rewards,
                      advantages, reference, update, metric record
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache

from ..common.errors import UserError
from ..config.train_config import TrainConfig
from ..frozen_prefix import first_block
from ..head_scores import block_exponentials, streams_head
from ..models.families import entropy_stride, vocab_block
from ..models.policy import count_parameters, lm_head, resolve_dtype
from ..planning import chips, roofline
from ..planning.fitting import read_model_shape
from ..planning.machine import describe, matmul_peak_flops, stream_gb_s
from ..planning.plan import dtype_bytes
from ..trainer import step_key
from ..update import build_train_batch, shares_prompts
from .bench_report import build_report
from .workload import Workload, decode_ceiling, make_update_ceiling

PATHS = ("rollout", "rollout_ceiling", "rollout_sequential", "reward", "reference", "update",
         "update_ceiling", "step")
# The trainer's own phase timers (StepData.seconds), read back from each step.
MEMORY_BETA = 0.04  # the KL weight the memory comparison uses when the benchmarked run has beta = 0


@dataclass
class BenchOptions:
    config: TrainConfig  # model, dtype, LoRA, beta, batch_size, num_generations, max_generation_steps...
    base_dir: Path = field(default_factory=Path.cwd)
    prompt_length: int = 9  # the default task's prompts: BOS + "047+302="
    repetitions: int = 5
    warmup: int = 1
    sequential_sample: int = 8  # sequences timed one at a time; tokens/s does not depend on how many
    paths: tuple[str, ...] = PATHS
    memory: bool = True

    def validate(self) -> None:
        checks = [
            ("--prompt-length", self.prompt_length >= 1, "at least 1"),
            ("--repetitions", self.repetitions >= 1, "at least 1"),
            ("--warmup", self.warmup >= 0, "non-negative"),
            ("--sequential-sample", self.sequential_sample >= 1, "at least 1"),
        ]
        for flag, ok, expected in checks:
            if not ok:
                raise UserError(f"bench: {flag} must be {expected}")
        unknown = [p for p in self.paths if p not in PATHS]
        if unknown:
            raise UserError(f"bench: unknown path '{unknown[0]}' in --only; choose from {', '.join(PATHS)}")


# ----------------------------------------------------------------------------- measuring

def time_interleaved(runners: dict[str, Callable[[int], None]], repetitions: int,
                     warmup: int) -> dict[str, list[float]]:
    """Seconds per call of each runner, warm-up excluded; runners take the repetition index."""
    samples: dict[str, list[float]] = {name: [] for name in runners}
    for rep in range(warmup + repetitions):
        for name, run in runners.items():
            gc.collect()  # a collection inside a timed call would be charged to it
            start = time.perf_counter()
            run(rep)
            seconds = time.perf_counter() - start
            if rep >= warmup:
                samples[name].append(seconds)
    return samples


def weight_bytes(model: nn.Module) -> int:
    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))


def kv_bytes_per_token(model: nn.Module) -> int:
    """Bytes of keys and values one sequence stores per token, read back at every later decode step."""
    cache = make_prompt_cache(model)
    mx.eval(model(mx.zeros((1, 1), dtype=mx.int32), cache=cache))
    # The buffers are allocated ahead in blocks; their size over their length is the cost of one token.
    return sum(layer.keys.nbytes // layer.keys.shape[2] + layer.values.nbytes // layer.values.shape[2]
               for layer in cache)


def bandwidth_report(rollout_tokens_per_s: float | None, model: nn.Module, sequences: int, prompt_length: int,
                     completion_length: int, chip: chips.Chip | None) -> dict | None:
    """Generation speed as a share of the chip's memory-bandwidth ceiling (Apple Silicon only)."""
    if chip is None or rollout_tokens_per_s is None:
        return None
    mean_context = prompt_length + completion_length / 2
    kv_per_sequence = kv_bytes_per_token(model) * mean_context
    weights = weight_bytes(model)
    ceiling = chips.decode_ceiling_tokens_per_s(chip.bandwidth_gb_s, sequences, weights, kv_per_sequence)
    return {
        "chip": chip.name,
        "bandwidth_gb_s": chip.bandwidth_gb_s,
        "source": chip.source,
        "bytes_per_step": int(weights + sequences * kv_per_sequence),
        "ceiling_tokens_per_s": ceiling,
        "percent_of_ceiling": 100.0 * rollout_tokens_per_s / ceiling,
    }


def phase_work(work: Workload, options: BenchOptions) -> dict[str, roofline.Work]:
    """The floating-point work (and decode's memory reads) of each timed path, from the model's shape."""
    config = work.config
    shape = read_model_shape(config.model_id, options.base_dir)
    B, N, p, T = config.batch_size, work.sequences, options.prompt_length, config.max_generation_steps
    shared = shares_prompts(work.model, work.batch)
    training = roofline.Training(config.use_lora, config.lora_rank, config.lora_layers,
                                 work.batch.prefix is not None and first_block(work.model) > 0)
    phases = roofline.step_work(shape, training, B, N, p, T, -(-T // entropy_stride(T)), config.num_iterations,
                                work.reference is not None, shared, dtype_bytes(resolve_dtype(config)))
    return {**phases, "rollout_ceiling": phases["rollout"], "step": sum(phases.values(), roofline.Work(0.0))}


def machine_limits(chip: chips.Chip | None) -> tuple[roofline.Limits, str]:
    """The roofline's two ceilings: fp32 matmul FLOP/s (`machine.matmul_peak_flops`, as perf/mfu takes it),
    and memory bandwidth: the chip's published peak on Apple Silicon, elsewhere measured by streaming a
    256 MB matrix through a matmul of 8 rows (what a decode step does to the weights)."""
    peak = matmul_peak_flops()
    if chip is not None:
        return roofline.Limits(peak, chip.bandwidth_gb_s * 1e9), f"{chip.name}'s published peak"
    return roofline.Limits(peak, stream_gb_s() * 1e9), "measured: 8-row matmul over a 256 MB matrix"


def vocabulary_costs(positions: int, hidden: int, repeats: int = 5) -> dict:
    """Seconds per logit of the streamed head's work over the vocabulary besides its matmul (the running
    maximum, the softmax's exponentials, their sum: elementwise work the FLOP count leaves out), and of the
    head matmul itself, timed on one block of the shape the streamed head uses (`positions` scored at once),
    best of `repeats`."""
    block = vocab_block(positions, hidden)
    h, w = mx.random.normal((positions, hidden)), mx.random.normal((block, hidden))
    logits = h @ w.T
    mx.eval(h, w, logits)

    def elementwise(traced: bool = False):
        return block_exponentials(logits, None, traced)[2]

    def best(run: Callable[[], mx.array]) -> float:
        mx.eval(run())
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            mx.eval(run())
            times.append(time.perf_counter() - start)
        return min(times) / (positions * block)

    return {"block": [positions, block], "seconds_per_logit": best(elementwise),
            "update_seconds_per_logit": best(lambda: elementwise(traced=True)),
            "matmul_seconds_per_logit": best(lambda: h @ w.T)}


def vocabulary_shares(costs: dict, paths: dict, logits: dict[str, float], peak: float) -> dict:
    """For the reference and update paths: the seconds their vocabulary sweeps take at the measured cost per
    logit, and the share of the matmul peak of the rest of the path's time: which bound holds."""
    out = {}
    for name, count in logits.items():
        if name in paths:
            path = paths[name]
            # under mx.grad the update's sweep runs its operations one at a time (head_scores.shifted_exp)
            seconds = count * costs["update_seconds_per_logit" if name == "update" else "seconds_per_logit"]
            rest = path["seconds"] - seconds
            out[name] = {"logits": count, "seconds": seconds,
                         "share_of_peak_without": path["flops"] / rest / peak if rest > 0 and peak > 0 else 0.0}
    return {**costs, "paths": out}


def roofline_report(measured: dict, phases: dict[str, roofline.Work], limits: roofline.Limits,
                    bandwidth_source: str, pass_flops: float, vocabulary: tuple[dict, dict] | None = None) -> dict:
    """Each measured path's work, achieved FLOP/s and share of the machine's ceilings (median time); with
    `vocabulary` ((costs, logits per path)), the share the head's sweeps over the vocabulary take."""
    paths = {name: roofline.share(phases[name], statistics.median(measured[name]["seconds"]), limits)
             for name in PATHS if name in phases and name in measured}
    report = {
        "peak_flops_per_s": limits.flops_per_s,
        "bandwidth_bytes_per_s": limits.bytes_per_s,
        "bandwidth_source": bandwidth_source,
        "update_pass_flops": pass_flops,
        "paths": paths,
        "floor_seconds": roofline.floor_seconds({name: phases[name] for name in ("rollout", "reference", "update")
                                                 if name in phases}, limits),
    }
    if vocabulary is not None:
        report["vocabulary"] = vocabulary_shares(vocabulary[0], paths, vocabulary[1], limits.flops_per_s)
    return report


def measure_paths(options: BenchOptions) -> tuple[dict, dict, dict | None, dict]:
    """(settings block, per-path samples in seconds with token counts, bandwidth block, roofline block)."""
    config = options.config
    work = Workload(config, options.base_dir, options.prompt_length)
    n_sequential = min(options.sequential_sample, work.sequences)
    measured = time_paths(work, options, n_sequential)
    settings = bench_settings(work, options, n_sequential)
    rollout_tps = None
    if "rollout" in measured:
        rollout_tps = measured["rollout"]["tokens"] / statistics.median(measured["rollout"]["seconds"])
    chip = chips.this_chip()
    bandwidth = bandwidth_report(rollout_tps, work.model, work.sequences, options.prompt_length,
                                 config.max_generation_steps, chip)
    return settings, measured, bandwidth, path_roofline(work, options, measured, chip)


def time_paths(work: Workload, options: BenchOptions, n_sequential: int) -> dict:
    """Each chosen path's samples in seconds and its token count, timed interleaved; the whole step's phases
    and peaks too."""
    config, model = options.config, work.model
    prompts = mx.array(work.prompts)
    T, G = config.max_generation_steps, config.num_generations
    prompts = mx.array(work.prompts)
    sequential_rows = [prompts[i % config.batch_size][None] for i in range(n_sequential)]
    update_ceiling = make_update_ceiling(model, work.batch, options.prompt_length, config.learning_rate)

    def sequential(rep: int) -> None:
        model.eval()
        for row in sequential_rows:
            decode_ceiling(model, row, 1, T, config.temperature)

    def ceiling(rep: int) -> None:
        model.eval()
        decode_ceiling(model, prompts, G, T, config.temperature)

    step_phases: list[dict[str, float]] = []
    step_peaks: list[dict[str, float]] = []

    def step(rep: int) -> None:
        phases, peaks = work.step(1000 + rep)
        if rep >= options.warmup:
            step_phases.append(phases)
            step_peaks.append(peaks)

    runners: dict[str, tuple[Callable[[int], None], int]] = {
        "rollout": (lambda rep: work.rollout(step_key(config.seed, 1 + rep)), work.completion_tokens),
        "rollout_ceiling": (ceiling, work.completion_tokens),
        "rollout_sequential": (sequential, n_sequential * T),
        "reward": (lambda rep: work.rewards(work.batch_rollout), work.completion_tokens),
        "reference": (lambda rep: work.trainer.reference_logprobs(work.batch), work.completion_tokens),
        "update": (lambda rep: work.update(work.batch, work.advantages, work.ref_logp),
                   work.completion_tokens * config.num_iterations),
        "update_ceiling": (lambda rep: update_ceiling(), work.completion_tokens),
        "step": (step, work.completion_tokens),
    }
    if work.reference is None:
        del runners["reference"]
    chosen = {name: runners[name] for name in PATHS if name in runners and name in options.paths}
    samples = time_interleaved({name: run for name, (run, _) in chosen.items()}, options.repetitions, options.warmup)
    measured = {name: {"tokens": tokens, "seconds": samples[name]} for name, (_, tokens) in chosen.items()}
    if "step" in measured:
        measured["step"]["phases"] = step_phases
        # each phase's peak (its KV cache, activations and logits on top of the weights), the worst repetition
        measured["step"]["peak_memory_bytes"] = {name: max(p[name] for p in step_peaks) for name in step_peaks[0]}

    return measured


def bench_settings(work: Workload, options: BenchOptions, n_sequential: int) -> dict:
    config, model = options.config, work.model
    T, G = config.max_generation_steps, config.num_generations
    total, trainable = count_parameters(model)
    settings = {
        "model": config.model_id,
        "parameters": total,
        "trainable_parameters": trainable,
        "dtype": resolve_dtype(config),
        "use_lora": config.use_lora,
        "beta": config.beta,
        "batch_size": config.batch_size,
        "group_size": G,
        "sequences": work.sequences,
        "prompt_length": options.prompt_length,
        "completion_length": T,
        "temperature": config.temperature,
        "loss_type": config.loss_type,
        "num_iterations": config.num_iterations,
        "repetitions": options.repetitions,
        "warmup": options.warmup,
        "sequential_sample": n_sequential,
        "weight_bytes": weight_bytes(model),
        "wired_limit_bytes": work.wired_limit,
    }
    return settings


def path_roofline(work: Workload, options: BenchOptions, measured: dict, chip: chips.Chip | None) -> dict:
    """The roofline block: each measured path against what this machine's compute and bandwidth allow."""
    config, model, T = options.config, work.model, options.config.max_generation_steps
    phases = phase_work(work, options)
    limits, source = machine_limits(chip)
    resolved = work.trainer.config.micro_batch_size  # `auto` resolved by the trainer's plan
    micro = resolved if isinstance(resolved, int) and resolved > 0 else work.sequences
    pass_flops = phases["update"].flops / config.num_iterations * min(1.0, micro / work.sequences)
    vocabulary = None
    if streams_head(lm_head(model)) and {"reference", "update"} & set(measured):
        # the streamed head scores a micro-batch's completion positions at once, one vocabulary sweep each
        shape = read_model_shape(config.model_id, options.base_dir)
        sweep = work.sequences * T * shape.vocab
        costs = vocabulary_costs(min(micro, work.sequences) * T, shape.hidden)
        vocabulary = (costs, {"reference": sweep, "update": sweep * config.num_iterations})
    return roofline_report(measured, phases, limits, source, pass_flops, vocabulary)


def measure_memory(options: BenchOptions) -> dict:
    """Peak memory of one whole LoRA step with the KL term against one without it.

    Under LoRA the reference is the same model with its adapters switched off, so the
    KL term should cost activations only, never a second copy of the weights. The
    peak of the training phase alone (reference + update) is kept too: the rollout's
    KV cache often sets the step's peak and would hide what the KL term costs.
    """
    beta = options.config.beta if options.config.beta > 0 else MEMORY_BETA
    step_peaks, train_peaks = {}, {}
    for b in (0.0, beta):
        config = replace(options.config, use_lora=True, beta=b)
        work = Workload(config, options.base_dir, options.prompt_length)
        work.step(1)  # warm-up: kernels and allocator caches (its timers and peaks are not used)
        gc.collect()
        mx.clear_cache()
        mx.reset_peak_memory()
        rollout = work.rollout(step_key(config.seed, 2))
        advantages = work.rewards(rollout)
        batch = build_train_batch(rollout, work.trainer.policy.pad_id)
        del rollout
        rollout_peak = mx.get_peak_memory()
        mx.reset_peak_memory()
        work.update(batch, advantages, work.trainer.reference_logprobs(batch))
        train_peaks[b] = mx.get_peak_memory()
        step_peaks[b] = max(rollout_peak, train_peaks[b])
        del work, batch, advantages
        gc.collect()
        mx.clear_cache()
    return {
        "beta": beta,
        "lora_beta0_peak_bytes": step_peaks[0.0],
        "lora_beta_peak_bytes": step_peaks[beta],
        "ratio": step_peaks[beta] / step_peaks[0.0],
        "lora_beta0_train_peak_bytes": train_peaks[0.0],
        "lora_beta_train_peak_bytes": train_peaks[beta],
        "train_ratio": train_peaks[beta] / train_peaks[0.0],
    }


def run_bench(options: BenchOptions) -> dict:
    """Measure everything `options` asks for; return the report (the JSON document)."""
    options.validate()
    start = time.perf_counter()
    machine = describe().to_dict()
    settings, measured, bandwidth, roof = measure_paths(options)
    gc.collect()
    mx.clear_cache()  # the measured workload is gone; the memory runs start from a clean allocator
    memory = measure_memory(options) if options.memory else None
    return build_report(settings, measured, memory, bandwidth, machine, time.perf_counter() - start, roof)
