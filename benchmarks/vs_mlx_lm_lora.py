"""One GRPO step of mlx-grpo against one of mlx-lm-lora, on the same random-weight model, data and shape.

Issue 28's comparison: a preset (mlx_grpo/presets.py) cut to `--layers` blocks and saved as a model
directory, LoRA r8, `--batch-size` prompts x `--group-size` completions of `--completion` tokens, float32,
OpenBLAS preloaded. Each tool runs in its own fresh process under /usr/bin/time -v (max RSS), the two
alternating `--repetitions` times so that load on a shared machine hits both alike.

- mlx-grpo: `mlx-grpo train ... --num-steps 1`, at its defaults otherwise (plus `--ours-flags`); phase times
  and peaks from its metrics.jsonl (timing/*_s, memory/*_peak_gb).
- mlx-lm-lora (`pip install mlx-lm-lora`, not a dependency of mlx-grpo): its own CLI, `--train-mode grpo
  --iters 1`, with timers around its rollout (`generate_grpo`) and its reference + update
  (`_grpo_value_and_grad`, evaluated); its validation pass is skipped (it is not part of a step). MLX
  peak is mx.get_peak_memory() at exit.

Both tools read the same prompts: the model directory's tokenizer gets a chat template that passes the
user's text through, and every row has an empty system prompt, so neither adds tokens the other lacks.

    python benchmarks/vs_mlx_lm_lora.py --preset qwen2.5-0.5b --layers 2 --completion 256 --repetitions 2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mlx_grpo.blas import find_openblas

CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def prepare(work: Path, preset: str, layers: int, rows: int) -> tuple[Path, Path]:
    """The model directory (with the pass-through chat template) and a data directory with train/valid.jsonl."""
    from mlx_grpo.presets import write_preset_model
    from mlx_grpo.tasks import arithmetic

    model = write_preset_model(preset, layers, work / f"{preset}-L{layers}")
    config_file = model / "tokenizer_config.json"
    tokenizer_config = json.loads(config_file.read_text())
    tokenizer_config["chat_template"] = CHAT_TEMPLATE
    config_file.write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    data = work / "data"
    data.mkdir(exist_ok=True)
    # 20-character prompts (the shipped tokenizer has a token per character): arithmetic rows, repeated
    examples = [{"prompt": (row["prompt"] * 3)[:20], "answer": row["answer"], "system": ""}
                for row in arithmetic.make_split("train", rows, seed=0)]
    for name in ("train", "valid"):
        (data / f"{name}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in examples))
    return model, data


def timed(command: list[str], cwd: Path) -> tuple[str, float, float]:
    """(output, wall seconds, max RSS in GB) of one fresh process with OpenBLAS preloaded."""
    env = dict(os.environ)
    library = find_openblas()
    if library:
        env["LD_PRELOAD"] = library
    start = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-v", *command], cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(command)}\n"
                         f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr).group(1)) * 1024 / 1e9
    return done.stdout + done.stderr, wall, rss


def run_ours(args, model: Path, data: Path, work: Path, rep: int) -> dict:
    name = f"ours-{rep}"
    command = [sys.executable, "-m", "mlx_grpo.cli", "train", "--model-id", str(model),
               "--dataset", str(data / "train.jsonl"), "--use-lora", "--lora-rank", "8",
               "--batch-size", str(args.batch_size), "--num-generations", str(args.group_size),
               "--max-generation-steps", str(args.completion), "--num-steps", "1", "--eval-every", "0",
               "--run-name", name, *args.ours_flags.split()]
    # a run of that name left by an earlier use of --work would make the trainer pick another name
    shutil.rmtree(work / "runs" / name, ignore_errors=True)
    _, wall, rss = timed(command, work)
    record = json.loads((work / "runs" / name / "metrics.jsonl").read_text().splitlines()[-1])
    phases = {p: record.get(f"timing/{p}_s") or 0.0 for p in ("rollout", "reward", "advantage", "ref", "update")}
    peaks = [record.get(f"memory/{p}_peak_gb") or 0.0 for p in ("rollout", "ref", "update")]
    return {"tool": "mlx-grpo", "step_s": sum(phases.values()), "rollout_s": phases["rollout"],
            "train_s": phases["ref"] + phases["update"], "mlx_peak_gb": max(peaks), "max_rss_gb": rss,
            "process_s": wall}


def run_peer(args, model: Path, data: Path, work: Path, rep: int) -> dict:
    command = [sys.executable, __file__, "--peer-inside", "--model", str(model), "--data", str(data),
               "--train", "--train-mode", "grpo", "--train-type", "lora", "--adapter-path", str(work / f"peer-{rep}"),
               "--iters", "1", "--batch-size", str(args.batch_size), "--group-size", str(args.group_size),
               "--max-completion-length", str(args.completion), "--steps-per-report", "1"]
    output, wall, rss = timed(command, work)
    found = json.loads(re.search(r"PEER_TIMES (\{.*\})", output).group(1))
    return {"tool": "mlx-lm-lora", "step_s": found["rollout_s"] + found["rewards_s"] + found["train_s"],
            "rollout_s": found["rollout_s"], "train_s": found["train_s"], "mlx_peak_gb": found["peak_gb"],
            "max_rss_gb": rss, "process_s": wall}


def peer_inside(argv: list[str]) -> None:
    """Inside the mlx-lm-lora process: its own CLI, with timers around the phases of its step."""
    import mlx.core as mx
    from mlx_lm_lora import train
    from mlx_lm_lora.trainer import grpo_trainer

    times = {"rollout_s": 0.0, "rewards_s": 0.0, "train_s": 0.0}

    def timer(name, function):
        def wrapped(*a, **k):
            start = time.perf_counter()
            result = function(*a, **k)
            mx.eval(result)
            times[name] += time.perf_counter() - start
            return result
        return wrapped

    grpo_trainer.generate_grpo = timer("rollout_s", grpo_trainer.generate_grpo)
    grpo_trainer._rollout_rewards = timer("rewards_s", grpo_trainer._rollout_rewards)
    grpo_trainer._grpo_value_and_grad = timer("train_s", grpo_trainer._grpo_value_and_grad)
    grpo_trainer.evaluate_grpo = lambda **kwargs: (0.0, 0, {})  # validation is not part of a training step
    sys.argv = ["mlx_lm_lora.train", *argv]
    train.main()
    print("PEER_TIMES " + json.dumps({**times, "peak_gb": mx.get_peak_memory() / 1e9}), flush=True)


def main() -> None:
    if "--peer-inside" in sys.argv:
        argv = [a for a in sys.argv[1:] if a != "--peer-inside"]
        return peer_inside(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen2.5-0.5b")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--completion", type=int, default=256)
    parser.add_argument("--repetitions", type=int, default=1)
    parser.add_argument("--ours-flags", default="", help="extra `mlx-grpo train` flags, e.g. '--num-iterations 1'")
    parser.add_argument("--work", type=Path, help="directory for the model, data and runs (default: a temporary one)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="vs-mlx-lm-lora-"))
    work.mkdir(parents=True, exist_ok=True)
    model, data = prepare(work, args.preset, args.layers, rows=64)
    results = []
    for rep in range(args.repetitions):
        for run in (run_ours, run_peer):
            load = os.getloadavg()[0]
            result = {**run(args, model, data, work, rep), "repetition": rep, "load_before": load}
            results.append(result)
            print(json.dumps(result), flush=True)
    print(f"\n{args.preset} cut to {args.layers} layers, LoRA r8, {args.batch_size} x {args.group_size} x "
          f"{args.completion} tokens, float32; mlx-grpo flags: {args.ours_flags or '(defaults)'}")
    print(f"{'tool':12s} {'rep':>3s} {'load':>5s} {'step s':>7s} {'rollout s':>9s} {'ref+update s':>12s} "
          f"{'MLX peak GB':>11s} {'max RSS GB':>10s}")
    for r in results:
        print(f"{r['tool']:12s} {r['repetition']:3d} {r['load_before']:5.1f} {r['step_s']:7.1f} {r['rollout_s']:9.1f} "
              f"{r['train_s']:12.1f} {r['mlx_peak_gb']:11.2f} {r['max_rss_gb']:10.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": vars(args) | {"work": str(work)}, "runs": results},
                                              indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
