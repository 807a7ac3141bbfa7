"""Bounded readers and the rest of the third reliability review (issue 38): YAML values PyYAML cannot build
(S5) and YAML that would take gigabytes (S21), a huge chat message in the memory plan (S12), a closed or
full stdout (S3), correctness functions returning strings (S11), sweep names and NaN steps (S6, S16),
mathtext in HTML reports (S14), model config.json shapes (S15), a symlink-loop dataset (S19), and the
datasets people's everyday tools save (spreadsheet exports, pandas)."""

from __future__ import annotations

import codecs
import json
import os
import shutil
import subprocess
import sys

import pytest

from mlx_grpo.cli import main
from mlx_grpo.telemetry.rundir.writer import read_run_info

# train_size: not the default 20,000 rows, whose drawing and tokenizing took ~1 s of each short run
FAST = {"num_steps": 2, "batch_size": 2, "num_generations": 2, "max_generation_steps": 4, "eval_every": 0,
        "checkpoint_every": 0, "tensorboard": False, "wandb": False, "train_size": 64}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from tiny_models import make_model_dir

    return make_model_dir(tmp_path_factory.mktemp("model") / "llama", "llama")


def flags(tmp_path, model, **overrides):
    values = {**FAST, "model_id": str(model), "monitoring_dir": str(tmp_path / "runs"), "run_name": "r", **overrides}
    return ["train", *(f"--set={k}={json.dumps(v)}" for k, v in values.items())]


def one_line_error(capsys, rc: int, *words: str) -> str:
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err
    lines = [x for x in err.splitlines() if "error:" in x]
    assert len(lines) == 1 and all(w in lines[0] for w in words), err
    return lines[0]


# ----------------------------------------------------------------------------- YAML (S5, S21)

@pytest.mark.parametrize("value, words", [
    ("2020-02-30", ("'2020-02-30' is not a valid timestamp", "quote it")),
    ("!!float abc", ("'abc' is not a valid float",)),
    ("!!int 0x", ("'0x' is not a valid int",)),
    ("!!timestamp foo", ("'foo' is not a valid timestamp", "quote it")),  # PyYAML raises AttributeError here
    ("!!bool maybe", ("'maybe' is not a valid bool",)),
])
def test_yaml_values_pyyaml_cannot_build_are_one_line_with_the_line_in_every_reader(tmp_path, capsys, value, words):
    config = tmp_path / "c.yaml"
    config.write_text(f"seed: 1\nnum_steps: {value}\n")
    rules = tmp_path / "rules.yaml"
    rules.write_text(f"rules:\n  - name: x\n    metric: policy/lr\n    op: '>'\n    value: {value}\n")
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"parameters:\n  seed: [{value}]\n")
    rubric = tmp_path / "rubric.yaml"
    rubric.write_text(f"name: r\ncriteria:\n  - name: c\n    weight: {value}\n    scorer: length\n")
    for argv, line in ((["train", str(config)], 2), (["plan", str(config)], 2), (["train", "--alerts", str(rules)], 5),
                       (["sweep", "--dry-run", str(sweep)], 2), (["train", "--rubric-file", str(rubric)], 4)):
        error = one_line_error(capsys, main(argv), *words)
        assert f"{argv[-1]}:{line}: not valid YAML" in error, error
    one_line_error(capsys, main(["train", "--set", f"num_steps={value}"]), "--set num_steps", *words)


def test_a_yaml_file_that_would_take_gigabytes_is_refused_at_once(tmp_path, capsys):
    wide = tmp_path / "wide.yaml"
    wide.write_text("a: [" + ",".join(["1"] * 120_000) + "]\n")  # 0.24 MB, 120,000 values
    one_line_error(capsys, main(["train", str(wide)]), "wide.yaml:1: more than 100,000 values")
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * (2 << 20) + "\n")
    one_line_error(capsys, main(["plan", str(big)]), "too large for a config file (more than 1 MB)")


# ----------------------------------------------------------------------------- a huge chat message (S12)

def test_the_memory_plan_tokenizes_a_huge_chat_message_cut_to_the_budget():
    from types import SimpleNamespace

    from mlx_grpo import data
    from mlx_grpo.data.rows import _transcript

    seen = []

    class Tokenizer:
        chat_template = None

        def __call__(self, texts, add_special_tokens=False):
            seen.extend(len(t) for t in texts)
            return {"input_ids": [list(range(min(len(t), 50))) for t in texts]}

        def encode(self, text):
            seen.append(len(text))
            return list(range(min(len(text), 50)))

    config = SimpleNamespace(max_prompt_length=16, system_prompt=None, use_chat_template=True)
    messages = [{"role": "user", "content": "1+1=" + "x" * 10_000_000}]
    rows = [{"prompt": _transcript(messages), "messages": messages, "answer": "2"},
            {"prompt": "2+2=", "answer": "4"}]
    assert data.longest_prompt(Tokenizer(), rows, config) == 16
    assert max(seen) <= 16 * data.MAX_CHARS_PER_TOKEN + 1  # the plan tokenized all 10 MB (OOM-killed at 7.4 GB)


# ----------------------------------------------------------------------------- stdout closed or full (S3)

@pytest.mark.parametrize("stdout", ["closed", "full"])
def test_a_closed_or_full_stdout_is_no_reason_to_stop_training(tmp_path, model, stdout):
    closing = (1, 2) if stdout == "closed" else ()  # stdout and stderr closed, as a service manager may
    out = open("/dev/full", "w") if stdout == "full" else None
    result = subprocess.run([sys.executable, "-m", "mlx_grpo.cli", *flags(tmp_path, model)], stdout=out,
                            stderr=subprocess.PIPE, text=True, timeout=300, env={**os.environ, "WANDB_MODE": "disabled"},
                            preexec_fn=lambda: [os.close(fd) for fd in closing])
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    run_dir = tmp_path / "runs" / "r"
    assert read_run_info(run_dir).status == "finished" and not (run_dir / ".reserve").exists()
    assert [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    if stdout == "full":
        assert "standard output stopped (it cannot be written: No space left on device)" in result.stderr


# ----------------------------------------------------------------------------- correctness verdicts (S11)

@pytest.mark.parametrize("values", [["no", "no"], ["false", "true"], [float("nan"), 1], [2, 0], [None, True]])
def test_a_correctness_function_returning_other_than_true_or_false_is_one_line(values):
    from mlx_grpo.common.errors import UserError
    from mlx_grpo.rewards.correctness import user_check

    check = user_check("rw.py:c", lambda prompts, completions, answers, **kw: values)
    with pytest.raises(UserError, match=r"correctness function rw.py:c returned .* at index \d; expected True/False"):
        check(["p", "p"], ["a", "b"], ["1", "1"])


def test_numpy_bools_and_ones_and_zeros_are_verdicts():
    import numpy as np

    from mlx_grpo.rewards.correctness import user_check

    check = user_check("rw.py:c", lambda prompts, completions, answers, **kw: np.array([True, False, 1, 0.0],
                                                                                         dtype=object))
    assert check(["p"] * 4, ["a"] * 4, ["1"] * 4) == [True, False, True, False]


# ----------------------------------------------------------------------------- sweeps, report, model configs

def test_sweep_names_with_escapes_and_nan_steps_are_one_line(tmp_path, capsys):
    sweep = tmp_path / "s.yaml"
    sweep.write_text('name: "sw\\e]0;T\\a"\nparameters:\n  seed: [1, 2]\n')
    line = one_line_error(capsys, main(["sweep", "--dry-run", str(sweep)]), "key 'name'")
    assert "\x1b" not in line
    sweep.write_text("parameters:\n  temperature: {min: 0.1, max: 1.0, step: .nan}\n")
    one_line_error(capsys, main(["sweep", "--dry-run", str(sweep)]), "step' is nan; expected a finite number")


def test_an_html_report_shows_dollar_signs_in_names_as_text(tmp_path):
    pytest.importorskip("matplotlib")
    from synthetic_runs import simulate, write_run_dir

    metrics, samples = simulate(steps=12, seed=0)
    metrics = [{**m, "rewards/a$\\sqrt$b/mean": 1.0} for m in metrics]  # a chart title: mathtext raised
    run = write_run_dir(tmp_path / "math", metrics, samples, name="cost $\\frac{$ 5")
    assert main(["report", str(run), "--no-write", "--html", str(tmp_path / "r.html")]) == 0
    assert "cost $\\frac{$ 5" in (tmp_path / "r.html").read_text()


@pytest.mark.parametrize("change, words", [
    ({"num_hidden_layers": 4.5}, "'num_hidden_layers' is 4.5; expected a whole number"),
    ({"model_type": ["llama"]}, "'model_type' is ['llama']; expected a string"),
    ({"layer_types": 5}, "'layer_types' is 5; expected a list"),
])
def test_model_config_shapes_no_model_has_are_one_line(tmp_path, model, capsys, change, words):
    bad = tmp_path / "bad"
    shutil.copytree(model, bad)
    shape = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**shape, **change}))
    one_line_error(capsys, main(["plan", "--set", f"model_id={bad}"]), "config.json", words)


def test_a_deeply_nested_model_config_is_one_line(tmp_path, model, capsys):
    bad = tmp_path / "deep"
    shutil.copytree(model, bad)
    (bad / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    one_line_error(capsys, main(["plan", "--set", f"model_id={bad}"]), "config.json", "cannot read the model's shape")


def test_a_dataset_that_is_a_symlink_loop_is_one_line(tmp_path, model, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.symlink("loop.jsonl", tmp_path / "loop.jsonl")
    one_line_error(capsys, main(flags(tmp_path, model, dataset="loop.jsonl")), "loop.jsonl", "leads nowhere")


# ----------------------------------------------------------------------------- everyday dataset exports

ROWS = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "café 2+2=", "answer": "4"}]


def spreadsheet_csv(encoding: str, index: bool = False) -> bytes:
    lines = ([",prompt,answer"] if index else ["prompt,answer"]) + [
        (f"{i}," if index else "") + f"{r['prompt']},{r['answer']}" for i, r in enumerate(ROWS)]
    return ("\r\n".join(lines) + "\r\n").encode(encoding)


EXPORTS = {
    "excel_csv_utf8_bom.csv": codecs.BOM_UTF8 + spreadsheet_csv("utf-8"),
    "excel_unicode_utf16.csv": spreadsheet_csv("utf-16"),
    "excel_windows_cp1252.csv": spreadsheet_csv("cp1252"),
    "pandas_to_csv_index.csv": spreadsheet_csv("utf-8", index=True),
    "notepad_bom.jsonl": codecs.BOM_UTF8 + "".join(json.dumps(r) + "\r\n" for r in ROWS).encode(),
    "notepad_utf16.jsonl": "".join(json.dumps(r) + "\r\n" for r in ROWS).encode("utf-16"),
    "pandas_to_json.json": json.dumps({"prompt": {"0": "1+1=", "1": "café 2+2="},
                                       "answer": {"0": "2", "1": "4"}}).encode(),
    "pandas_records.json": json.dumps(ROWS).encode(),
    "pandas_split.json": json.dumps({"columns": ["prompt", "answer"], "index": [0, 1],
                                     "data": [[r["prompt"], r["answer"]] for r in ROWS]}).encode(),
    "pandas_index.json": json.dumps({"0": ROWS[0], "1": ROWS[1]}).encode(),
}


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_datasets_as_spreadsheets_and_pandas_save_them_load(tmp_path, name):
    if name.endswith(".csv"):
        pytest.importorskip("datasets")
    from mlx_grpo.data import read_dataset_file

    path = tmp_path / name
    path.write_bytes(EXPORTS[name])
    rows = read_dataset_file(path, "auto", "prompt", "answer")
    assert [{"prompt": r["prompt"], "answer": r["answer"]} for r in rows] == ROWS
