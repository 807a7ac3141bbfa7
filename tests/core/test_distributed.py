"""Data-parallel GRPO: prompt sharding, metric reduction, equivalence with one big batch, rank-0 output.

The multi-process tests launch two ranks with `mlx.launch --backend ring` on 127.0.0.1 only.
"""

import dataclasses
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest
from step_data_builder import make_step_data
from tiny_models import make_model_dir

from mlx_grpo.common.errors import UserError
from mlx_grpo.data import PromptOrder
from mlx_grpo.distributed import ShardedOrder, World, combine_update_stats, init_world
from mlx_grpo.planning.blas import find_openblas
from mlx_grpo.telemetry.metrics.step_data import step_record
from mlx_grpo.telemetry.rundir.writer import read_run_info

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = Path(sys.executable).parent / "mlx.launch"
LOOPBACK = "127.0.0.1"


# ----------------------------------------------------------------------------- one process

def test_one_process_world_hands_everything_back_untouched():
    world = init_world()
    assert (world.size, world.rank, world.is_main) == (1, 0, True)

    grads = {"w": mx.ones(3)}
    loss = mx.array(2.0)
    assert world.sum_update(loss, grads) == (loss, grads)
    order = PromptOrder(10, 0)
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


# ----------------------------------------------------------------------------- gather, then summarise

class TwoRanks(World):
    """Rank 0 of a two-rank world whose other rank's data is given: gather_json without a launch."""

    def __init__(self, other):
        super().__init__(group=None, rank=0, size=2)
        self.other = other

    def gather_json(self, obj):
        import json as _json
        mine = _json.loads(_json.dumps(obj, default=float))
        return [mine, self.other]


def _halves(data, n):
    parts = []
    for h in (slice(0, n), slice(n, 2 * n)):
        parts.append(dataclasses.replace(
            data, scores=data.scores[:, h], total=data.total[h], advantages=data.advantages[h],
            prompt_lengths=data.prompt_lengths[h], prompt_truncated=data.prompt_truncated[h],
            lengths=data.lengths[h], truncated=data.truncated[h], correct=data.correct[h],
            difficulty=data.difficulty[h], trained_tokens=int(data.lengths[h].sum()),
            texts=[f"completion {i}" for i in range(h.start, h.stop)],
            reasoning=[f"why {i}" for i in range(h.start, h.stop)], predicted=[str(i) for i in range(h.start, h.stop)],
            prompt_texts=[f"prompt {g}" for g in range(h.start // 4, h.stop // 4)],
            answers=[str(g) for g in range(h.start // 4, h.stop // 4)]))
    return parts


def _wire(data):
    """What World.gather sends for a rank's data."""
    return json.loads(json.dumps({
        "scores": data.scores.tolist(), "total": data.total.tolist(), "advantages": data.advantages.tolist(),
        "prompt_lengths": data.prompt_lengths.tolist(), "prompt_truncated": data.prompt_truncated.tolist(),
        "lengths": data.lengths.tolist(), "truncated": data.truncated.tolist(), "correct": data.correct.tolist(),
        "difficulty": data.difficulty, "trained_tokens": data.trained_tokens, "stats": data.update.stats,
        "texts": data.texts, "reasoning": data.reasoning, "predicted": data.predicted,
        "prompt_texts": data.prompt_texts, "answers": data.answers, "seconds": data.seconds, "peaks": data.peak_memory, "components": data.component_metrics}, default=float))


def test_gathered_step_gives_exactly_the_record_of_the_whole_batch():
    n = 16  # per rank: 4 groups of 4
    levels = ["hard" if i % 3 else "easy" for i in range(2 * n)]
    whole = make_step_data(2 * n, 4, seed=3, levels=levels)
    first, second = _halves(whole, n)
    second = dataclasses.replace(second, seconds={**second.seconds, "step": 5.0})
    gathered = TwoRanks(_wire(second)).gather(first)
    expected = step_record(dataclasses.replace(whole, seconds=gathered.seconds))
    got = step_record(gathered)
    assert got.keys() == expected.keys()
    for name, value in expected.items():  # medians, quartiles and entropies too: no approximation left
        assert got[name] == pytest.approx(value, rel=1e-12, abs=1e-12), name
    assert gathered.seconds["step"] == 5.0  # the slowest rank
    # every completion's text, for completions/, in global order
    assert gathered.texts == [f"completion {i}" for i in range(2 * n)]
    assert gathered.predicted == [str(i) for i in range(2 * n)] and gathered.reasoning[-1] == f"why {2 * n - 1}"
    assert gathered.prompt_texts == [f"prompt {g}" for g in range(8)] and gathered.answers == [str(g) for g in range(8)]
    assert got["tokens/completion_total"] == whole.lengths.sum()


def test_update_statistics_are_token_weighted_and_spreads_pooled():
    a = np.array([1.0, 1.2, 0.8])
    b = np.array([2.0, 1.0, 1.5, 1.1, 0.9, 1.3, 1.7])
    stats = [{"ratio_mean": x.mean(), "ratio_std": x.std(), "kl": 0.1 * x.size, "pg_loss": p}
             for x, p in ((a, 0.2), (b, 0.4))]
    out = combine_update_stats(stats, [a.size, b.size])
    both = np.concatenate([a, b])
    assert out["ratio_mean"] == pytest.approx(both.mean())
    assert out["ratio_std"] == pytest.approx(both.std())
    assert out["kl"] == pytest.approx((0.3 * 3 + 0.7 * 7) / 10)
    assert out["pg_loss"] == pytest.approx(0.6)  # each rank holds its share of the global aggregate


# ----------------------------------------------------------------------------- output and resume

def test_ranks_other_than_zero_write_nothing(tmp_path, monkeypatch):
    """The run decides that only rank 0 writes: another rank's sinks are a set without sinks."""
    import mlx_grpo.run.opening as opening_module
    from mlx_grpo.config.train_config import load_config
    from mlx_grpo.telemetry.events import AlertEvent, Final, Samples, Scalars

    def make_sinks(*args, **kwargs):
        raise AssertionError("rank 1 must not build sinks")

    monkeypatch.setattr(opening_module, "make_sinks", make_sinks)
    trainer = SimpleNamespace(config=load_config(None, {}), world=World(rank=1, size=2))
    monkeypatch.setattr(World, "describe", lambda self: {"world_size": 2})
    run_dir = tmp_path / "run"
    sinks, _, info = opening_module.open_sinks(trainer, run_dir, tmp_path, {"run_id": "abc"}, None)
    assert info.run_id == "abc" and sinks.active == []
    for event in (Scalars(1, {"tokens/total": 1.0}), Samples(1, [{"prompt": "p"}]), AlertEvent({"step": 1}),
                  Final({"final/steps": 1.0})):
        sinks.handle(event)
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
    # `python` by name, found on PATH with this venv first: the form every MLX we allow runs as given (MLX
    # before 0.32 turns an existing file after `--`, such as sys.executable, into `<launcher's python> <file>`,
    # and the interpreter binary then fails as a script; docs/DISTRIBUTED.md)
    args = ["python" if arg == sys.executable else arg for arg in args]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]),
               PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
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
    for name in ("grpo", "bnpo", "dr_grpo", "dapo", "grpo_batch_scaled", "dapo_micro_batched"):
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


# slow (two processes each loading MLX, 11 s): test_two_ranks_with_batch_b_update_like_one_rank_with_batch_2b keeps
# two ranks in the default suite
@pytest.mark.slow
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
    assert [r["step"] for r in records] == [0, 1, 2, 3]  # 0: the held-out evaluation before the first update
    assert records[0]["eval/num_samples"] == 10
    sequences = 2 * b * g  # both ranks' completions
    from mlx_grpo.telemetry.rundir.completions import read_step

    for step in (1, 2, 3):  # every completion of both ranks kept, once
        assert len(read_step(run_dir, step)) == sequences
    records = records[1:]
    for r in records:
        assert r["tokens/completion_total"] == pytest.approx(r["completions/length/mean"] * sequences)
        assert r["tokens/total"] == r["tokens/prompt_total"] + r["tokens/completion_total"]
        assert r["completions/length/min"] <= r["completions/length/mean"] <= r["completions/length/max"]
    assert records[-1]["eval/num_samples"] == 10  # 5 held-out rows on each rank
    samples = (run_dir / "samples.jsonl").read_text().splitlines()
    assert len(samples) == 3 * 4  # the global batch's first samples_per_step (4) groups, once per step
    info = read_run_info(run_dir)
    assert info.status == "finished" and info.world_size == 2
    final = json.loads((run_dir / "final_metrics.json").read_text())
    assert final["final/total/total_samples"] == 3 * sequences
    for step in (2, 3):
        state = json.loads((run_dir / "checkpoints" / f"step_{step}" / "state.json").read_text())
        assert state["world_size"] == 2

    # one process cannot continue a two-process run, and trying leaves the run untouched
    from mlx_grpo.config.train_config import load_config
    from mlx_grpo.run.loop import train

    config = load_config(ROOT / "configs" / "default.yaml", {"model_id": str(tiny_model), "num_steps": 5,
                                                              "batch_size": b, "num_generations": g})
    with pytest.raises(UserError, match="saved by a run of 2 process"):
        train(config, tmp_path, resume_dir=run_dir)
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 4


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
    assert read_run_info(runs / "dp").status == "finished"
