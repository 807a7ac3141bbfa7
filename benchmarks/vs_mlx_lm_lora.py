"""GRPO steps of mlx-grpo against mlx-lm-lora, on the same random-weight model, data and shape.

Issues 28 and 35: each `--preset` (mlx_grpo/planning/presets.py) cut to `--layers` blocks (0: its whole depth) and
saved as a model directory, LoRA r8 on every linear layer of every block, `--batch-size` prompts x
`--group-size` completions of exactly `--completion` tokens, float32, OpenBLAS preloaded, AdamW at 5e-5,
beta 0.04, temperature 1, one update per rollout. Each tool runs `--steps` steps in its own fresh process
under /usr/bin/time -v (max RSS), the two alternating `--repetitions` times so that load on a shared
machine hits both alike. Seconds per step: the median of the steps after the first (the first, when there
are several, pays for warm-up).

- mlx-grpo: `mlx-grpo train ... --num-steps N`, at its defaults otherwise (plus `--ours-flags`, by default
  `--num-iterations 1`: one update per rollout, as mlx-lm-lora makes); phase times and peaks from its
  metrics.jsonl (timing/*_s, memory/*_peak_gb).
- mlx-lm-lora (`pip install mlx-lm-lora`, not a dependency of mlx-grpo; `--peer-python` runs it from another
  environment): its own CLI, `--train-mode grpo --iters N`, with timers around its rollout
  (`generate_grpo`), rewards and reference + update (`_grpo_value_and_grad`, evaluated); its validation pass
  is skipped (it is not part of a step). MLX peak is mx.get_peak_memory() at exit.

Completions of exactly `--completion` tokens in both: each tool runs inside a small wrapper that empties
the tokenizer's end-of-sequence ids (mlx-grpo's `models.stop_ids`; mlx-lm-lora's `tokenizer.eos_token_ids`
and its answer end token, for its generation only), and the table shows each tool's shortest and longest
completion. Both tools read the same prompts: the model directory's tokenizer gets a chat template that
passes the user's text through, and every row has an empty system prompt.

    python benchmarks/vs_mlx_lm_lora.py --preset qwen2.5-0.5b --layers 2 --completion 256 --repetitions 2
    python benchmarks/vs_mlx_lm_lora.py --preset qwen2.5-0.5b qwen2.5-1.5b --layers 0 --steps 2 \
        --peer-python /path/to/venv-with-mlx-lm-lora/bin/python --wrap measured
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mlx_grpo.planning.blas import find_openblas

CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def prepare(work: Path, preset: str, layers: int, rows: int) -> tuple[Path, Path]:
    """The model directory (with the pass-through chat template) and a data directory with train/valid.jsonl."""
    from mlx_grpo.planning.presets import write_preset_model
    from mlx_grpo.tasks import arithmetic

    model = write_preset_model(preset, layers or None, work / f"{preset}-L{layers or 'all'}")
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


def timed(command: list[str], cwd: Path, wrap: list[str]) -> tuple[str, float, float]:
    """(output, wall seconds, max RSS in GB) of one fresh process with OpenBLAS preloaded, run under `wrap`
    (e.g. a command that waits for a machine-wide measurement lock)."""
    env = dict(os.environ)
    library = find_openblas()
    if library:
        env["LD_PRELOAD"] = library
    start = time.perf_counter()
    done = subprocess.run([*wrap, "/usr/bin/time", "-v", *command], cwd=cwd, env=env, capture_output=True,
                          text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(command)}\n"
                         f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr).group(1)) * 1024 / 1e9
    return done.stdout + done.stderr, wall, rss


def later_median(values: list[float]) -> float:
    """The median of the steps after the first (all of them when there is one)."""
    return statistics.median(values[1:] or values)


def run_ours(args, model: Path, data: Path, work: Path, rep: int) -> dict:
    name = f"ours-{model.name}-{rep}"
    command = [sys.executable, __file__, "--ours-inside", "train", "--model-id", str(model),
               "--dataset", str(data / "train.jsonl"), "--use-lora", "--lora-rank", "8",
               "--batch-size", str(args.batch_size), "--num-generations", str(args.group_size),
               "--max-generation-steps", str(args.completion), "--num-steps", str(args.steps), "--eval-every", "0",
               "--learning-rate", "5e-5", "--beta", "0.04", "--temperature", "1.0",
               "--run-name", name, *args.ours_flags.split()]
    # a run of that name left by an earlier use of --work would make the trainer pick another name
    shutil.rmtree(work / "runs" / name, ignore_errors=True)
    _, wall, rss = timed(command, work, args.wrap.split())
    records = [json.loads(line) for line in (work / "runs" / name / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in records if "timing/rollout_s" in r]
    phases = [{p: r.get(f"timing/{p}_s") or 0.0 for p in ("rollout", "reward", "advantage", "ref", "update")}
              for r in records]
    peaks = [r.get(f"memory/{p}_peak_gb") or 0.0 for r in records for p in ("rollout", "ref", "update")]
    lengths = [int(r[key]) for r in records for key in ("completions/length/min", "completions/length/max") if key in r]
    return {"tool": "mlx-grpo", "steps_s": [sum(p.values()) for p in phases],
            "step_s": later_median([sum(p.values()) for p in phases]),
            "rollout_s": later_median([p["rollout"] for p in phases]),
            "train_s": later_median([p["ref"] + p["update"] for p in phases]), "mlx_peak_gb": max(peaks),
            "max_rss_gb": rss, "process_s": wall, "completion_lengths": [min(lengths), max(lengths)]}


def run_peer(args, model: Path, data: Path, work: Path, rep: int) -> dict:
    command = [args.peer_python, __file__, "--peer-inside", "--model", str(model), "--data", str(data),
               "--train", "--train-mode", "grpo", "--train-type", "lora", "--adapter-path",
               str(work / f"peer-{model.name}-{rep}"), "--iters", str(args.steps), "--batch-size", str(args.batch_size),
               "--group-size", str(args.group_size), "--max-completion-length", str(args.completion),
               "--steps-per-report", "1", "--optimizer", "adamw", "--learning-rate", "5e-5", "--beta", "0.04",
               "--temperature", "1.0"]
    output, wall, rss = timed(command, work, args.wrap.split())
    found = json.loads(re.search(r"PEER_TIMES (\{.*\})", output).group(1))
    steps = [sum(parts) for parts in zip(found["rollout_s"], found["rewards_s"], found["train_s"])]
    return {"tool": "mlx-lm-lora", "steps_s": steps, "step_s": later_median(steps),
            "rollout_s": later_median(found["rollout_s"]), "train_s": later_median(found["train_s"]),
            "mlx_peak_gb": found["peak_gb"], "max_rss_gb": rss, "process_s": wall,
            "completion_lengths": found["completion_lengths"]}


def ours_inside(argv: list[str]) -> None:
    """Inside the mlx-grpo process: `mlx-grpo train` with no end-of-sequence ids, so every completion runs its
    whole budget (what the bench's `stop_at_eos=False` does)."""
    from mlx_grpo import cli
    from mlx_grpo.models import policy as models

    stop_ids = models.stop_ids
    models.stop_ids = lambda tokenizer, *_: (set(), stop_ids(tokenizer)[1])
    raise SystemExit(cli.main(argv))


def peer_inside(argv: list[str]) -> None:
    """Inside the mlx-lm-lora process: its own CLI, with timers around the phases of each step and no
    end-of-sequence or answer end token for its generation."""
    import mlx.core as mx
    from mlx_lm_lora import train
    from mlx_lm_lora.trainer import grpo_trainer
    from phase_timer import timed_phase

    times = {"rollout_s": [], "rewards_s": [], "train_s": []}
    lengths = []

    def without_stops(function):
        def wrapped(*a, **k):
            tokenizer = k["tokenizer"]
            saved, tokenizer.eos_token_ids = tokenizer.eos_token_ids, set()
            try:
                completions, texts, indices = function(*a, **{**k, "end_token": ""})
            finally:
                tokenizer.eos_token_ids = saved
            lengths.extend(len(c) for c in completions)
            return completions, texts, indices
        return wrapped

    grpo_trainer.generate_grpo = timed_phase(times["rollout_s"], without_stops(grpo_trainer.generate_grpo))
    grpo_trainer._rollout_rewards = timed_phase(times["rewards_s"], grpo_trainer._rollout_rewards)
    grpo_trainer._grpo_value_and_grad = timed_phase(times["train_s"], grpo_trainer._grpo_value_and_grad)
    grpo_trainer.evaluate_grpo = lambda **kwargs: (0.0, 0, {})  # validation is not part of a training step
    sys.argv = ["mlx_lm_lora.train", *argv]
    train.main()
    print("PEER_TIMES " + json.dumps({**times, "peak_gb": mx.get_peak_memory() / 1e9,
                                      "completion_lengths": [min(lengths), max(lengths)]}), flush=True)


def main() -> None:
    if "--peer-inside" in sys.argv:
        argv = [a for a in sys.argv[1:] if a != "--peer-inside"]
        return peer_inside(argv)
    if "--ours-inside" in sys.argv:
        return ours_inside([a for a in sys.argv[1:] if a != "--ours-inside"])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", nargs="+", default=["qwen2.5-0.5b"])
    parser.add_argument("--layers", type=int, default=2, help="blocks of each preset; 0: its whole depth")
    parser.add_argument("--steps", type=int, default=1, help="steps per process (the first is left out when > 1)")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--completion", type=int, default=256)
    parser.add_argument("--repetitions", type=int, default=1)
    parser.add_argument("--ours-flags", default="--num-iterations 1", help="extra `mlx-grpo train` flags")
    parser.add_argument("--peer-python", default=sys.executable,
                        help="the Python that has mlx-lm-lora (and mlx-grpo, for this script's imports)")
    parser.add_argument("--wrap", default="", help="a command to run each tool's process under, e.g. 'measured'")
    parser.add_argument("--work", type=Path, help="directory for the model, data and runs (default: a temporary one)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="vs-mlx-lm-lora-"))
    work.mkdir(parents=True, exist_ok=True)
    results = []
    for preset in args.preset:
        model, data = prepare(work, preset, args.layers, rows=64)
        for rep in range(args.repetitions):
            for run in (run_ours, run_peer):
                load = os.getloadavg()[0]
                started = time.strftime("%H:%M:%S", time.gmtime())
                result = {**run(args, model, data, work, rep), "preset": preset, "repetition": rep,
                          "load_before": load, "started_utc": started}
                results.append(result)
                print(json.dumps(result), flush=True)
    print(f"\n{time.strftime('%Y-%m-%d', time.gmtime())}: LoRA r8, {args.batch_size} x {args.group_size} x "
          f"{args.completion} tokens, {args.steps} step(s) per process, float32; layers: {args.layers or 'all'}; "
          f"mlx-grpo flags: {args.ours_flags or '(defaults)'}; {versions(args.peer_python)}")
    print(f"{'preset':14s} {'tool':12s} {'rep':>3s} {'load':>5s} {'s/step':>7s} {'rollout s':>9s} "
          f"{'ref+update s':>12s} "
          f"{'MLX peak GB':>11s} {'max RSS GB':>10s} {'tokens':>8s}")
    for r in results:
        print(f"{r['preset']:14s} {r['tool']:12s} {r['repetition']:3d} {r['load_before']:5.1f} {r['step_s']:7.1f} "
              f"{r['rollout_s']:9.1f} {r['train_s']:12.1f} {r['mlx_peak_gb']:11.2f} {r['max_rss_gb']:10.2f} "
              f"{'-'.join(map(str, r['completion_lengths'])):>8s}")
    for preset in args.preset:
        ours = [r["step_s"] for r in results if r["preset"] == preset and r["tool"] == "mlx-grpo"]
        peer = [r["step_s"] for r in results if r["preset"] == preset and r["tool"] == "mlx-lm-lora"]
        print(f"{preset}: mlx-lm-lora's s/step over mlx-grpo's: "
              + ", ".join(f"{p / o:.2f}x" for o, p in zip(ours, peer)))
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": vars(args) | {"work": str(work)}, "runs": results},
                                              indent=2, default=str) + "\n")


def versions(python: str) -> str:
    """mlx, mlx-lm and mlx-lm-lora versions as the peer's Python sees them (mlx-grpo's own beside them)."""
    from importlib.metadata import version

    script = ("from importlib.metadata import version as v; "
              "print(', '.join(f'{n} {v(n)}' for n in ('mlx', 'mlx-lm', 'mlx-lm-lora')))")
    peer = subprocess.run([python, "-c", script], capture_output=True, text=True).stdout.strip()
    return f"mlx-grpo {version('mlx-grpo')} with mlx {version('mlx')}, mlx-lm {version('mlx-lm')}; peer: {peer or '?'}"


if __name__ == "__main__":
    main()
