"""Data-parallel GRPO: prompt sharding, metric reduction, equivalence with one big batch, rank-0 output.

The multi-process tests launch two ranks with `mlx.launch --backend ring` on 127.0.0.1 only.
"""

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mlx_grpo.blas import find_openblas
from mlx_grpo.data import PromptOrder
from mlx_grpo.distributed import ShardedOrder, World, init_world
from mlx_grpo.errors import UserError
from mlx_grpo.rank_metrics import RULES, combine_records, rule_for
from mlx_grpo.step_metrics import rollout_metrics
from mlx_grpo.telemetry.catalogue import CATALOGUE, find_entry
from mlx_grpo.telemetry.reward_stats import reward_metrics
from tiny_models import make_model_dir

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = Path(sys.executable).parent / "mlx.launch"
LOOPBACK = "127.0.0.1"


# ----------------------------------------------------------------------------- one process

def test_one_process_world_hands_everything_back_untouched():
    world = init_world()
    assert (world.size, world.rank, world.is_main) == (1, 0, True)

    def loss_and_grad(*args):
        return args

    record = {"tokens/total": 3.0}
    order = PromptOrder(10, 0)
    assert world.wrap_loss_and_grad(loss_and_grad, "bnpo") is loss_and_grad
    assert world.reduce_metrics(record) is record
    assert world.shard_order(order) is order
    assert world.describe() == {"world_size": 1}


def test_ranks_split_the_prompts_of_one_big_batch_across_epochs():
    b, steps = 3, 9  # 2 ranks x 3 prompts over 10 rows: crosses epoch boundaries mid-block
    single = PromptOrder(10, seed=7)
    ranks = [ShardedOrder(10, 7, rank=r, size=2) for r in range(2)]
    for _ in range(steps):
        assert ranks[0].next_indices(b) + ranks[1].next_indices(b) == single.next_indices(2 * b)
    assert ranks[0].state() == ranks[1].state() == single.state()
    assert ranks[0].epoch == single.epoch > 0


# ----------------------------------------------------------------------------- metric reduction

def _step_record(total, scores, lengths, truncated, correct, prompt_lengths, levels):
    return {**reward_metrics(scores, ["fmt", "ans"], [1.0, 2.0], total, 4),
            **rollout_metrics(prompt_lengths, [False] * len(total), lengths, truncated, correct, levels)}


def test_combined_record_equals_the_record_of_the_whole_batch():
    rng = np.random.default_rng(3)
    n = 16  # per rank: 4 groups of 4
    total = rng.normal(size=2 * n)
    scores = rng.normal(size=(2, 2 * n))
    scores[0, rng.random(2 * n) < 0.3] = np.nan  # "fmt" misses some completions, unevenly per rank
    lengths = rng.integers(1, 30, size=2 * n).astype(float)
    truncated = rng.random(2 * n) < 0.3
    correct = rng.random(2 * n) < 0.5
    prompts = rng.integers(5, 9, size=2 * n)
    levels = np.where(rng.random(2 * n) < 0.4, "hard", "easy")
    halves = [slice(0, n), slice(n, 2 * n)]
    parts = [_step_record(total[h], scores[:, h], lengths[h], truncated[h], correct[h], prompts[h], levels[h])
             for h in halves]
    whole = _step_record(total, scores, lengths, truncated, correct, prompts, levels)
    combined = combine_records(parts)

    approximate = {name for name in whole if rule_for(name)[0].approx}
    assert approximate >= {"rewards/total/median", "rewards/entropy", "rewards/fmt/q25"}
    for name, value in whole.items():
        if name not in approximate:
            assert combined[name] == pytest.approx(value, rel=1e-9, abs=1e-12), name
    # totals are summed, not rank 0's
    assert combined["tokens/completion_total"] == lengths.sum() != parts[0]["tokens/completion_total"]


def test_token_means_are_weighted_by_tokens_and_spreads_are_pooled():
    a = np.array([1.0, 1.2, 0.8])
    b = np.array([2.0, 1.0, 1.5, 1.1, 0.9, 1.3, 1.7])
    parts = [{"tokens/completion_total": float(x.size), "policy/ratio_mean": x.mean(), "policy/ratio_std": x.std(),
              "policy/kl": 0.1 * x.size, "policy/lr": 1e-4, "timing/step_s": s, "tokens/total": 2.0 * x.size}
             for x, s in ((a, 2.0), (b, 3.0))]
    both = np.concatenate([a, b])
    out = combine_records(parts)
    assert out["policy/ratio_mean"] == pytest.approx(both.mean())
    assert out["policy/ratio_std"] == pytest.approx(both.std())
    assert out["policy/kl"] == pytest.approx((0.3 * 3 + 0.7 * 7) / 10)
    assert out["policy/lr"] == 1e-4
    assert out["timing/step_s"] == 3.0  # the slowest rank
    assert out["tokens/total"] == 20.0


def test_derived_rates_are_recomputed_and_partial_metrics_use_the_ranks_that_have_them():
    parts = [{"tokens/total": 100.0, "tokens/completion_total": 60.0, "timing/step_s": 2.0, "timing/rollout_s": 1.0,
              "throughput/step_tokens_per_s": 50.0, "timing/gen_ms_per_token": 1000 / 60,
              "completions/clip_ratio": 0.0, "completions/finished_correct_frac": 0.5},
             {"tokens/total": 300.0, "tokens/completion_total": 140.0, "timing/step_s": 4.0, "timing/rollout_s": 3.0,
              "throughput/step_tokens_per_s": 75.0, "timing/gen_ms_per_token": 3000 / 140,
              "completions/clip_ratio": 0.25, "completions/truncated_correct_frac": 1.0,
              "completions/finished_correct_frac": 0.0}]
    out = combine_records(parts)
    assert out["throughput/step_tokens_per_s"] == pytest.approx(400.0 / 4.0)
    assert out["timing/gen_ms_per_token"] == pytest.approx(1000 * 3.0 / 200.0)
    assert out["completions/truncated_correct_frac"] == 1.0  # only rank 1 had truncated completions


def test_every_catalogued_metric_declares_how_it_combines_across_ranks():
    fill = {"fn": "answer_check", "level": "easy", "rubric": "r", "criterion": "c", "k": "2"}
    names = {re.sub(r"<(\w+)>", lambda m: fill[m.group(1)], spec.name) for spec in CATALOGUE
             if spec.kind in ("scalar", "summary")}
    missing = sorted(name for name in names if rule_for(name) is None)
    assert not missing, f"declare how these combine across ranks in mlx_grpo/rank_metrics.py RULES: {missing}"
    for name in names:
        rule, groups = rule_for(name)
        for ref in (rule.weight, rule.mean, rule.num, rule.den):
            if ref is not None:
                concrete = re.sub(r"<(\w+)>", lambda m: groups[m.group(1)], ref.removeprefix("1-"))
                assert find_entry(concrete) is not None, f"{name}: rule refers to {concrete}, not a metric"


def test_every_approximation_is_documented():
    text = (ROOT / "docs" / "DISTRIBUTED.md").read_text()
    for pattern, rule in RULES:
        if rule.approx:
            assert f"`{pattern}`" in text, pattern


# ----------------------------------------------------------------------------- output and resume

def test_ranks_other_than_zero_write_nothing(tmp_path):
    world = World(rank=1, size=2)
    run_dir = tmp_path / "run"

    def make():
        raise AssertionError("rank 1 must not build sinks")

    sinks = world.sinks(make, run_dir)
    sinks.start("run", {}, {}, {}, 3, run_id=None)
    sinks.write(1, {"tokens/total": 1.0})
    sinks.write_samples(1, [{"prompt": "p"}])
    sinks.write_alert({"step": 1, "level": "info"})
    sinks.write_final({"final/steps": 1.0})
    sinks.close("finished")
    assert not run_dir.exists()


def test_resume_with_another_number_of_processes_is_refused(tmp_path):
    with pytest.raises(UserError, match=r"2 process.*this launch has 1"):
        World().check_resume({"world_size": 2}, tmp_path / "step_4")
    World().check_resume({}, tmp_path / "step_4")  # checkpoints from before data parallelism: one process
    World(rank=0, size=2).check_resume({"world_size": 2}, tmp_path / "step_4")


# ----------------------------------------------------------------------------- two ranks on loopback

def _free_port_pair() -> int:
    """A port p with p and p + 1 free on loopback (the ring listens on one port per rank)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind((LOOPBACK, 0))
            port = probe.getsockname()[1]
        try:
            with socket.socket() as second:
                second.bind((LOOPBACK, port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair on loopback")


def launch_two(args: list[str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    library = find_openblas()
    if library and sys.platform.startswith("linux"):
        env["LD_PRELOAD"] = library
    command = [str(LAUNCH), "--hosts", LOOPBACK, "-n", "2", "--backend", "ring",
               "--starting-port", str(_free_port_pair()), "--", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("model") / "llama", "llama")


def test_two_ranks_with_batch_b_update_like_one_rank_with_batch_2b(tmp_path, tiny_model):
    done = launch_two([sys.executable, str(ROOT / "tests" / "dist_equivalence.py"), str(tiny_model)], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][0])
    assert report["world_size"] == 2
    cases = report["cases"]
    for name in ("grpo", "bnpo", "dr_grpo", "dapo", "grpo_batch_scaled"):
        case = cases[name]
        assert case["ranks_agree"], name
        assert case["update_size"] > 1e-3, name  # the update really moved the weights
        assert case["max_weight_diff"] < 1e-2 * case["update_size"], (name, case)
        assert case["loss_parallel"] == pytest.approx(case["loss_single"], rel=1e-4, abs=1e-6), name
        assert case["grad_norm_parallel"] == pytest.approx(case["grad_norm_single"], rel=1e-4), name
    # the ranks hold different token counts, so plain averaging of bnpo gradients is a different update
    naive = cases["naive_bnpo"]
    assert len(set(naive["tokens_per_rank"])) == 2
    assert naive["max_weight_diff"] > 0.1 * naive["update_size"]


def test_two_rank_training_writes_one_run_directory_with_global_metrics(tmp_path, tiny_model):
    runs = tmp_path / "runs"
    b, g = 2, 4
    args = [sys.executable, "-m", "mlx_grpo.cli", "train", str(ROOT / "configs" / "default.yaml"),
            "--model-id", str(tiny_model), "--num-steps", "3", "--batch-size", str(b), "--num-generations", str(g),
            "--max-generation-steps", "8", "--eval-every", "3", "--eval-size", "10", "--checkpoint-every", "2",
            "--monitoring-dir", str(runs), "--run-name", "dp"]
    done = launch_two(args, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("finished 3 steps") == 1  # only rank 0 talks

    assert [p.name for p in runs.iterdir()] == ["dp"]
    run_dir = runs / "dp"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    sequences = 2 * b * g  # both ranks' completions
    for r in records:
        assert r["tokens/completion_total"] == pytest.approx(r["completions/length_mean"] * sequences)
        assert r["tokens/total"] == r["tokens/prompt_total"] + r["tokens/completion_total"]
        assert r["completions/length_min"] <= r["completions/length_mean"] <= r["completions/length_max"]
    assert records[-1]["eval/num_samples"] == 10  # 5 held-out rows on each rank
    samples = (run_dir / "samples.jsonl").read_text().splitlines()
    assert len(samples) == 3 * b  # rank 0's first groups, once per step
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "finished" and info["device"]["world_size"] == 2
    final = json.loads((run_dir / "final_metrics.json").read_text())
    assert final["final/total/total_samples"] == 3 * sequences
    for step in (2, 3):
        state = json.loads((run_dir / "checkpoints" / f"step_{step}" / "state.json").read_text())
        assert state["world_size"] == 2

    # one process cannot continue a two-process run, and trying leaves the run untouched
    from mlx_grpo.config import load_config
    from mlx_grpo.trainer import train

    config = load_config(ROOT / "configs" / "default.yaml", {"model_id": str(tiny_model), "num_steps": 5,
                                                              "batch_size": b, "num_generations": g})
    with pytest.raises(UserError, match="saved by a run of 2 process"):
        train(config, tmp_path, resume_dir=run_dir)
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 3


@pytest.mark.slow
def test_two_rank_run_resumes_with_two_ranks(tmp_path, tiny_model):
    runs = tmp_path / "runs"
    common = ["--max-generation-steps", "8", "--eval-every", "0", "--checkpoint-every", "2", "--no-tensorboard"]
    first = launch_two([sys.executable, "-m", "mlx_grpo.cli", "train", "--model-id", str(tiny_model),
                        "--num-steps", "2", "--batch-size", "2", "--num-generations", "4", *common,
                        "--monitoring-dir", str(runs), "--run-name", "dp"], tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    again = launch_two([sys.executable, "-m", "mlx_grpo.cli", "train", "--resume", str(runs / "dp"),
                        "--num-steps", "4"], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    records = [json.loads(line) for line in (runs / "dp" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert json.loads((runs / "dp" / "run.json").read_text())["status"] == "finished"
