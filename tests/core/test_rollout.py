"""Rollout correctness: the batched KV-cache decode must agree with a plain forward pass."""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm import load
from tiny_models import make_model_dir

from mlx_grpo.rollout import generate
from mlx_grpo.sampling import SamplingSettings, filter_logits, sample_with_logprobs
from mlx_grpo.update import build_train_batch, completion_logprobs


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = make_model_dir(tmp_path_factory.mktemp("llama"), "llama", seed=3)
    model, tokenizer = load(str(path))
    return model, tokenizer


@pytest.mark.parametrize("prompt_texts", [["12+34=", "56+78="], ["1+2=", "123+456=", "99+1="]])
def test_sampled_logprobs_match_training_forward(tiny, prompt_texts):
    """Left-padded cached decode and right-padded training forward see the same tokens the same way."""
    model, tokenizer = tiny
    prompts = [tokenizer.encode(t) for t in prompt_texts]
    eos = {tokenizer.eos_token_id}
    rollout = generate(model, prompts, group_size=3, max_tokens=10, eos_ids=eos, pad_id=0,
                       settings=SamplingSettings(temperature=1.0), key=mx.random.key(7))
    assert len(rollout.completions) == 3 * len(prompts)
    assert rollout.prompts[0] == rollout.prompts[2] == prompts[0]
    batch = build_train_batch(rollout, pad_id=0)
    logp = completion_logprobs(model, batch, temperature=1.0)
    for i, lps in enumerate(rollout.logprobs):
        assert len(lps) == len(rollout.completions[i]) >= 1
        assert mx.allclose(logp[i, : len(lps)], mx.array(lps), atol=2e-4).item()


def test_group_members_differ_and_stop_at_eos(tiny):
    model, tokenizer = tiny
    prompts = [tokenizer.encode("5+5=")]
    eos = {tokenizer.eos_token_id}
    rollout = generate(model, prompts, group_size=8, max_tokens=12, eos_ids=eos, pad_id=0,
                       settings=SamplingSettings(temperature=1.0), key=mx.random.key(1))
    assert len({tuple(c) for c in rollout.completions}) > 1  # sampling, not eight copies
    for completion, truncated in zip(rollout.completions, rollout.truncated):
        if truncated:
            assert len(completion) == 12 and eos.isdisjoint(completion)
        else:
            assert completion[-1] in eos and eos.isdisjoint(completion[:-1])


def test_greedy_is_deterministic(tiny):
    model, tokenizer = tiny
    prompts = [tokenizer.encode("7+8=")]
    runs = [generate(model, prompts, 2, 8, {tokenizer.eos_token_id}, 0, SamplingSettings(temperature=0),
                     mx.random.key(k)).completions for k in (1, 2)]
    assert runs[0] == runs[1] and runs[0][0] == runs[0][1]


def test_sampling_draws_from_the_softmax_and_returns_each_draws_log_prob():
    """Frequencies of 40,000 draws against softmax(logits), filtered ids never drawn, exact log-probs."""
    row = mx.array([0.0, 1.0, 2.0, -mx.inf, 0.5, -30.0, -mx.inf])
    ids, logp = sample_with_logprobs(mx.broadcast_to(row, (40_000, row.shape[0])), mx.random.key(3))
    ids = np.array(ids)
    probs = np.array(mx.softmax(row))
    frequencies = np.bincount(ids, minlength=row.shape[0]) / ids.size
    assert np.abs(frequencies - probs).max() < 0.01 and frequencies[3] == frequencies[6] == 0
    assert np.allclose(np.array(logp), np.log(probs[ids]), atol=1e-5)


def test_sampling_in_blocks_of_rows_draws_what_one_block_draws(monkeypatch):
    """A batch whose logits exceed the sampler's block is drawn a block of rows at a time: each row keeps its
    own uniform draw, so ids and log-probs are the ones a single block gives."""
    import mlx_grpo.sampling as sampling

    logits = mx.random.normal((2_000, 50), key=mx.random.key(1)) * 2
    whole = sample_with_logprobs(logits, mx.random.key(5))
    monkeypatch.setattr(sampling, "SAMPLING_BLOCK_LOGITS", 50 * 333)  # blocks of 333 rows, the last one shorter
    blocks = sample_with_logprobs(logits, mx.random.key(5))
    assert np.array_equal(np.array(whole[0]), np.array(blocks[0]))
    assert np.allclose(np.array(whole[1]), np.array(blocks[1]), atol=1e-6)
    ids = np.array(blocks[0])
    assert len(set(ids[:333])) > 10 and not np.array_equal(ids[:333], ids[333:666])


def test_filters_keep_the_expected_tokens():
    logits = mx.log(mx.array([[0.5, 0.3, 0.15, 0.05]]))
    kept = lambda s: (filter_logits(logits, s) > -float("inf"))[0].tolist()  # noqa: E731
    assert kept(SamplingSettings(top_k=2)) == [True, True, False, False]
    assert kept(SamplingSettings(top_p=0.7)) == [True, True, False, False]
    assert kept(SamplingSettings(top_p=0.9)) == [True, True, True, False]
    assert kept(SamplingSettings(min_p=0.2)) == [True, True, True, False]


def test_prefill_never_builds_logits_for_every_prompt_position():
    """At a large vocabulary, [prompts, prompt length, V] logits would be most of a rollout's memory."""
    from tiny_models import random_model

    vocab, length = 32768, 200
    model = random_model("llama", vocab=vocab, hidden=64)
    prompts = [list(range(1, length + 1)), list(range(2, length + 2))]
    mx.clear_cache()
    mx.reset_peak_memory()
    before = mx.get_active_memory()
    rollout = generate(model, prompts, group_size=2, max_tokens=2, eos_ids=set(), pad_id=0,
                       settings=SamplingSettings(temperature=1.0), key=mx.random.key(0))
    all_positions = len(prompts) * length * vocab * 4  # 52 MB
    assert len(rollout.completions) == 4
    assert mx.get_peak_memory() - before < all_positions / 5


def test_top_k_by_partition_keeps_exactly_the_k_largest_logits():
    logits = mx.random.normal((4, 5000), key=mx.random.key(3))
    kept = filter_logits(logits, SamplingSettings(top_k=37))
    finite = np.isfinite(np.array(kept))
    assert (finite.sum(axis=1) == 37).all()
    kth = np.sort(np.array(logits), axis=1)[:, -37][:, None]
    assert (finite == (np.array(logits) >= kth)).all()


@pytest.mark.parametrize("scale", [8.0, 0.01])  # peaked rows (candidates suffice), flat rows (full sort)
def test_top_p_over_the_candidates_equals_top_p_over_the_sorted_vocabulary(scale):
    from mlx_grpo.sampling import top_p_keep

    logits = mx.random.normal((6, 20000), key=mx.random.key(5)) * scale
    order = np.argsort(-np.array(logits), axis=1)
    probs = np.array(mx.softmax(logits, axis=-1))
    sorted_probs = np.take_along_axis(probs, order, axis=1)
    keep_sorted = np.cumsum(sorted_probs, axis=1) - sorted_probs < 0.9
    expected = np.zeros_like(keep_sorted)
    np.put_along_axis(expected, order, keep_sorted, axis=1)
    got = np.array(top_p_keep(logits, 0.9))
    assert (got == expected).all()
    assert got.sum(axis=1).min() >= 1


def test_rollout_memory_does_not_grow_with_decode_steps_beyond_the_kv_cache():
    from tiny_models import random_model

    model = random_model("llama", vocab=32768, hidden=64)
    prompts = [[1, 2, 3, 4], [5, 6, 7, 8]]

    def peak(steps: int) -> int:
        mx.clear_cache()
        mx.reset_peak_memory()
        before = mx.get_active_memory()
        generate(model, prompts, group_size=4, max_tokens=steps, eos_ids=set(), pad_id=0,
                 settings=SamplingSettings(temperature=1.0), key=mx.random.key(0))
        return mx.get_peak_memory() - before

    step_logits = 8 * 32768 * 4  # one decode step's float32 logits, 1 MB
    assert peak(72) - peak(8) < 4 * step_logits  # 64 more steps would keep 64 MB of logits if they leaked


def test_our_top_k_top_p_and_min_p_keep_the_same_tokens_as_mlx_lm_sample_utils():
    """rollout.filter_logits is ours (top-p sorts 1,024 candidates, not a 152k vocabulary); its masks must be
    mlx-lm's, token for token, so the sampled ids and their log-probs are the ones mlx-lm would give."""
    import mlx.core as mx
    from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

    from mlx_grpo.sampling import SamplingSettings, filter_logits

    for vocab in (50, 5000):  # below and above the 1,024 top-p candidates
        logits = mx.random.normal((4, vocab), key=mx.random.key(vocab)) * 3.0
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        for ours, theirs in [(SamplingSettings(top_k=7), apply_top_k(logprobs, 7)),
                             (SamplingSettings(min_p=0.05), apply_min_p(logprobs, 0.05)),
                             (SamplingSettings(top_p=0.9), apply_top_p(logprobs, 0.9)),
                             (SamplingSettings(top_p=0.5), apply_top_p(logprobs, 0.5))]:
            kept = mx.isfinite(filter_logits(logits, ours))
            assert mx.array_equal(kept, mx.isfinite(theirs)).item(), (vocab, ours)


def test_finished_rows_leave_the_batch_and_every_row_samples_what_it_would_in_the_whole_batch(monkeypatch):
    """Rows that sampled an end-of-sequence id stop being decoded (rollout.DROP_SHARE of the batch at a time);
    the others keep their draws, so the completions are those of a rollout that decodes every row to the end."""
    from tiny_models import random_model

    from mlx_grpo import rollout as rollout_module

    model = random_model("llama", vocab=300, hidden=64)
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15]]
    stop = set(range(3, 10))  # ~2% of the vocabulary: completions end anywhere from the first to the last step
    shapes = []

    def run(share: float):
        monkeypatch.setattr(rollout_module, "DROP_SHARE", share)
        monkeypatch.setattr(rollout_module, "LOOKUP_ROWS", 0)  # the last rows' lookup draws differently
        blocks = type(model.model).__call__

        def counted(self, x, *args, **kwargs):  # the decode batch's rows at each one-position forward pass
            if x.shape[1] == 1:
                shapes.append(x.shape[0])
            return blocks(self, x, *args, **kwargs)

        monkeypatch.setattr(type(model.model), "__call__", counted)
        out = generate(model, prompts, 4, 48, stop, 0, SamplingSettings(1.0), mx.random.key(5))
        monkeypatch.undo()
        return out

    whole = run(2.0)  # never drops: every row decodes to the end
    assert set(shapes) == {12}
    shapes.clear()
    dropping = run(0.25)
    lengths = sorted(len(c) for c in dropping.completions)
    assert lengths[0] < 10 and lengths[-1] == 48  # rows ended early while others ran to the budget
    assert shapes[0] == 12 and shapes[-1] < 12 and shapes == sorted(shapes, reverse=True)
    assert dropping.completions == whole.completions and dropping.truncated == whole.truncated
    for a, b in zip(whole.logprobs, dropping.logprobs):
        assert np.allclose(a, b, atol=1e-5)
    batch = build_train_batch(dropping, pad_id=0)
    logp = completion_logprobs(model, batch, temperature=1.0)
    for i, lps in enumerate(dropping.logprobs):
        assert mx.allclose(logp[i, : len(lps)], mx.array(lps), atol=2e-4).item()


@pytest.mark.parametrize("bits, tolerance, saved", [(8, 0.05, 0.35), (4, 0.5, 0.5)])
def test_a_quantized_kv_cache_holds_fewer_bytes_and_moves_log_probs_little(bits, tolerance, saved):
    """kv_cache_bits: the rollout's log-probs against the update's full-precision forward differ by quantization
    only (measured on this model: 8 bits ~0.01, 4 bits ~0.2 at most), and the peak is lower (measured: by 0.44
    and 0.5-0.6 of the float32 cache; the stored values take 0.28 and 0.16 of it)."""
    from tiny_models import random_model

    model = random_model("llama", vocab=300, hidden=256)  # heads of 64 values, one quantization group each
    prompts = [[5, 6, 7, 8, 9], [10, 11]]

    def rollout_and_peak(kv_bits: int):
        mx.clear_cache()
        mx.reset_peak_memory()
        before = mx.get_active_memory()
        out = generate(model, prompts, 4, 200, set(), 0, SamplingSettings(1.0), mx.random.key(2), kv_bits=kv_bits)
        return out, mx.get_peak_memory() - before

    plain, plain_peak = rollout_and_peak(0)
    quantized, quantized_peak = rollout_and_peak(bits)
    cache_bytes = 8 * 205 * 2 * 2 * 2 * 64 * 4  # rows x positions x layers x (keys, values) x kv heads x 64 x fp32
    assert plain_peak - quantized_peak > saved * cache_bytes
    batch = build_train_batch(quantized, pad_id=0)
    logp = completion_logprobs(model, batch, temperature=1.0)
    gaps = [mx.abs(logp[i, :len(lps)] - mx.array(lps)).max().item() for i, lps in enumerate(quantized.logprobs)]
    assert 0 < max(gaps) < tolerance


def test_kv_cache_bits_refuses_heads_it_cannot_quantize():
    from tiny_models import random_model

    from mlx_grpo.common.errors import UserError

    model = random_model("llama", vocab=300, hidden=64)  # heads of 16 values
    with pytest.raises(UserError, match="kv_cache_bits"):
        generate(model, [[1, 2, 3]], 2, 4, set(), 0, SamplingSettings(1.0), mx.random.key(0), kv_bits=8)
