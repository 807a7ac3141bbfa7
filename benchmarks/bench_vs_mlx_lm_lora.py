"""mlx-grpo against mlx-lm-lora on the same GRPO recipe: seconds per step, peak memory, held-out accuracy.

Both tools train the same model directory with the same data, rewards, group size, completion length,
learning rate and its schedule (mlx-grpo's optimizer), KL coefficient (mlx-lm-lora gets a second copy of
the model as its reference when beta is not 0), LoRA rank/scale/layers and one update per rollout
(configs/smollm2_sums.yaml by default), each in its own process, one after the other; then each trained
model is scored by the same greedy held-out check (`mlx_grpo.evaluate`, what `mlx-grpo eval` runs).
mlx-lm-lora is not a dependency:

    pip install "mlx-lm-lora>=5.10,<5.11"
    python benchmarks/bench_vs_mlx_lm_lora.py --steps 5 --model-id /path/to/hf-dir

--model-id is a Hugging Face-format directory that both tools load. Without it, the recipe's own model
(a GGUF file or a named model such as `gemma3-270m`, which mlx-lm-lora cannot read) is loaded once by
mlx-grpo's loader, its base dequantized, and written as a float32 Hugging Face directory in --workdir;
greedy held-out accuracy of that untrained model is printed as the "before" figure. --peer-python runs
mlx-lm-lora from its own environment (it needs mlx-grpo importable too); --wrap runs each training
process (and the conversion) under a command, e.g. `measured` (a machine-wide lock for timed work):

    python benchmarks/bench_vs_mlx_lm_lora.py --config configs/gemma3_subtraction.yaml --steps 30 \
        --peer-python /path/to/venv-with-mlx-lm-lora/bin/python --wrap measured

Prints a table and one JSON object (--out FILE writes it too). Seconds per step are the median of the
steps after the first (the first pays for compilation and warm-up); peak memory is MLX's peak counter
of the process over model load and training (exact on the CPU backend too; mlx-grpo's per-phase resets of
it are undone), max RSS the process's own
over its whole life (training and the held-out check). Both processes run with OpenBLAS preloaded when
it is installed (mlx-grpo's own re-exec). Each step's seconds are also printed beside its longest completion:
the two tools sample different completions; mlx-grpo decodes all of a step's completions together, so its
rollout lasts as long as the longest, and mlx-lm-lora `batch_size` of them at a time, so its lasts about as
long as their total length over `batch_size`. One reply that runs on to the limit in one tool's step and not
in the other's moves that step's figure by more than either tool's speed does.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

if __name__ == "__main__":
    from mlx_grpo.planning.blas import reexec_with_openblas

    # OpenBLAS only helps when preloaded at process start: re-exec once, before MLX loads (the workers
    # below inherit LD_PRELOAD, so both tools get the same BLAS).
    reexec_with_openblas([str(Path(__file__).resolve()), *sys.argv[1:]])

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = ROOT / "configs" / "smollm2_sums.yaml"


def recipe(args: argparse.Namespace):
    from mlx_grpo.config.train_config import load_config

    overrides = {**dict(args.set), "seed": args.seed, "num_steps": args.steps, "eval_every": 0,
                 "checkpoint_every": 0, "tensorboard": False, "enable_alerts": False}
    if args.model_id:
        overrides["model_id"] = args.model_id
    return load_config(str(args.config), overrides)


def heldout(config, base_dir: Path, model, tokenizer, limit: int | None) -> dict:
    """Greedy held-out accuracy by the trainer's own check."""
    from mlx_grpo.data import load_datasets
    from mlx_grpo.evaluate import evaluate
    from mlx_grpo.models.policy import stop_ids
    from mlx_grpo.rewards.correctness import load_correctness

    check = load_correctness(config.correctness, config.dataset, [spec.name for spec in config.rewards], base_dir)
    rows = load_datasets(config, base_dir)[1][:limit]
    eos_ids, pad_id = stop_ids(tokenizer)
    model.eval()
    result = evaluate(model, tokenizer, rows, config, eos_ids, pad_id, check=check)
    return {"heldout_accuracy": result.accuracy, "heldout_rows": len(rows)}


# ------------------------------------------------------------------ workers (one process each)


def run_ours(args: argparse.Namespace) -> dict:
    import mlx.core as mx

    from mlx_grpo.run.export import load_trained
    from mlx_grpo.run.loop import train

    config = recipe(args)
    base_dir = args.config.resolve().parent
    config.run_name, config.monitoring_dir = f"bench-mlx-grpo-seed{args.seed}", args.workdir
    # The trainer resets MLX's peak counter at each phase (its per-phase peaks): keep each reset's peak, so
    # the figure is the whole process's, as mlx-lm-lora's (which never resets it) is.
    peaks, reset = [], mx.reset_peak_memory

    def reset_keeping_peak():
        peaks.append(mx.get_peak_memory())
        reset()

    mx.reset_peak_memory = reset_keeping_peak
    started, cpu = time.perf_counter(), time.process_time()
    run_dir = Path(train(config, base_dir)["run_dir"])
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    mx.reset_peak_memory = reset
    peak = max([mx.get_peak_memory(), *peaks]) / 1e9
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # The run's final checkpoint, as `mlx-grpo eval RUN_DIR` loads it.
    trained = load_trained(run_dir)
    steps = [r for r in records if "timing/step_s" in r]
    out = {"step_seconds": [r["timing/step_s"] for r in steps],
           "rollout_seconds": [r["timing/rollout_s"] for r in steps],
           "completion_tokens": [r["completions/length/mean"] for r in steps],
           "longest_completion": [r["completions/length/max"] for r in steps],
           "update_seconds": [r.get("timing/ref_s", 0.0) + r["timing/update_s"] for r in steps], "peak_gb": peak,
           "train_wall_s": wall, "train_cpu_s": cpu, "run_dir": str(run_dir), "checkpoint": str(trained.checkpoint)}
    out.update(heldout(config, base_dir, trained.model, trained.tokenizer, args.limit))
    return out


def run_mlx_lm_lora(args: argparse.Namespace) -> dict:
    import mlx.core as mx
    import numpy as np
    from mlx_lm import load
    from mlx_lm.tuner.callbacks import TrainingCallback
    from mlx_lm.tuner.utils import linear_to_lora_layers
    from mlx_lm_lora.trainer import grpo_trainer
    from mlx_lm_lora.trainer.datasets import GRPODataset
    from mlx_lm_lora.trainer.grpo_trainer import GRPOTrainingArgs, train_grpo
    from phase_timer import timed_phase

    from mlx_grpo.data import encode_prompt, load_datasets, render_prompt
    from mlx_grpo.rewards.loading import load_reward_functions
    from mlx_grpo.trainer import make_optimizer

    config = recipe(args)
    base_dir = args.config.resolve().parent
    mx.random.seed(config.seed)
    np.random.seed(config.seed)
    model, tokenizer = load(str(Path(config.model_id).expanduser()))
    model.freeze()
    linear_to_lora_layers(model, config.lora_layers, {"rank": config.lora_rank, "dropout": config.lora_dropout,
                                                      "scale": config.lora_alpha / config.lora_rank,
                                                      "keys": config.lora_keys})

    train_rows, _ = load_datasets(config, base_dir)
    if config.use_chat_template and getattr(tokenizer, "chat_template", None):
        # mlx-lm-lora always sends a system message; give it the one the chat template adds by itself, so
        # both tools see the same prompt tokens (checked below).
        system = config.system_prompt or _template_default_system(tokenizer)
        dataset = GRPODataset([{"prompt": r["prompt"], "answer": r["answer"], "system": system}
                               for r in train_rows], tokenizer)
    else:  # a base model's document: mlx-lm-lora encodes the text as mlx-grpo renders it
        dataset = GRPODataset([{"prompt": r["prompt"], "answer": r["answer"],
                                "text": render_prompt(tokenizer, r["prompt"], config.system_prompt, False)}
                               for r in train_rows], tokenizer, text_completion_key="text")
    ours = encode_prompt(tokenizer, train_rows[0]["prompt"], config).tokens
    if list(dataset[0][0]) != ours:
        raise SystemExit("mlx-lm-lora's prompt tokens differ from mlx-grpo's; the comparison would not be fair")

    lengths, longest = [], []  # each step's mean and longest completion in tokens, as its first reward sees them

    def wrap(function, first):
        def reward(prompts, completions, answer, types=None):
            if first:
                counts = [len(tokenizer.encode(c, add_special_tokens=False)) for c in completions]
                lengths.append(statistics.mean(counts))
                longest.append(max(counts))
            return function.fn(prompts, completions, answer)

        reward.__name__ = function.name
        return reward

    class Timer(TrainingCallback):
        def __init__(self):
            self.step_seconds, self.last = [], None

        def on_train_loss_report(self, info):
            now = time.perf_counter()
            self.step_seconds.append(now - self.last)
            self.last = now

    timer = Timer()
    phases = {"rollout": [], "update": []}

    # train_grpo looks these up in its module at each call
    grpo_trainer.generate_grpo = timed_phase(phases["rollout"], grpo_trainer.generate_grpo)
    grpo_trainer._grpo_value_and_grad = timed_phase(phases["update"], grpo_trainer._grpo_value_and_grad)
    training_args = GRPOTrainingArgs(
        batch_size=config.batch_size, iters=config.num_steps, group_size=config.num_generations,
        beta=config.beta, epsilon=config.epsilon, max_completion_length=config.max_generation_steps,
        temperature=config.temperature, top_p=config.top_p, top_k=config.top_k, min_p=config.min_p,
        grpo_loss_type=config.loss_type, importance_sampling_level=config.importance_sampling_level,
        steps_per_report=1, steps_per_eval=10**9, steps_per_save=10**9,
        max_seq_length=config.max_prompt_length + config.max_generation_steps,
        adapter_file=str(Path(args.workdir) / "mlx-lm-lora-adapters.safetensors"),
        reward_weights=[spec.weight for spec in config.rewards])
    rewards = load_reward_functions([(spec.name, spec.weight) for spec in config.rewards], base_dir)
    optimizer = make_optimizer(config)  # the same AdamW and schedule as ours, one update a step in both
    # With a KL term mlx-lm-lora needs a second copy of the model as its reference (without one it computes no
    # KL); ours is the same weights with the adapters off.
    ref_model = None
    if config.beta:
        ref_model, _ = load(str(Path(config.model_id).expanduser()))
        ref_model.freeze()
    started, cpu = time.perf_counter(), time.process_time()
    timer.last = started
    train_grpo(model=model, ref_model=ref_model, tokenizer=tokenizer, optimizer=optimizer, train_dataset=dataset,
               val_dataset=None, reward_funcs=[wrap(function, i == 0) for i, function in enumerate(rewards)],
               args=training_args,
               training_callback=timer, end_answer_token="")
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    peak = mx.get_peak_memory() / 1e9
    out = {"step_seconds": timer.step_seconds, "rollout_seconds": phases["rollout"], "completion_tokens": lengths,
           "longest_completion": longest,
           "update_seconds": phases["update"], "peak_gb": peak, "train_wall_s": wall, "train_cpu_s": cpu,
           "versions": {name: version(name) for name in ("mlx", "mlx-lm", "mlx-lm-lora")}}
    out.update(heldout(config, base_dir, model, tokenizer, args.limit))
    return out


def write_model(args: argparse.Namespace) -> dict:
    """The recipe's model as mlx-grpo loads it (base dequantized, float32 on the CPU), written as a Hugging
    Face directory for both tools, and its greedy held-out accuracy before training."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from mlx_grpo.models.policy import dequantize_base, load_policy
    from mlx_grpo.run.export import write_fused

    config = recipe(args)
    base_dir = args.config.resolve().parent
    model, tokenizer = load_policy(config, base_dir)
    dequantize_base(model, config)
    dtypes = sorted({str(v.dtype) for _, v in tree_flatten(model.parameters()) if mx.issubdtype(v.dtype, mx.floating)})
    out = write_fused(Path(args.workdir) / "model", model, tokenizer, config.model_id, base_dir)
    return {"model_dir": str(out), "dtypes": dtypes, **heldout(config, base_dir, model, tokenizer, args.limit)}


def _template_default_system(tokenizer) -> str | None:
    """The system message a chat template inserts when the conversation has none (SmolLM2's does)."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False)
    marker = "<|im_start|>system\n"
    return text.split(marker, 1)[1].split("<|im_end|>", 1)[0] if marker in text else None


WORKERS = {"mlx-grpo": run_ours, "mlx-lm-lora": run_mlx_lm_lora}
JOBS = {**WORKERS, "write-model": write_model}


# ------------------------------------------------------------------ driver


def summary(result: dict) -> dict:
    later = result["step_seconds"][1:] or result["step_seconds"]
    steps = len(result["step_seconds"])
    # CPU seconds of the process per step (all threads): less sensitive than wall time to other work on a
    # shared machine.
    return {"s_per_step_median": statistics.median(later),
            "s_per_step_mean_all": statistics.mean(result["step_seconds"]),
            "rollout_s_median": statistics.median(result["rollout_seconds"][1:] or result["rollout_seconds"]),
            "update_s_median": statistics.median(result["update_seconds"][1:] or result["update_seconds"]),
            "completion_tokens_mean": statistics.mean(result["completion_tokens"]),
            "cpu_s_per_step": result["train_cpu_s"] / steps, "peak_gb": result["peak_gb"],
            "max_rss_gb": result["max_rss_gb"], "heldout_accuracy": result["heldout_accuracy"]}


def uptime() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def main() -> int:
    from mlx_grpo.config.typed_yaml import parse_override

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--model-id", default=None, help="the HF-format model directory (both tools load it)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tools", nargs="+", default=list(WORKERS), choices=list(WORKERS))
    parser.add_argument("--workdir", default=None, help="where run directories and adapters go (default: a temp dir)")
    parser.add_argument("--limit", type=int, default=None, help="score only the first N held-out rows (smoke tests)")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON result here")
    parser.add_argument("--peer-python", default=sys.executable,
                        help="the Python that runs mlx-lm-lora (it needs mlx-grpo importable too)")
    parser.add_argument("--wrap", default="", help="a command to run each training process under, e.g. 'measured'")
    parser.add_argument("--set", action="append", type=parse_override, default=[], metavar="KEY=VALUE",
                        help="change one recipe key for both tools (a YAML value), e.g. --set max_generation_steps=512")
    parser.add_argument("--worker", choices=list(JOBS), help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        result = JOBS[args.worker](args)
        result["max_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # Linux: KB
        print("RESULT " + json.dumps(result), flush=True)
        return 0

    workdir = args.workdir or tempfile.mkdtemp(prefix="bench-vs-mlx-lm-lora-")
    Path(workdir).mkdir(parents=True, exist_ok=True)
    before = None
    model_id = Path(recipe(args).model_id).expanduser()
    if not args.model_id and not (args.config.resolve().parent / model_id / "config.json").is_file():
        print("writing the recipe's model as a float32 Hugging Face directory ...", flush=True)
        # under --wrap too: on a shared machine a low-priority job can wait a long time for the CPU
        before = job(args, "write-model", workdir, sys.executable, args.wrap.split())
        args.model_id = before["model_dir"]
        print(f"  {before['model_dir']} ({', '.join(before['dtypes'])}); held-out accuracy before training: "
              f"{before['heldout_accuracy']:.1%} of {before['heldout_rows']}", flush=True)
    results = {}
    for tool in args.tools:
        load_before = uptime()
        print(f"{tool}: {args.steps} steps (load average {load_before}) ...", flush=True)
        python = args.peer_python if tool == "mlx-lm-lora" else sys.executable
        started = time.strftime("%H:%M:%S", time.gmtime())
        raw = job(args, tool, workdir, python, args.wrap.split())
        results[tool] = {**summary(raw), "raw": raw, "load_average_before": load_before,
                         "load_average_after": uptime(), "started_utc": started}

    import mlx.core as mx

    report = {"steps": args.steps, "seed": args.seed, "config": str(args.config), "set": dict(args.set),
              "model_id": args.model_id,
              "before": before,
              "versions": {name: version(name) for name in ("mlx", "mlx-lm", "mlx-grpo", "mlx-lm-lora")
                           if _installed(name)},
              "machine": f"{platform.machine()} {platform.system()}, {mx.default_device()}", "results": results}
    print(f"\n{'tool':<12} {'s/step (median)':>16} {'rollout s':>9} {'ref+update s':>12} {'CPU s/step':>11} "
          f"{'peak GB':>8} {'max RSS GB':>10} {'held-out acc':>13} {'tokens/completion':>18}")
    for tool, r in results.items():
        print(f"{tool:<12} {r['s_per_step_median']:>16.2f} {r['rollout_s_median']:>9.2f} {r['update_s_median']:>12.2f} "
              f"{r['cpu_s_per_step']:>11.2f} {r['peak_gb']:>8.2f} {r['max_rss_gb']:>10.2f} "
              f"{r['heldout_accuracy']:>12.1%} {r['completion_tokens_mean']:>18.1f}")
    if len(results) == 2:
        ours, theirs = results["mlx-grpo"], results["mlx-lm-lora"]
        report["speedup"] = theirs["s_per_step_median"] / ours["s_per_step_median"]
        report["speedup_cpu"] = theirs["cpu_s_per_step"] / ours["cpu_s_per_step"]
        print(f"mlx-grpo is {report['speedup']:.2f}x faster per step ({report['speedup_cpu']:.2f}x in CPU seconds)")
    # A batched rollout lasts as long as its longest completion: say which steps had one run long.
    for tool, r in results.items():
        steps = ", ".join(f"{seconds:.0f} s ({longest})" for seconds, longest in
                          zip(r["raw"]["step_seconds"], r["raw"]["longest_completion"]))
        print(f"{tool}: each step, seconds (its longest completion in tokens): {steps}")
    print(json.dumps(report, indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


def job(args: argparse.Namespace, name: str, workdir: str, python: str, wrap: list[str]) -> dict:
    """Run one worker in a fresh process (under `wrap`) and return its RESULT line."""
    command = [*wrap, python, str(Path(__file__).resolve()), "--worker", name, "--config", str(args.config),
               "--steps", str(args.steps), "--seed", str(args.seed), "--workdir", workdir]
    if args.limit:
        command += ["--limit", str(args.limit)]
    for key, value in args.set:
        command += ["--set", f"{key}={json.dumps(value)}"]
    if args.model_id:
        command += ["--model-id", args.model_id]
    done = subprocess.run(command, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n", file=sys.stderr)
        raise SystemExit(f"{name}: worker failed (exit {done.returncode})")
    return json.loads(lines[-1][len("RESULT "):])


def _installed(name: str) -> bool:
    try:
        version(name)
        return True
    except Exception:
        return False


if __name__ == "__main__":
    raise SystemExit(main())
