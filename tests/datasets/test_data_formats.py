"""Data as people have it: Parquet and CSV files (and hub names) through Hugging Face datasets, the `data`
extra; a missing package, a missing column or an unreachable hub is one line, as for JSONL."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlx_grpo.cli import main

SHORT = ["--num-steps", "2", "--batch-size", "2", "--num-generations", "2", "--max-generation-steps", "4",
         "--eval-every", "0", "--checkpoint-every", "0", "--no-tensorboard", "--no-wandb"]


def train_on(tmp_path, data, *flags):
    return main(["train", "--dataset", str(data), "--eval-dataset", str(data), "--monitoring-dir",
                 str(tmp_path / "runs"), "--run-name", "r", *SHORT, *flags])


def first_sample(tmp_path):
    return json.loads((tmp_path / "runs" / "r" / "samples.jsonl").read_text().splitlines()[0])


def write_parquet(path, rows):
    pyarrow = pytest.importorskip("pyarrow")
    pytest.importorskip("datasets")
    import pyarrow.parquet  # noqa: F811 (puts the submodule on the module importorskip returned)

    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), path)
    return path


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_a_conversational_parquet_dataset_trains(tmp_path):
    data = write_parquet(tmp_path / "chat.parquet", [
        {"prompt": [{"role": "system", "content": "Add."}, {"role": "user", "content": f"{a}+{b}="}],
         "answer": a + b, "level": a} for a in range(4) for b in range(2)])
    assert train_on(tmp_path, data) == 0
    sample = first_sample(tmp_path)
    assert sample["prompt"].startswith("system: Add.\nuser: ") and sample["answer"].isdigit()
    assert json.loads((tmp_path / "runs" / "r" / "run.json").read_text())["status"] == "finished"


def test_a_csv_dataset_trains_with_its_answers_as_written(tmp_path):
    pytest.importorskip("datasets")
    data = tmp_path / "sums.csv"
    data.write_text("prompt,answer,level\n" + "".join(f'"{a}+{b}=",{a + b:02d},{a}\n'
                                                    for a in range(4) for b in range(2)))
    assert train_on(tmp_path, data) == 0
    assert len(first_sample(tmp_path)["answer"]) == 2  # "03", not 3.0: a CSV's answers are text


def test_without_datasets_installed_a_parquet_file_is_one_line_saying_what_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` raise ImportError
    data = tmp_path / "d.parquet"
    data.write_bytes(b"PAR1")
    assert train_on(tmp_path, data) == 2
    assert one_line(capsys) == (f"mlx-grpo train: error: {data}: reading a .parquet dataset needs Hugging Face "
                                f"datasets, which is not installed: pip install -e '{Path(__file__).resolve().parents[2]}[data]'")


@pytest.mark.parametrize("text, expected", [
    ("query,answer\n1+1=,2\n", ": no column 'prompt' (columns: query, answer)"),
    ('prompt,answer\n1+1=,2\n"2+2=,4\n', ": not a readable csv file (ParserError: "),
    ("prompt,answer\n1+1=,2\n2+2=,\n", ": row 2: field 'answer' must be a string or a number, got null"),
])
def test_a_bad_csv_is_one_line_naming_the_file_and_column_or_row(tmp_path, capsys, text, expected):
    pytest.importorskip("datasets")
    data = tmp_path / "d.csv"
    data.write_text(text)
    assert train_on(tmp_path, data) == 2
    assert f"{data}{expected}" in one_line(capsys)


def test_a_parquet_prompt_that_is_not_messages_names_its_row(tmp_path, capsys):
    data = write_parquet(tmp_path / "d.parquet", [{"prompt": [{"role": "user", "content": "1+1="}], "answer": "2"},
                                                  {"prompt": [{"role": "user", "content": None}], "answer": "4"}])
    assert train_on(tmp_path, data) == 2
    assert f"{data}: row 2: field 'prompt' is a list, so it must hold messages" in one_line(capsys)


def test_a_hub_dataset_that_cannot_be_reached_is_one_line(tmp_path):
    pytest.importorskip("datasets")
    # A new process, so the hub's offline switch is read (it is read once, at import): no network is tried.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    result = subprocess.run([sys.executable, "-m", "mlx_grpo.cli", "train", "--dataset", "someone/sums:main",
                             "--monitoring-dir", str(tmp_path / "runs"), *SHORT], capture_output=True, text=True,
                            env=env, timeout=120, cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "mlx-grpo train: error: someone/sums:main: no such file, and loading its 'train' split from the Hugging "
        "Face Hub failed (ConnectionError: "), result.stderr


def test_a_mistyped_path_inside_a_local_directory_is_no_such_file_at_once(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    # shaped like a hub name (owner/name), but data/ is a directory here: the user meant a file
    assert main(["train", "--dataset", "data/trian", "--monitoring-dir", str(tmp_path / "runs"), *SHORT]) == 2
    line = one_line(capsys)
    assert line.endswith("data/trian: dataset file not found") and "Hub" not in line, line
