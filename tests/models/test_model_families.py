"""Model families whose cache is not a plain KV cache: sliding windows (gemma3) and state-space hybrids (lfm2)
roll out in a batch exactly as one sequence at a time would, and train, checkpoint and resume with LoRA."""

import json

import mlx.core as mx
import pytest
from mlx_lm import load
from mlx_lm.models.cache import ConcatenateKVCache, make_prompt_cache
from tiny_models import make_model_dir, random_model

from mlx_grpo.cli import main
from mlx_grpo.rollout import generate
from mlx_grpo.sampling import SamplingSettings

FAMILIES = ("gemma3_text", "lfm2")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {kind: make_model_dir(root / kind, kind) for kind in (*FAMILIES, "llama")}


def greedy_alone(model, prompt, steps):
    """One sequence, the model's own cache, argmax: what the batched rollout must reproduce."""
    cache = make_prompt_cache(model)
    logits = model(mx.array([prompt]), cache=cache)[:, -1, :]
    out = []
    for _ in range(steps):
        token = int(mx.argmax(logits, axis=-1).item())
        out.append(token)
        logits = model(mx.array([[token]]), cache=cache)[:, -1, :]
    return out


@pytest.mark.parametrize("kind", FAMILIES)
def test_batched_rollout_equals_one_sequence_at_a_time(models, kind):
    model, _ = load(str(models[kind]))
    # lengths 4, 9, 2, 4, 9: windows of 6 overflow; prompts of one length are prefilled together
    prompts = [[1, 5, 6, 7], [1, 8, 9, 10, 11, 12, 13, 14, 15], [1, 9], [1, 7, 3, 2], [1, 2, 4, 8, 16, 3, 5, 9, 11]]
    steps = 12
    rollout = generate(model, prompts, 2, steps, eos_ids=set(), pad_id=0, settings=SamplingSettings(temperature=0.0),
                       key=mx.random.key(0))
    for i, prompt in enumerate(prompts):
        expected = greedy_alone(model, prompt, steps)
        assert rollout.completions[2 * i] == expected and rollout.completions[2 * i + 1] == expected, i


def test_a_sliding_window_longer_than_the_rollout_batches_its_prompts_in_plain_caches():
    """gemma3's window (512 positions) covers a short-answer rollout: its prompts are prefilled together
    into plain caches of the rollout's length instead of each alone into rotating caches of the window's
    length, merged for every row (0.5 GB of gemma-3-270m's 32-row rollout); the tokens are the same as one
    sequence at a time (measured: 4.0 MB above the weights against 79 MB)."""
    import gc

    model = random_model("gemma3_text", vocab=300, head_dim=256, sliding_window=512)
    prompts = [[1, 5, 6, 7], [1, 8, 9, 10, 11, 12, 13, 14, 15], [1, 9]]
    steps = 6
    gc.collect()
    mx.clear_cache()
    mx.reset_peak_memory()
    weights = mx.get_active_memory()
    rollout = generate(model, prompts, 8, steps, eos_ids=set(), pad_id=0, settings=SamplingSettings(temperature=0.0),
                       key=mx.random.key(0))
    assert mx.get_peak_memory() - weights < 20e6
    for i, prompt in enumerate(prompts):
        assert rollout.completions[8 * i:8 * i + 8] == [greedy_alone(model, prompt, steps)] * 8, i


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
@pytest.mark.parametrize("kind", FAMILIES)
def test_run_trains_checkpoints_and_resumes(models, kind, lora, tmp_path):
    flags = ["--model-id", str(models[kind]), "--use-lora" if lora else "--no-use-lora", "--num-steps", "2", "--batch-size", "2",
             "--num-generations", "4", "--max-generation-steps", "8", "--train-size", "16", "--eval-size", "4",
             "--eval-every", "0", "--checkpoint-every", "1", "--no-tensorboard", "--run-name", "r",
             "--monitoring-dir", str(tmp_path / "runs")]
    assert main(["train", *flags]) == 0
    run_dir = tmp_path / "runs" / "r"
    weights = "adapters.safetensors" if lora else "model.safetensors"
    assert (run_dir / "checkpoints" / "step_2" / weights).is_file()
    assert main(["train", "--resume", str(run_dir), "--num-steps", "3"]) == 0
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    # a step whose groups all drew equal rewards has no advantage, and at step 1 no KL either: its gradient is
    # exactly 0 (which steps do depends on the samples, so on the mlx-lm version)
    assert all(r["policy/grad_norm"] > 0 for r in records if r["advantages/std"] > 0)
    assert any(r["policy/grad_norm"] > 0 for r in records)


def test_a_cache_mlx_lm_cannot_batch_is_refused_in_one_line_before_the_run_directory(models, tmp_path, capsys,
                                                                                     monkeypatch):
    import mlx_lm.models.llama as llama

    monkeypatch.setattr(llama.Model, "make_cache", lambda self: [ConcatenateKVCache() for _ in self.layers],
                        raising=False)
    code = main(["train", "--model-id", str(models["llama"]), "--num-steps", "1",
                 "--monitoring-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "(llama): its ConcatenateKVCache cache cannot be batched" in err[0]
    assert not (tmp_path / "runs").exists()
