"""The default arithmetic task: splits, determinism, answers, difficulty, target format."""

import re

import pytest

from mlx_grpo.common.errors import UserError
from mlx_grpo.tasks import arithmetic
from mlx_grpo.tasks.answer_format import is_correct

PROMPT_RE = re.compile(r"^(\d{3})\+(\d{3})=$")


def operands(row):
    a, b = PROMPT_RE.match(row["prompt"]).groups()
    return int(a), int(b)


def test_train_and_heldout_share_no_pair_in_either_order():
    train = {operands(r) for r in arithmetic.make_split("train", 20000, seed=0)}
    heldout = {operands(r) for r in arithmetic.make_split("heldout", 2000, seed=0)}
    assert train.isdisjoint(heldout)
    assert train.isdisjoint({(b, a) for a, b in heldout})


def test_split_membership_is_fixed_and_about_ten_percent_held_out():
    pairs = [(a, b) for a in range(0, 1000, 7) for b in range(0, 1000, 3)]
    held = [arithmetic.split_of(a, b) == "heldout" for a, b in pairs]
    assert 0.08 < sum(held) / len(held) < 0.12
    assert all(arithmetic.split_of(a, b) == arithmetic.split_of(b, a) for a, b in pairs[:500])
    # Rows of a seed come only from their own split, whatever the seed.
    for seed in (0, 1, 2):
        assert all(arithmetic.split_of(*operands(r)) == "heldout" for r in arithmetic.make_split("heldout", 300, seed))


def test_same_seed_same_rows_other_seed_other_rows():
    assert arithmetic.make_split("train", 500, seed=3) == arithmetic.make_split("train", 500, seed=3)
    assert arithmetic.make_split("train", 500, seed=3) != arithmetic.make_split("train", 500, seed=4)
    # A longer draw starts with the shorter one, so growing n keeps earlier rows.
    assert arithmetic.make_split("heldout", 300, seed=5)[:100] == arithmetic.make_split("heldout", 100, seed=5)


def test_prompts_have_fixed_width_and_answers_are_the_sum():
    rows = arithmetic.make_split("train", 3000, seed=1) + arithmetic.make_split("heldout", 300, seed=1)
    for row in rows:
        a, b = operands(row)
        assert len(row["prompt"]) == 8
        assert row["answer"] == str(a + b)
        assert not (len(row["answer"]) > 1 and row["answer"].startswith("0"))
    assert arithmetic.make_row(47, 302) == {"prompt": "047+302=", "answer": "349", "difficulty": 3}
    assert arithmetic.make_row(999, 999)["answer"] == "1998"
    assert arithmetic.make_row(0, 0)["answer"] == "0"


def test_difficulty_is_digits_of_larger_operand_and_all_levels_occur():
    rows = arithmetic.make_split("train", 3000, seed=2)
    for row in rows:
        assert row["difficulty"] == len(str(max(operands(row))))
    counts = {d: sum(r["difficulty"] == d for r in rows) for d in (1, 2, 3)}
    # Documented mix: about 1/9, 3/9, 5/9.
    assert 0.07 < counts[1] / len(rows) < 0.15
    assert 0.28 < counts[2] / len(rows) < 0.39
    assert 0.50 < counts[3] / len(rows) < 0.61
    assert arithmetic.make_row(9, 5)["difficulty"] == 1
    assert arithmetic.make_row(3, 10)["difficulty"] == 2


def test_completion_format_and_answer_extraction():
    row = arithmetic.make_row(47, 302)
    completion = arithmetic.format_completion(row)
    assert completion == "<reasoning>000</reasoning><answer>349</answer>"
    assert arithmetic.format_completion(arithmetic.make_row(58, 67)) == "<reasoning>110</reasoning><answer>125</answer>"
    assert (arithmetic.format_completion(arithmetic.make_row(999, 1))
            == "<reasoning>111</reasoning><answer>1000</answer>")
    assert is_correct(completion, row["answer"])
    assert is_correct("<reasoning>111</reasoning><answer>349</answer>", row["answer"])  # graded on the answer only
    assert not is_correct("<reasoning>000</reasoning><answer>348</answer>", row["answer"])
    assert not is_correct("<reasoning>000</reasoning><answer>349", row["answer"])
    assert not is_correct("no tags at all", row["answer"])


def test_carries_are_the_carry_out_of_each_column_units_first():
    for a in range(0, 1000, 37):
        for b in range(0, 1000, 41):
            c = arithmetic.carries(a, b)
            sums = [(a // 10**i) % 10 + (b // 10**i) % 10 for i in range(3)]
            carry_in = [0] + [int(x) for x in c[:2]]
            assert c == "".join(str(int(s + ci >= 10)) for s, ci in zip(sums, carry_in))
            assert int(c[2]) == (a + b >= 1000)


def test_bad_arguments_are_refused_with_one_line():
    with pytest.raises(UserError, match="split"):
        arithmetic.make_split("test", 10, seed=0)
    with pytest.raises(UserError, match=">= 0"):
        arithmetic.make_split("train", -1, seed=0)
    assert arithmetic.make_split("train", 0, seed=0) == []


def test_conversational_prompts_are_rendered_with_the_chat_template(tmp_path):
    from mlx_grpo.data import read_jsonl_dataset, render_prompt

    data = tmp_path / "chat.jsonl"
    data.write_text('{"prompt": [{"role": "system", "content": "Add."}, {"role": "user", "content": "1+1="}], '
                    '"answer": 2}\n')
    (row,) = read_jsonl_dataset(data, "auto", "prompt", "answer")
    assert row["messages"][1] == {"role": "user", "content": "1+1="} and row["prompt"] == "system: Add.\nuser: 1+1="

    class ChatTokenizer:
        chat_template = "{{ messages }}"

        def apply_chat_template(self, messages, add_generation_prompt, tokenize):
            self.seen = messages
            return [1, 2, 3]

    tokenizer = ChatTokenizer()
    assert render_prompt(tokenizer, row["prompt"], "ignored: the conversation has its own", True,
                         row["messages"]) == [1, 2, 3]
    assert tokenizer.seen == row["messages"]  # the conversation's own system message stays first
    assert render_prompt(object(), row["prompt"], None, True, row["messages"]) == "Add.\n1+1="
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": [{"role": "user"}], "answer": 1}\n')
    with pytest.raises(UserError, match=r"bad.jsonl:1: field 'prompt' is a list, so it must hold messages"):
        read_jsonl_dataset(bad, "auto", "prompt", "answer")


def test_a_huge_prompt_is_cut_before_it_is_tokenized_with_the_same_tokens_kept():
    from mlx_grpo.config.train_config import load_config
    from mlx_grpo.data import MAX_CHARS_PER_TOKEN, encode_prompt
    from mlx_grpo.tools.build_default_model import build_tokenizer

    class Wrapped:  # the shipped character-level tokenizer, as mlx-lm hands it over; remembers its input
        chat_template = None

        def __init__(self):
            self.inner, self.longest = build_tokenizer(), 0

        def encode(self, text):
            self.longest = max(self.longest, len(text))
            return self.inner.encode(text).ids

    tokenizer, config = Wrapped(), load_config(None, {"max_prompt_length": 32})
    text = "12+34=" * 2_000_000  # 12 MB
    encoded = encode_prompt(tokenizer, text, config)
    assert tokenizer.longest <= 32 * MAX_CHARS_PER_TOKEN  # not the 12 MB
    assert encoded.truncated and encoded.tokens == Wrapped().encode(text[-10_000:])[-32:]
