"""Lookup decoding: the last rows of a rollout guess their next tokens from their own text, exactly."""

import mlx.core as mx
import numpy as np
import pytest
from kept_states import kept_state_error
from tiny_models import random_model

from mlx_grpo import frozen_prefix, lookup_decoding
from mlx_grpo import rollout as rollout_module
from mlx_grpo.config.train_config import TrainConfig
from mlx_grpo.models.policy import apply_adapters
from mlx_grpo.rollout import generate
from mlx_grpo.sampling import SamplingSettings, check_guesses, sample_tokens, sampling_logits
from mlx_grpo.update import build_train_batch, completion_logprobs


def test_a_guess_copies_what_followed_the_latest_earlier_occurrence_of_the_last_tokens():
    assert lookup_decoding.guess([7, 1, 2, 3, 9, 4, 1, 2, 3], 3) == [9, 4, 1]
    # the latest occurrence wins, and a loop shorter than the guess is repeated
    assert lookup_decoding.guess([1, 2, 3, 5, 1, 2, 3, 6, 1, 2, 3], 6) == [6, 1, 2, 3, 6, 1]
    assert lookup_decoding.guess([4, 8, 8, 8], 4) == [8, 8, 8, 8]
    assert lookup_decoding.guess([5, 6, 1, 9, 6, 1], 2) == [9, 6]  # no earlier [9, 6, 1]: the last two tokens
    assert lookup_decoding.guess([1, 2, 3, 4], 5) == []  # nothing repeats


def test_a_refused_guess_is_redrawn_from_the_rest_so_the_token_keeps_its_probability():
    """20,000 rows guess token 2 (probability 0.4): kept ones emit it, refused ones draw from the other tokens.
    The emitted token's frequencies are the distribution's (drawing refused rows from the whole distribution
    would give token 2 0.64), and each emitted token's log-prob is its log-probability."""
    rows = 20_000
    probs = np.array([0.1, 0.2, 0.4, 0.25, 0.05], dtype=np.float32)
    logits = mx.broadcast_to(mx.log(mx.array(probs)), (rows, 2, 5))
    guesses = mx.full((rows, 1), 2, dtype=mx.int32)
    kept, guess_logprobs = check_guesses(logits, guesses, False, mx.random.key(3))
    assert np.allclose(np.array(guess_logprobs), np.log(0.4), atol=1e-5)
    assert abs(kept.mean() - 0.4) < 0.015 and kept.min() == 0
    carried = (mx.where(mx.array(kept > 0), guesses[:, 0], -1), mx.where(mx.array(kept == 0), guesses[:, 0], -1))
    ids, logprobs = sample_tokens(logits[:, 0], SamplingSettings(1.0), mx.random.key(4), None, carried)
    frequencies = np.bincount(np.array(ids), minlength=5) / rows
    assert np.abs(frequencies - probs).max() < 0.015
    assert np.allclose(np.array(logprobs), np.log(probs)[np.array(ids)], atol=1e-5)


def counting_checks(monkeypatch) -> list[int]:
    """Record how many tokens each lookup step guessed."""
    guessed: list[int] = []

    def counted(logits, guesses, *args):
        guessed.append(guesses.shape[1])
        return check_guesses(logits, guesses, *args)

    monkeypatch.setattr(rollout_module, "check_guesses", counted)
    return guessed


@pytest.mark.parametrize("prompts", [[[1, 2, 3, 4]], [[1, 2, 3, 4], [5, 6]]], ids=["one-row-cache", "left-padded"])
def test_greedy_replies_are_the_same_with_and_without_lookup(monkeypatch, prompts):
    model = random_model("llama", vocab=16, hidden=32)
    group = 2 // len(prompts)
    monkeypatch.setattr(rollout_module, "LOOKUP_ROWS", 0)
    plain = generate(model, prompts, group, 40, set(), 0, SamplingSettings(0.0), mx.random.key(0))
    monkeypatch.undo()
    guessed = counting_checks(monkeypatch)
    looked_up = generate(model, prompts, group, 40, set(), 0, SamplingSettings(0.0), mx.random.key(0))
    assert len(guessed) >= 3 and sum(guessed) > len(guessed)  # several steps, several tokens guessed in each
    assert looked_up.completions == plain.completions and all(len(c) == 40 for c in plain.completions)


def test_sampled_replies_keep_their_log_probs_and_frozen_states_through_lookup(monkeypatch):
    """Refused guesses' positions leave the KV cache and the kept states: the rollout's log-probs are the
    training forward's, and each fed position's frozen-block output is the full forward's."""
    model = random_model("qwen2", vocab=12, hidden=64, layers=4)
    apply_adapters(model, TrainConfig(use_lora=True, lora_layers=2))
    frozen_prefix.install(model)
    guessed = counting_checks(monkeypatch)
    prompts = [[1, 5, 9, 2, 1, 5], [3, 4, 7]]
    rollout = generate(model, prompts, 1, 48, set(), 0, SamplingSettings(0.8), mx.random.key(2), capture=True)
    assert len(guessed) >= 3
    assert all(len(c) == 48 for c in rollout.completions)
    logp = completion_logprobs(model, build_train_batch(rollout, pad_id=0), temperature=0.8)
    for row, lps in enumerate(rollout.logprobs):
        assert mx.allclose(logp[row, :48], mx.array(lps), atol=2e-4).item()
        assert kept_state_error(model, rollout, row) < 1e-4


def test_a_lookup_step_filters_each_checked_position_as_a_one_position_step_would():
    """top-k, top-p and min-p over [rows, positions, vocab] keep, at each position, what they keep over
    [rows, vocab]."""
    settings = SamplingSettings(0.8, top_p=0.9, top_k=40, min_p=0.02)
    logits = mx.random.normal((2, 5, 3000), key=mx.random.key(9)) * 3
    together = sampling_logits(logits, settings)
    for position in range(5):
        alone = sampling_logits(logits[:, position], settings)
        assert mx.array_equal(mx.isinf(together[:, position]), mx.isinf(alone)).item()
        finite = ~mx.isinf(alone)
        assert mx.allclose(mx.where(finite, together[:, position], 0), mx.where(finite, alone, 0)).item()
