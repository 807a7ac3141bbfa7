"""The real-model recipes' data (configs/smollm2_sums.yaml, configs/gemma3_larger.yaml,
configs/gemma3_subtraction.yaml and configs/qwen_think.yaml): reproducible, and
their held-out questions never trained on."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from mlx_grpo.config.train_config import load_config
from mlx_grpo.data import load_datasets
from mlx_grpo.rewards.loading import load_reward_functions

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize("stem", ["sums", "subtraction", "larger", "chains"])
def test_shipped_files_are_what_the_generator_writes(tmp_path, monkeypatch, stem):
    monkeypatch.syspath_prepend(str(CONFIGS / "data"))  # as when run as a script: make_subtraction and make_larger import make_sums
    spec = importlib.util.spec_from_file_location(f"make_{stem}", CONFIGS / "data" / f"make_{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(tmp_path)
    for name in (f"{stem}_train.jsonl", f"{stem}_heldout.jsonl"):
        assert (tmp_path / name).read_text() == (CONFIGS / "data" / name).read_text()


def test_recipe_holds_out_200_distinct_sums_never_trained_in_either_order():
    config = load_config(CONFIGS / "smollm2_sums.yaml")
    train, heldout = load_datasets(config, CONFIGS)
    operands = lambda row: [int(x) for x in row["prompt"].removeprefix("What is ").rstrip("?").split(" + ")]  # noqa: E731
    assert len(heldout) == 200 and len({row["prompt"] for row in heldout}) == 200
    assert not {frozenset(operands(r)) for r in heldout} & {frozenset(operands(r)) for r in train}
    assert all(str(sum(operands(row))) == row["answer"] for row in train + heldout)
    assert config.correctness == "last_number"
    assert [f.name for f in load_reward_functions([(s.name, s.weight) for s in config.rewards], CONFIGS)] == [
        "last_number_check", "last_number_digits"]


def test_gemma_recipe_holds_out_100_distinct_differences_never_trained_on():
    config = load_config(CONFIGS / "gemma3_subtraction.yaml")
    train, heldout = load_datasets(config, CONFIGS)
    operands = lambda row: [int(x) for x in row["prompt"].removesuffix(" =").split(" - ")]  # noqa: E731
    assert len(heldout) == 100 and len({row["prompt"] for row in heldout}) == 100
    assert not {row["prompt"] for row in heldout} & {row["prompt"] for row in train}
    assert all(str(a - b) == row["answer"] and 5 <= a <= 30 and 1 <= b <= min(9, a)
               for row in train + heldout for a, b in [operands(row)])
    assert [f.name for f in load_reward_functions([(s.name, s.weight) for s in config.rewards], CONFIGS)] == [
        "first_line_check"]


def test_gemma_recipe_holds_out_100_distinct_pairs_never_trained_in_either_order():
    config = load_config(CONFIGS / "gemma3_larger.yaml")
    train, heldout = load_datasets(config, CONFIGS)
    def operands(row):
        return [int(x) for x in row["prompt"].removeprefix("larger of ").rstrip(":").split(" and ")]
    assert len(heldout) == 100 and len({row["prompt"] for row in heldout}) == 100
    assert not {frozenset(operands(r)) for r in heldout} & {frozenset(operands(r)) for r in train}
    assert all(str(max(a, b)) == row["answer"] and a != b and 10 <= min(a, b) and max(a, b) <= 99
               for row in train + heldout for a, b in [operands(row)])
    # both orders are asked, so "answer the first number" is right only half the time
    assert 0.4 < sum(operands(r)[0] > operands(r)[1] for r in train) / len(train) < 0.6
    assert config.stop_at_newline and [f.name for f in load_reward_functions(
        [(s.name, s.weight) for s in config.rewards], CONFIGS)] == ["first_line_check"]


def test_thinking_recipe_answers_are_the_chains_values_and_its_held_out_chains_are_never_trained():
    config = load_config(CONFIGS / "qwen_think.yaml")
    train, heldout = load_datasets(config, CONFIGS)
    chain = lambda row: row["prompt"].split("\n")[0].removeprefix("Compute ").rstrip(".")  # noqa: E731

    def value(text: str) -> int:
        terms = text.split(" ")
        return int(terms[0]) + sum(int(n) if op == "+" else -int(n) for op, n in zip(terms[1::2], terms[2::2]))

    assert len(heldout) == config.eval_size == 32 and not {chain(r) for r in heldout} & {chain(r) for r in train}
    assert all(str(value(chain(row))) == row["answer"] for row in train + heldout)
    assert all("<reasoning>" in row["prompt"] and "<answer>" in row["prompt"] for row in heldout)
    assert config.correctness == "answer" and config.max_generation_steps == 512
    # the form is paid only with a right answer; format_exact is charted (format adherence), never paid
    assert [(r.name, r.weight) for r in config.rewards] == [("answer_in_form", 1.0), ("format_exact", 0.0)]
