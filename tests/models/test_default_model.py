"""The shipped default model loads through mlx_lm and is imperfect but not hopeless."""

import json
import re
from importlib import resources

import mlx.core as mx
import mlx_lm
import pytest
from mlx.utils import tree_flatten

from mlx_grpo.tasks import arithmetic
from mlx_grpo.tasks.answer_format import is_correct
from mlx_grpo.tools.build_default_model import TAG_TOKENS, decode_batch

MODEL_DIR = resources.files("mlx_grpo") / "default_model"


@pytest.fixture(scope="module")
def loaded():
    return mlx_lm.load(str(MODEL_DIR))


def test_files_are_hugging_face_format_and_small():
    names = {p.name for p in MODEL_DIR.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    config = json.loads((MODEL_DIR / "config.json").read_text())
    assert config["model_type"] == "llama"
    total = sum(p.stat().st_size for p in MODEL_DIR.iterdir() if p.is_file())
    assert total < 8 * 1024 * 1024


def test_model_is_the_documented_size(loaded):
    model, _ = loaded
    n_params = sum(p.size for _, p in tree_flatten(model.parameters()))
    assert 0.9e6 < n_params < 1.2e6
    assert all(p.dtype == mx.float32 for _, p in tree_flatten(model.parameters()))


def test_tokenizer_round_trips_a_prompt_and_completion(loaded):
    _, tokenizer = loaded
    row = arithmetic.make_row(47, 302)
    completion = arithmetic.format_completion(row)
    prompt_ids = tokenizer.encode(row["prompt"])
    completion_ids = tokenizer.encode(completion, add_special_tokens=False)
    assert prompt_ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(prompt_ids + completion_ids, skip_special_tokens=True) == row["prompt"] + completion
    # The tags survive decoding and are one token each.
    assert tokenizer.decode(completion_ids, skip_special_tokens=True) == completion
    for tag in TAG_TOKENS:
        assert len(tokenizer.encode(tag, add_special_tokens=False)) == 1
    # Tokenizing prompt and completion together gives the same ids as apart, so
    # sampled ids and re-tokenized text agree.
    assert tokenizer.encode(row["prompt"] + completion) == prompt_ids + completion_ids


def test_eos_is_set_and_matches_the_model_config(loaded):
    _, tokenizer = loaded
    config = json.loads((MODEL_DIR / "config.json").read_text())
    assert tokenizer.eos_token_id is not None
    assert tokenizer.eos_token_id == config["eos_token_id"]
    assert config["eos_token_id"] in tokenizer.eos_token_ids
    assert tokenizer.pad_token_id is not None and tokenizer.pad_token_id != tokenizer.eos_token_id


def test_greedy_heldout_accuracy_leaves_room_to_improve(loaded):
    model, tokenizer = loaded
    rows = arithmetic.make_split("heldout", 50, seed=0)
    prompts = mx.array([tokenizer.encode(r["prompt"]) for r in rows])
    generated = decode_batch(model, prompts, temperature=0.0).tolist()
    correct = 0
    for ids, row in zip(generated, rows):
        if tokenizer.eos_token_id in ids:
            ids = ids[: ids.index(tokenizer.eos_token_id)]
        text = tokenizer.decode(ids)
        # Even wrong answers keep the trained format.
        assert re.fullmatch(r"<reasoning>[01]{3}</reasoning><answer>\d+</answer>", text), text
        correct += is_correct(text, row["answer"])
    assert 0.05 < correct / len(rows) < 0.80
