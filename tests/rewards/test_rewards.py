import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
from package_strings import string_literals

from mlx_grpo.common.errors import UserError
from mlx_grpo.rewards.builtin import (
    BUILTINS,
    answer_check,
    answer_in_form,
    digit_match,
    format_approx,
    format_exact,
    last_number_check,
    last_number_digits,
    number_check,
)
from mlx_grpo.rewards.loading import load_reward_functions
from mlx_grpo.rewards.scoring import score_completions
from mlx_grpo.tasks.answer_format import TAGS, extract_answer, is_correct, last_number

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def done(answer, reasoning="12 * 10 = 120"):
    return f"<reasoning>{reasoning}</reasoning>\n<answer>{answer}</answer>"


def one(fn, completion, answer="120"):
    return fn(["p"], [completion], [answer])[0]


PERFECT = done("120")


# ------------------------------------------------------------ format_exact


@pytest.mark.parametrize(
    "completion",
    [PERFECT, "<reasoning>r</reasoning><answer>1</answer>", "\n <reasoning>r\n</reasoning>\n\n<answer> 1 </answer>\n"],
)
def test_format_exact_accepts_the_format_with_whitespace_between(completion):
    assert one(format_exact, completion) == 3.0


@pytest.mark.parametrize(
    "completion",
    [
        "<reasoning>r</reasoning>",  # missing answer block
        "<reasoning>r</reasoning><answer>1",  # unclosed answer
        "<reasoning>r</reasoning><answer>1</answer><answer>2</answer>",  # duplicated
        "<reasoning>a</reasoning><reasoning>b</reasoning><answer>1</answer>",
        PERFECT + " and that is it",  # trailing junk
        "Sure! " + PERFECT,  # leading junk
        "<reasoning>r</reasoning> so <answer>1</answer>",  # junk between blocks
        "<answer>1</answer><reasoning>r</reasoning>",  # wrong order
        "120",
    ],
)
def test_format_exact_rejects_anything_else(completion):
    assert one(format_exact, completion) == 0.0


# ----------------------------------------------------------- format_approx


@pytest.mark.parametrize(
    "completion, expected",
    [
        (PERFECT, 2.5),
        ("just 120", -2.5),
        (PERFECT + " trailing", 2.0),  # counts and order fine, layout broken
        ("<reasoning>r</reasoning><answer>120", 0.5),  # </answer> missing: 1.5 - 0.5 - 0.25 - 0.25
        ("<answer>1</answer><reasoning>r</reasoning>", 1.5),  # all once, wrong order
        ("<reasoning>r</reasoning><answer>1</answer><answer>2</answer>", 0.5),  # two tags duplicated
    ],
)
def test_format_approx_partial_credit(completion, expected):
    assert one(format_approx, completion) == expected


def random_completion(rng):
    pieces = ["<reasoning>", "</reasoning>", "<answer>", "</answer>", "x", "42", " ", "\n", "<", "answer>"]
    if rng.random() < 0.5:
        return "".join(rng.choice(pieces) for _ in range(rng.randrange(12)))
    # Mutate the perfect shape so near-perfect strings are common too.
    parts = ["<reasoning>", "x", "</reasoning>", "\n", "<answer>", "42", "</answer>"]
    for _ in range(rng.randrange(3)):
        op = rng.randrange(3)
        if op == 0 and parts:
            parts.pop(rng.randrange(len(parts)))
        elif op == 1:
            parts.insert(rng.randrange(len(parts) + 1), rng.choice(pieces))
        elif parts:
            parts.insert(rng.randrange(len(parts) + 1), rng.choice(parts))
    return "".join(parts)


def test_format_approx_stays_in_range_and_tops_out_only_on_exact_format():
    rng = random.Random(0)
    completions = [random_completion(rng) for _ in range(5000)]
    approx = format_approx([], completions, [])
    exact = format_exact([], completions, [])
    assert min(approx) == -2.5 and max(approx) == 2.5
    for text, a, e in zip(completions, approx, exact):
        assert -2.5 <= a <= 2.5 and (a * 4).is_integer(), text
        assert (a == 2.5) == (e == 3.0), text
        assert e in (0.0, 3.0)


# ------------------------------------------------------------ answer_check


@pytest.mark.parametrize(
    "answer_text, expected, score",
    [
        ("120", "120", 3.0),
        ("  120 ", "120", 3.0),
        ("1,234", "1234", 1.5),
        ("$1234", "1234", 1.5),
        ("1 234", "1234", 1.5),
        ("120.0", "120", 1.5),
        ("120.", "120", 1.5),
        ("Paris", "paris", 1.5),
        ("126", "120", 0.5),  # 5% high
        ("114", "120", 0.5),  # 5% low
        ("138", "120", 0.25),  # 15% high
        ("102", "120", 0.25),  # 15% low
        ("150", "120", -1.0),  # 25% off
        ("-120", "120", -1.0),
        ("0.05", "0", -1.0),  # no ratio against zero
        ("London", "Paris", -1.0),
    ],
)
def test_answer_check_tiers(answer_text, expected, score):
    assert one(answer_check, done(answer_text), expected) == score


def test_answer_check_missing_answer_is_wrong():
    assert one(answer_check, "<reasoning>120</reasoning> 120") == -1.0
    assert one(answer_check, "<answer>120") == -1.0


# ------------------------------------------------------------ answer_in_form


@pytest.mark.parametrize("completion, score", [
    (PERFECT, 2.0),                                                    # right, in the form
    (done("120.0"), 2.0),                                              # right by value
    ("12 * 10 is <answer>120</answer>", 1.4),                          # right, no reasoning block
    ("<reasoning>12 * 10 = 120\n<answer>120</answer>", 1.6),           # right, reasoning never closed
    ("<reasoning>12 * 10 = 120</reasoning><answer>120</answer> ok", 1.9),   # right, a word after the form
    (done("121"), 0.0),                                                # the form alone earns nothing
    (done("119", reasoning=""), 0.0),                                  # nor an empty guess, however near
    ("<reasoning>12 * 10 = 120</reasoning>", 0.0),                     # no answer block
    ("", 0.0),
])
def test_answer_in_form_pays_the_form_only_with_a_right_answer(completion, score):
    # a right answer earns 1, and each step towards the form a little more: a model that never writes the whole
    # form is still shown which right answers came closer to it
    assert one(answer_in_form, completion) == pytest.approx(score)


def test_a_group_with_no_right_answer_gets_no_signal_from_answer_in_form():
    # what stops format gaming: formatted wrong guesses and rambling without tags score the same
    group = [done("7", reasoning=""), "I think it is 120-ish", done("121"), "<reasoning>hmm"]
    assert answer_in_form(["p"] * 4, group, ["120"] * 4) == [0.0] * 4


# ------------------------------------------------------------ number_check


@pytest.mark.parametrize(
    "completion, expected, score",
    [
        (done("120"), "120", 1.5),
        (done("The total is 1,500 apples"), "1500", 1.5),
        (done("120.0"), "120", 1.5),
        (done("3 boxes, 120 apples"), "120", 0.0),  # first number is 3
        (done("126"), "120", 0.0),
        (done("none"), "120", 0.0),
        ("<reasoning>so 120</reasoning>", "120", 0.0),  # no answer block
    ],
)
def test_number_check(completion, expected, score):
    assert one(number_check, completion, expected) == score


# ------------------------------------------------------------- digit_match


@pytest.mark.parametrize(
    "completion, expected, score",
    [
        (done("349"), "349", 2.0),
        (done("359"), "349", pytest.approx(4 / 3)),  # tens wrong
        (done("1349"), "349", 1.5),  # an extra leading digit: 3 of 4 positions
        (done("49"), "349", pytest.approx(4 / 3)),  # a dropped leading digit is a miss, units still meet units
        (done("943"), "349", pytest.approx(2 / 3)),  # reversed: only the middle digit is in place
        (done(" 349 "), "349", 2.0),
        (done("3.49"), "349", 0.0),  # not a whole number
        (done("-349"), "349", 0.0),
        (done(""), "349", 0.0),
        ("<reasoning>349</reasoning>", "349", 0.0),  # no answer block
        (done("12"), "twelve", 0.0),
    ],
)
def test_digit_match_gives_partial_credit_per_digit_in_place(completion, expected, score):
    assert one(digit_match, completion, expected) == score


def test_digit_match_ranks_near_misses_above_far_misses():
    scores = digit_match(["p"] * 4, [done(a) for a in ("1000", "1001", "1011", "1111")], ["1111"] * 4)
    assert scores == sorted(scores) and scores[-1] == 2.0 and scores[0] == 0.5


def test_aliases_are_the_seed_names():
    assert BUILTINS["check_answer"] is answer_check
    assert BUILTINS["check_numbers"] is number_check


# ------------------------------------------------ extract_answer, is_correct


def test_extract_answer_takes_the_last_complete_block():
    assert extract_answer(done(" 7 ")) == "7"
    assert extract_answer("<answer>1</answer> then <answer>2</answer>") == "2"
    assert extract_answer("<answer>1</answer><answer>2") is None
    assert extract_answer("no tags") is None


def test_is_correct_is_exact_or_same_number():
    assert is_correct(done("120"), "120")
    assert is_correct(done("1,000"), "1000")
    assert is_correct(done("$120.0"), " 120 ")
    assert not is_correct(done("126"), "120")
    assert not is_correct(done("paris"), "Paris")
    assert not is_correct("120", "120")


# ------------------------------------------------ replies in prose: the last number


def test_last_number_is_the_replys_final_number():
    assert last_number("To add 7 and 5: 7 + 5 = 12.") == "12"
    assert last_number("That makes 1,234 apples") == "1234"
    assert last_number("The answer is twelve.") is None


def test_is_correct_can_read_the_last_number_instead_of_tags():
    reply = "To add 9 and 21, we add them together: 9 + 21 = 30."
    assert is_correct(reply, "30", "last_number")
    assert not is_correct(reply, "30")  # no answer block: wrong by the default check
    assert not is_correct("9 + 21 = 30, and 30 + 1 = 31", "30", "last_number")
    assert is_correct(done("30"), "30", "last_number")


def test_last_number_rewards_score_correct_near_and_missing_answers():
    replies = ["9 + 21 = 30.", "9 + 21 = 31.", "9 + 21 = 40.", "It is 13", "I cannot say."]
    assert last_number_check(["p"] * 5, replies, ["30"] * 5) == [2.0, 0.0, 0.0, 0.0, 0.0]
    assert last_number_digits(["p"] * 5, replies, ["30"] * 5) == [1.0, 0.5, 0.5, 0.0, 0.0]
    assert BUILTINS["last_number_check"] is last_number_check


# ---------------------------------------------------------------- loading


def write(path, text):
    path.write_text(text)
    return path


def test_loads_builtins_and_user_file_relative_or_absolute(tmp_path):
    body = "def length(prompts, completions, answers, **columns):\n    return [len(c) for c in completions]\n"
    write(tmp_path / "mine.py", body)
    funcs = load_reward_functions(
        [("format_exact", 1.0), ("check_answer", 2), ("mine.py:length", 0.5)], base_dir=tmp_path
    )
    assert [f.name for f in funcs] == ["format_exact", "check_answer", "length"]
    assert [f.weight for f in funcs] == [1.0, 2.0, 0.5]
    assert funcs[2].fn([], ["ab", "abc"], []) == [2, 3]
    absolute = load_reward_functions({f"{tmp_path / 'mine.py'}:length": 1.0}.items(), base_dir="/")
    assert absolute[0].fn([], ["x"], []) == [1]


@pytest.mark.parametrize(
    "files, spec, message",
    [
        ({}, "nope.py:f", "reward file not found"),
        ({"bad.py": "import not_a_module_xyz\n"}, "bad.py:f", "ModuleNotFoundError: No module named 'not_a_mod"),
        ({"bad.py": "def f(:\n"}, "bad.py:f", "cannot import reward file"),
        ({"bad.py": "raise RuntimeError('boom\\nmore')\n"}, "bad.py:f", "RuntimeError: boom"),
        ({"ok.py": "def g(*a, **k): return []\n"}, "ok.py:f", "has no function 'f'"),
        ({"ok.py": "f = 3\n"}, "ok.py:f", "'f' is a int, not a function"),
        ({}, "format_exactly", "built-ins are answer_check, answer_in_form, check_answer"),
        ({}, "ok.py:", "expected 'path/to/file.py:function_name'"),
    ],
)
def test_loading_errors_are_one_line(tmp_path, files, spec, message):
    for name, text in files.items():
        write(tmp_path / name, text)
    with pytest.raises(UserError) as err:
        load_reward_functions([(spec, 1.0)], tmp_path)
    assert message in str(err.value)
    assert "\n" not in str(err.value)
    if files:
        assert str(tmp_path / next(iter(files))) in str(err.value)


def test_duplicate_names_and_bad_weights_are_refused(tmp_path):
    with pytest.raises(UserError, match="listed twice"):
        load_reward_functions([("format_exact", 1.0), ("format_exact", 2.0)], tmp_path)
    with pytest.raises(UserError, match="weight must be a finite number"):
        load_reward_functions([("format_exact", float("nan"))], tmp_path)


# ---------------------------------------------------------------- scoring


def user_funcs(tmp_path, body, weight=1.0):
    write(tmp_path / "user.py", body)
    return load_reward_functions([("format_exact", 1.0), ("user.py:f", weight)], tmp_path)


def test_scores_matrix_and_weighted_total_with_missing(tmp_path):
    body = "def f(prompts, completions, answers, **columns):\n    return [None, 2, float('nan')]\n"
    funcs = user_funcs(tmp_path, body, weight=0.5)
    scores = score_completions(funcs, ["p"] * 3, [PERFECT, "x", PERFECT], ["120"] * 3)
    assert scores.names == ["format_exact", "f"]
    assert scores.per_function.shape == (2, 3)
    np.testing.assert_array_equal(scores.per_function[0], [3.0, 0.0, 3.0])
    assert math.isnan(scores.per_function[1, 0]) and scores.per_function[1, 1] == 2.0
    np.testing.assert_array_equal(scores.total, [3.0, 1.0, 3.0])
    assert scores.new_errors == []


def test_raising_function_gives_nan_and_is_reported_once(tmp_path):
    funcs = user_funcs(tmp_path, "def f(prompts, completions, answers, **columns):\n    raise ValueError('bad row')\n")
    first = score_completions(funcs, ["p"] * 2, [PERFECT, "x"], ["120"] * 2)
    second = score_completions(funcs, ["p"] * 2, [PERFECT, "x"], ["120"] * 2)
    assert np.isnan(first.per_function[1]).all() and np.isnan(second.per_function[1]).all()
    np.testing.assert_array_equal(second.per_function[0], [3.0, 0.0])
    np.testing.assert_array_equal(second.total, [3.0, 0.0])
    assert len(first.new_errors) == 1 and second.new_errors == []
    assert "'f' raised ValueError: bad row at user.py:2" in first.new_errors[0]


@pytest.mark.parametrize(
    "returns, message",
    [
        ("[1.0]", "'f' returned 1 scores for 2 completions"),
        ("None", "'f' returned NoneType, expected a list of 2 scores"),
        ("[1.0, 'good']", "'f' returned 'good' at index 1"),
        ("[1.0, float('inf')]", "returned inf at index 1"),
    ],
)
def test_bad_return_values_stop_the_run(tmp_path, returns, message):
    funcs = user_funcs(tmp_path, f"def f(prompts, completions, answers, **columns):\n    return {returns}\n")
    with pytest.raises(UserError, match=message):
        score_completions(funcs, ["p"] * 2, [PERFECT, "x"], ["120"] * 2)


def test_example_file_receives_extra_columns():
    specs = [("rewards_example.py:difficulty_bonus", 1.0), ("rewards_example.py:brevity", 1.0)]
    funcs = load_reward_functions(specs, CONFIGS)
    completions = [PERFECT, done("7"), "no answer " * 100]
    scores = score_completions(funcs, ["p"] * 3, completions, ["120"] * 3, {"difficulty": [2, 3, 4]})
    np.testing.assert_array_equal(scores.per_function[0], [2.0, 0.0, 0.0])
    assert scores.per_function[1, 0] == 0.5 and math.isnan(scores.per_function[1, 2])
    without = score_completions(funcs, ["p"], [PERFECT], ["120"])
    assert np.isnan(without.per_function[0]).all()


def test_a_reward_function_failing_on_every_batch_stops_the_run_with_its_error():
    from mlx_grpo.rewards.scoring import MAX_FAILED_BATCHES, RewardFunction, score_completions

    calls = {"n": 0}

    def flaky(prompts, completions, answers, **columns):
        calls["n"] += 1
        if calls["n"] == 2:
            return [1.0] * len(completions)  # one good batch resets the count
        raise KeyError("score")

    reward = RewardFunction("flaky", flaky, 1.0)
    assert MAX_FAILED_BATCHES == 3
    for _ in range(4):
        score_completions([reward], ["p"], ["c"], ["a"])  # fail, work, fail, fail: not yet
    with pytest.raises(UserError, match=r"reward function 'flaky' failed on 3 batches in a row: KeyError"):
        score_completions([reward], ["p"], ["c"], ["a"])


def test_reward_functions_are_called_by_keyword_as_trl_does_and_the_positional_form_still_works():
    from mlx_grpo.rewards.scoring import RewardFunction, score_completions

    def trl_style(completions, solution, **kwargs):  # TRL: dataset columns arrive as keywords
        assert kwargs["prompts"] == ["p1", "p2"] and kwargs["answer"] == ["3", "4"]
        return [float(c == s) for c, s in zip(completions, solution)]

    def named_only(completions, answers):
        return [float(c == a) for c, a in zip(completions, answers)]

    def ours(p, c, a, **columns):  # positional, any parameter names
        return [float(x == y) for x, y in zip(c, a)]

    functions = [RewardFunction(f.__name__, f, 1.0) for f in (trl_style, named_only, ours)]
    scores = score_completions(functions, ["p1", "p2"], ["3", "5"], ["3", "4"], {"solution": ["3", "5"]})
    assert scores.per_function.tolist() == [[1.0, 1.0], [1.0, 0.0], [1.0, 0.0]]
    assert scores.new_errors == []


def test_the_answer_tags_are_spelled_only_in_the_tasks_answer_format():
    """Rewards, accuracy, S-GRPO and the default model's tokenizer ask tasks/answer_format.py for the tags."""
    spelled = [f"{where}:{line}" for where, line, value in string_literals()
               if not where.endswith("/answer_format.py") and any(tag in value for tag in TAGS)]
    assert spelled == []


def test_a_trl_conversational_reward_function_gets_message_lists_on_a_chat_dataset(tmp_path):
    """TRL's docs for chat datasets: `completion[0]["content"]`, prompts as lists of messages."""
    from types import SimpleNamespace

    from mlx_grpo.data import extra_columns, read_dataset
    from mlx_grpo.rewards.loading import load_reward_functions
    from mlx_grpo.rewards.scoring import score_completions

    (tmp_path / "trl_rewards.py").write_text(
        "def trl_conv(prompts, completions, answer, **kwargs):\n"
        "    assert prompts[0][-1]['role'] == 'user'\n"
        "    return [1.0 if c[0]['content'].strip() == a else 0.0 for c, a in zip(completions, answer)]\n")
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"}]
    (tmp_path / "chat.jsonl").write_text(json.dumps({"prompt": chat, "answer": "2"}) + "\n")
    (tmp_path / "plain.jsonl").write_text(json.dumps({"prompt": "1+1?", "answer": "2"}) + "\n")
    config = SimpleNamespace(dataset_format="auto", prompt_field="prompt", answer_field="answer")
    functions = load_reward_functions([("trl_rewards.py:trl_conv", 1.0), ("answer_check", 1.0)], tmp_path)
    rows = read_dataset("chat.jsonl", tmp_path, "train", config) * 2
    scores = score_completions(functions, [r["prompt"] for r in rows], ["2", "3"], ["2", "2"], extra_columns(rows))
    assert scores.new_errors == [] and scores.per_function[0].tolist() == [1.0, 0.0]
    # the built-ins keep reading text on the same batch; a plain-text dataset keeps plain strings
    assert not np.isnan(scores.per_function[1]).any()
    plain = read_dataset("plain.jsonl", tmp_path, "train", config)
    text_scores = score_completions(functions, [r["prompt"] for r in plain], ["2"], ["2"], extra_columns(plain))
    assert len(text_scores.new_errors) == 1 and "TypeError" in text_scores.new_errors[0]  # c[0] is '2'
