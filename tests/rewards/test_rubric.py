"""Rubric files: each scorer kind on known completions, validation errors, metrics and the summary table."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from mlx_grpo.common.errors import UserError
from mlx_grpo.rewards.rubric import load_rubric
from mlx_grpo.rewards.rubric_reward import SUMMARY_COLUMNS, RubricReward, rubric_metrics
from mlx_grpo.rewards.rubric_scorers import CriterionFailed

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def write(tmp_path: Path, text: str, name: str = "rubric.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def one_criterion(tmp_path: Path, spec: str) -> Path:
    """A rubric with a single criterion given as indented YAML keys."""
    body = textwrap.indent(textwrap.dedent(spec).strip(), "    ")
    return write(tmp_path, "name: t\ncriteria:\n  - name: c\n    weight: 1\n" + body + "\n")


def scores_of(tmp_path: Path, spec: str, completions: list[str], answers: list[str] | None = None,
              **columns) -> list[float | None]:
    rubric = load_rubric(one_criterion(tmp_path, spec))
    answers = answers or [""] * len(completions)
    result = rubric.score([""] * len(completions), completions, answers, **columns)
    return [None if math.isnan(v) else float(v) for v in result.column("c")]


def test_regex_search_full_flags_and_negate(tmp_path):
    texts = ["<answer>12</answer>", "x <ANSWER>3</ANSWER> y", "none"]
    assert scores_of(tmp_path, r"""
        scorer: regex
        pattern: '<answer>\d+</answer>'
    """, texts) == [1, 0, 0]
    assert scores_of(tmp_path, r"""
        scorer: regex
        pattern: '<answer>\d+</answer>'
        flags: [ignorecase]
    """, texts) == [1, 1, 0]
    assert scores_of(tmp_path, r"""
        scorer: regex
        pattern: '<answer>\d+</answer>'
        flags: [ignorecase]
        match: full
    """, texts) == [1, 0, 0]
    assert scores_of(tmp_path, """
        scorer: regex
        pattern: 'answer'
        negate: true
    """, texts) == [0, 1, 1]


def test_substring_all_any_case_and_negate(tmp_path):
    texts = ["<answer>1</answer>", "<answer>1", "<ANSWER>1</ANSWER>"]
    tags = 'text: ["<answer>", "</answer>"]'
    assert scores_of(tmp_path, f"scorer: substring\n{tags}", texts) == [1, 0, 0]
    assert scores_of(tmp_path, f"scorer: substring\n{tags}\nrequire: any", texts) == [1, 1, 0]
    assert scores_of(tmp_path, f"scorer: substring\n{tags}\ncase_sensitive: false", texts) == [1, 0, 1]
    assert scores_of(tmp_path, "scorer: substring\ntext: sorry\nnegate: true", ["sorry!", "fine"]) == [0, 1]


def test_length_in_chars_and_words_with_slack(tmp_path):
    assert scores_of(tmp_path, "scorer: length\nmin: 3\nmax: 5", ["ab", "abc", "abcde", "abcdef"]) == [0, 1, 1, 0]
    assert scores_of(tmp_path, "scorer: length\nmax: 10\nslack: 10", ["x" * 10, "x" * 15, "x" * 25]) == [1, 0.5, 0]
    assert scores_of(tmp_path, "scorer: length\nunit: words\nmax: 2", ["one two", "one two three"]) == [1, 0]


def test_numeric_answer_uses_answer_tags_when_present(tmp_path):
    completions = [
        "<reasoning>7+2=9</reasoning><answer>349</answer>",
        "<reasoning>the sum is 349</reasoning><answer>348</answer>",  # the tag decides, not the reasoning
        "I think 12, no wait: 349",  # no tags: the last number
        "<answer>0349 apples</answer>",
        "<answer>1,234</answer>",
        "<answer>none</answer>",
        "<answer>5</answer>",
    ]
    answers = ["349", "349", "349", "349", "1234", "349", ""]
    assert scores_of(tmp_path, "scorer: numeric_answer", completions, answers) == [1, 0, 1, 1, 1, 0, None]
    assert scores_of(tmp_path, "scorer: numeric_answer\nrequire_tags: true", completions, answers)[2] == 0
    assert scores_of(tmp_path, "scorer: numeric_answer\ntolerance: 0.001", ["<answer>3.14</answer>"],
                     ["3.1416"]) == [0]
    assert scores_of(tmp_path, "scorer: numeric_answer\ntolerance: 0.001", ["<answer>3.142</answer>"],
                     ["3.1416"]) == [1]


def test_python_criterion_gets_batch_and_columns(tmp_path):
    (tmp_path / "crit").mkdir()
    (tmp_path / "crit" / "mine.py").write_text(textwrap.dedent("""\
        def mentions_topic(prompts, completions, answers, topic, **columns):
            return [None if t is None else float(t in c) for c, t in zip(completions, topic)]
        """))
    spec = "scorer: python\nfile: crit/mine.py\nfunction: mentions_topic"
    assert scores_of(tmp_path, spec, ["about cats", "about dogs", "x"], topic=["cats", "cats", None]) == [1, 0, None]


@pytest.mark.parametrize("body, problem", [
    ("return 1.0", "must return a list of 2 scores, got float"),
    ("return [1.0]", "must return a list of 2 scores, got 1 values"),
    ("return ['good', 'bad']", "returned str 'good'"),
])
def test_python_criterion_returning_the_wrong_thing_is_a_user_error(tmp_path, body, problem):
    (tmp_path / "bad.py").write_text(f"def f(prompts, completions, answers, **columns):\n    {body}\n")
    rubric = load_rubric(one_criterion(tmp_path, "scorer: python\nfile: bad.py\nfunction: f"))
    with pytest.raises(UserError, match="bad.py:f " + problem.replace("[", r"\[")):
        rubric.score(["p", "p"], ["a", "b"], ["x", "x"])


def test_python_criterion_that_raises_is_missing_and_alerted_once(tmp_path):
    (tmp_path / "flaky.py").write_text("def f(prompts, completions, answers, **columns):\n"
                                       "    return [1.0 / len(c) for c in completions]\n")
    path = write(tmp_path, """\
        name: t
        criteria:
          - {name: ratio, weight: 1, scorer: python, file: flaky.py, function: f}
          - {name: tags, weight: 1, scorer: substring, text: "<answer>"}
        """)
    reward = RubricReward(load_rubric(path))
    assert reward(["p", "p"], ["", "<answer>"], ["", ""]) == [0.0, 1.0]  # ratio missing, tags still count
    alerts = reward.take_alerts()
    assert len(alerts) == 1 and alerts[0]["rule"] == "rubric_criterion_failed"
    assert "'ratio' failed: flaky.py:f raised ZeroDivisionError: float division by zero at flaky.py:2" in alerts[0]["message"]
    assert reward.step_metrics(step=1)["criteria/t/ratio/mean"] is None
    reward(["p"], [""], [""])
    assert reward.take_alerts() == []  # the same criterion failing again is not re-reported
    assert reward(["p"], ["abcd"], [""]) == [0.125]  # and it scores again once it works


def test_weighted_total_skips_missing_criteria_and_zero_weight_only_tracks(tmp_path):
    path = write(tmp_path, """\
        name: mix
        criteria:
          - {name: correct, weight: 3, scorer: numeric_answer}
          - {name: tags, weight: 1, scorer: substring, text: "<answer>"}
          - {name: short, weight: 0, scorer: length, max: 5}
        """)
    rubric = load_rubric(path)
    result = rubric.score(["p"] * 3, ["<answer>4</answer>", "<answer>5</answer>", "4"], ["4", "4", ""])
    assert result.matrix.shape == (3, 3)
    assert np.isnan(result.matrix[2, 0])  # no answer to compare with
    # row 0: (3*1 + 1*1) / 4; row 1: (3*0 + 1*1) / 4; row 2: only `tags` (0) and `short` (weight 0) scored
    assert result.total == pytest.approx([1.0, 0.25, 0.0])
    assert rubric.weights == {"correct": 3, "tags": 1, "short": 0}


def test_describe_reports_name_and_criteria_count():
    rubric = load_rubric(CONFIGS / "rubric_math.yaml")
    assert rubric.describe().startswith("Loaded rubric 'math' with 4 criteria: correct (numeric_answer, weight 0.6)")


VALID_CRITERION = "  - name: ok\n    weight: 1\n    scorer: substring\n    text: x\n"


@pytest.mark.parametrize("text, message", [
    ("name: t\ncriteria:\n  - name: c\n    weight: -1\n    scorer: substring\n    text: x\n",
     r"rubric.yaml:4: criterion 'c': weight: must be a number >= 0, got -1"),
    ("name: t\ncriteria:\n  - name: c\n    weight: heavy\n    scorer: substring\n    text: x\n",
     r"rubric.yaml:4: criterion 'c': weight: must be a number, got str 'heavy'"),
    ("name: t\ncriteria:\n  - name: c\n    scorer: substring\n    text: x\n",
     r"rubric.yaml:3: criterion 'c': weight: required"),
    ("name: t\ncriteria:\n" + VALID_CRITERION + "  - name: c\n    weight: 1\n    scorer: vibes\n",
     r"rubric.yaml:9: criterion 'c': scorer: unknown scorer 'vibes'; expected one of regex, substring"),
    ("name: t\ncriteria:\n  - name: c\n    weight: 1\n    scorer: regex\n",
     r"rubric.yaml:3: criterion 'c': pattern: required"),
    ("name: t\ncriteria:\n  - name: c\n    weight: 1\n    scorer: regex\n    pattern: '(unclosed'\n",
     r"rubric.yaml:6: criterion 'c': pattern: not a valid regular expression: missing \), unterminated"),
    ("name: t\ncriteria:\n  - name: c\n    weight: 1\n    scorer: regex\n    patern: x\n",
     r"rubric.yaml:6: criterion 'c': patern: unknown key; expected one of description, flags, match, name"),
    ("name: t\ncriteria:\n  - weight: 1\n    scorer: regex\n    pattern: x\n",
     r"rubric.yaml:3: criteria\[0\]: name: required"),
    ("name: t\ncriteria:\n" + VALID_CRITERION + VALID_CRITERION,
     r"rubric.yaml:7: criterion 'ok': name: duplicate criterion name 'ok'"),
    ("name: My Rubric\ncriteria:\n" + VALID_CRITERION,
     r"rubric.yaml:1: name: 'My Rubric' must be lowercase letters, digits"),
    ("criteria:\n" + VALID_CRITERION, r"rubric.yaml:1: name: required"),
    ("name: t\ncriteria: []\n", r"rubric.yaml:2: criteria: must be a non-empty list"),
    ("name: t\ncriteria:\n  - name: c\n    weight: 0\n    scorer: length\n    max: 3\n",
     r"rubric.yaml:2: criteria: at least one criterion needs a weight above 0"),
    ("name: t\ncriteria:\n  - name: c\n    weight: 1\n    scorer: length\n    unit: chars\n",
     r"rubric.yaml:3: criterion 'c': min: a length scorer needs min, max or both"),
    ("name: t\ncriteria:\n  - name: c\n    weight: 1\n    scorer: length\n    min: 9\n    max: 3\n",
     r"rubric.yaml:7: criterion 'c': max: must be >= min \(9\), got 3"),
    ("name: t\ncriteria:\n  - name: c\n    weight: 1\n    scorer: python\n    file: nowhere.py\n    function: f\n",
     r"rubric.yaml:6: criterion 'c': file: file not found: .*nowhere.py"),
    ("name: t\ncriteria:\n  - name: c\n    weight: 1\n    scorer: judge\n    range: [0, 10]\n    prompt: '{completion}'\n",
     r"rubric.yaml:1: judge: required when a criterion uses scorer: judge"),
    ("name: t\ncriteria:\n" + VALID_CRITERION + "oops: [1\n", r"rubric.yaml:8: not valid YAML"),
    ("- just\n- a list\n", r"rubric.yaml:1: rubric: must be a mapping of keys, got list"),
    ("name: t\njudge:\n  url: http://127.0.0.1:8080\ncriteria:\n" + VALID_CRITERION,
     r"rubric.yaml:2: judge: no criterion uses scorer: judge"),
])
def test_validation_errors_name_file_line_and_key(tmp_path, text, message):
    with pytest.raises(UserError, match=message):
        load_rubric(write(tmp_path, text))


def judge_rubric(tmp_path, criterion: str, judge: str = "url: http://127.0.0.1:8080/v1") -> Path:
    return write(tmp_path, "name: t\njudge:\n  " + judge + "\ncriteria:\n  - name: q\n    weight: 1\n"
                 "    scorer: judge\n" + textwrap.indent(textwrap.dedent(criterion).strip(), "    ") + "\n")


@pytest.mark.parametrize("criterion, judge, message", [
    ("range: [10, 0]\nprompt: '{completion}'", None, r"criterion 'q': range: must be \[low, high\] with low < high"),
    ("range: [0, 10]\nprompt: 'Rate it'", None, r"criterion 'q': prompt: the judge prompt must contain \{completion\}"),
    ("range: [0, 10]", None, "criterion 'q': prompt: give exactly one of prompt or prompt_file"),
    ("range: [0, 10]\nprompt_file: judge.txt", None, "criterion 'q': prompt_file: file not found"),
    ("range: [0, 10]\nprompt: '{completion}'", "url: ftp://127.0.0.1/", "judge: url: must be an http:// or https://"),
    ("range: [0, 10]\nprompt: '{completion}'", "timeout: 5", "judge: url: required"),
    ("range: [0, 10]\nprompt: '{completion}'", "url: http://127.0.0.1:1\n  retries: 1.5",
     "judge: retries: must be an integer, got float 1.5"),
])
def test_judge_validation_errors(tmp_path, criterion, judge, message):
    kwargs = {} if judge is None else {"judge": judge}
    with pytest.raises(UserError, match=message):
        load_rubric(judge_rubric(tmp_path, criterion, **kwargs))


def test_judge_prompt_file_is_relative_to_the_rubric(tmp_path):
    (tmp_path / "judge.txt").write_text("Score {completion} for {prompt}.")
    rubric = load_rubric(judge_rubric(tmp_path, "range: [0, 10]\nprompt_file: judge.txt"))
    assert rubric.criteria[0].scorer.template == "Score {completion} for {prompt}."


@pytest.mark.parametrize("source, message", [
    ("def g(*a, **k):\n    return []\n", "function: mine.py defines no function 'f'"),
    ("f = 3\n", "function: mine.py:f is not callable"),
    ("def f(:\n", "file: importing mine.py failed: line 1"),
    ("import not_a_module_anywhere\n", "file: importing mine.py failed: ModuleNotFoundError"),
])
def test_python_file_problems_are_reported_on_load(tmp_path, source, message):
    (tmp_path / "mine.py").write_text(source)
    with pytest.raises(UserError, match=r"rubric.yaml:\d+: criterion 'c': " + message):
        load_rubric(one_criterion(tmp_path, "scorer: python\nfile: mine.py\nfunction: f"))


def test_yaml_is_safe_loaded(tmp_path):
    path = write(tmp_path, "name: !!python/object/apply:os.system ['echo pwned']\ncriteria: []\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_rubric(path)


def small_rubric(tmp_path):
    return load_rubric(write(tmp_path, """\
        name: m
        criteria:
          - {name: correct, weight: 0.75, scorer: numeric_answer}
          - {name: tags, weight: 0.25, scorer: substring, text: "<answer>"}
        """))


def test_reward_adapter_and_step_metrics(tmp_path):
    reward = RubricReward(small_rubric(tmp_path), criteria_every=5)
    assert reward.__name__ == "rubric"
    totals = reward(["p"] * 4, ["<answer>1</answer>", "<answer>2</answer>", "1", "x"], ["1", "1", "1", ""])
    assert totals == pytest.approx([1.0, 0.25, 0.75, 0.0])

    first = reward.step_metrics(step=1)  # the first call always carries the criteria
    assert first["rewards/rubric/mean"] == pytest.approx(0.5)
    assert first["rewards/rubric/min"] == 0.0 and first["rewards/rubric/max"] == 1.0
    assert first["criteria/m/correct/mean"] == pytest.approx(2 / 3)  # the sample without answer is missing
    assert first["criteria/m/tags/mean"] == pytest.approx(0.5)
    assert first["scoring/correct/weight"] == 0.75 and first["scoring/tags/weight"] == 0.25
    assert not any(k.startswith("judge/") for k in first)  # no judge in this rubric

    reward(["p"], ["<answer>1</answer>"], ["1"])
    second = reward.step_metrics(step=2)
    assert second == {"rewards/rubric/mean": 1.0, "rewards/rubric/min": 1.0, "rewards/rubric/max": 1.0}
    reward(["p"], ["<answer>3</answer>"], ["1"])
    fifth = reward.step_metrics(step=5)
    assert fifth["criteria/m/correct/mean"] == 0.0 and fifth["criteria/m/tags/mean"] == 1.0


def test_metrics_are_null_not_nan_when_nothing_scored(tmp_path):
    rubric = small_rubric(tmp_path)
    metrics = rubric_metrics(rubric, [rubric.score(["p"], ["x"], [""])], include_criteria=True)
    assert metrics["criteria/m/correct/mean"] is None
    assert rubric_metrics(rubric, [], include_criteria=True)["rewards/rubric/mean"] is None


def test_summary_table_matches_all_scores_and_is_written(tmp_path):
    rubric = small_rubric(tmp_path)
    reward = RubricReward(rubric)
    batches = [(["<answer>1</answer>", "<answer>2</answer>"], ["1", "1"]),
               (["1", "<answer>7</answer>", "x"], ["1", "7", ""])]
    for completions, answers in batches:
        reward(["p"] * len(completions), completions, answers)
    rows = {row["criterion"]: row for row in reward.summary.to_rows()}
    assert list(rows) == ["m/correct", "m/tags", "m"]
    correct = np.array([1.0, 0.0, 1.0, 1.0])  # the fifth sample had no answer
    assert rows["m/correct"]["samples"] == 4
    assert rows["m/correct"]["mean"] == pytest.approx(correct.mean())
    assert rows["m/correct"]["std"] == pytest.approx(correct.std())
    assert (rows["m/correct"]["min"], rows["m/correct"]["max"]) == (0.0, 1.0)
    totals = np.array([1.0, 0.25, 0.75, 1.0, 0.0])
    assert rows["m"]["mean"] == pytest.approx(totals.mean()) and rows["m"]["std"] == pytest.approx(totals.std())

    final = reward.summary.final_metrics()
    assert final["final/criteria/m/correct/mean"] == pytest.approx(0.75)
    assert final["final/criteria/m/correct/total_samples"] == 4
    assert final["final/criteria/m/tags/std"] == pytest.approx(np.array([1, 1, 0, 1, 0]).std())

    json_path, markdown_path = reward.summary.write(tmp_path)
    document = json.loads(json_path.read_text())
    assert json_path.name == "rubric_summary.json" and document["columns"] == list(SUMMARY_COLUMNS)
    assert document["rows"][0]["criterion"] == "m/correct" and document["weights"] == {"correct": 0.75, "tags": 0.25}
    markdown = markdown_path.read_text()
    assert "| criterion | mean | std | min | max | samples |" in markdown
    assert "| m/correct | 0.7500 | 0.4330 | 0.0000 | 1.0000 | 4 |" in markdown


def test_shipped_math_rubric_scores_default_task_completions():
    rubric = load_rubric(CONFIGS / "rubric_math.yaml")
    completions = [
        "<reasoning>7+2=9 4+0=4 0+3=3</reasoning><answer>349</answer>",  # right and clean
        "<reasoning>7+2=9</reasoning><answer>348</answer>",  # wrong number, clean format
        "349",  # right number, no tags
        "<reasoning>" + "thinking " * 30 + "</reasoning><answer>349</answer> trailing",
    ]
    result = rubric.score(["047+302="] * 4, completions, ["349"] * 4)
    assert result.column("correct").tolist() == [1, 0, 0, 1]
    assert result.column("format").tolist() == [1, 1, 0, 0]
    assert result.column("answer_tags").tolist() == [1, 1, 0, 1]
    assert result.column("concise")[:3].tolist() == [1, 1, 1] and result.column("concise")[3] < 0.5
    assert result.total[0] == pytest.approx(1.0)
    assert result.total[0] > result.total[1] > result.total[2]


CODE_GOOD = '''```python
def add(a, b):
    """Return the sum of a and b."""
    return a + b
```'''
CODE_WRONG = "<answer>def add(a, b):\n    return a - b</answer>"
CODE_NESTED = '''```python
def add(a, b):
    total = 0
    for _ in range(1):
        for _ in range(1):
            for _ in range(1):
                total = a + b
    return total
```'''
CODE_HANGS = "```python\ndef add(a, b):\n    while True:\n        pass\n```"


def test_shipped_code_rubric_rule_criteria(tmp_path):
    rubric = load_rubric(CONFIGS / "rubric_code.yaml")  # loading never contacts the judge
    assert [(c.name, c.weight) for c in rubric.criteria] == [
        ("correctness", 0.3), ("quality", 0.3), ("efficiency", 0.2), ("documentation", 0.2)]
    scorers = {c.name: c.scorer for c in rubric.criteria}
    scorers["correctness"].function.__globals__["TEST_TIMEOUT_S"] = 1.0
    completions = [CODE_GOOD, CODE_WRONG, CODE_NESTED, CODE_HANGS, "not python at all("]
    tests = ["assert add(1, 2) == 3\nassert add(2, 0) == 2"] * 4 + [["assert add(0, 0) == 0"]]
    n = len(completions)
    assert scorers["correctness"]([""] * n, completions, [""] * n, {"tests": tests}) == [1.0, 0.5, 1.0, 0.0, 0.0]
    assert scorers["efficiency"]([""] * n, completions, [""] * n, {}) == [1.0, 1.0, 0.0, 1.0, 0.0]
    assert scorers["documentation"]([""] * n, completions, [""] * n, {}) == [1.0, 0.0, 0.0, 0.0, 0.0]
    with pytest.raises(CriterionFailed, match="rubric_criteria.py:tests_passed raised ValueError: the dataset has no"):
        scorers["correctness"]([""], [CODE_GOOD], [""], {})


def test_rubric_modules_do_not_import_mlx():
    code = ("import sys, mlx_grpo.rewards.rubric, mlx_grpo.rewards.judge, mlx_grpo.rewards.rubric_reward, "
            "mlx_grpo.rewards.loading; "
            "sys.exit(any(m == 'mlx' or m.startswith('mlx.') for m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
