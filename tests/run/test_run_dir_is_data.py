"""A run directory is data, never code (issue 38, S1 of the third reliability review): `replay RUN_DIR` and
`eval RUN_DIR` never import a file because the run's run.json names it, and never read a rubric it names
(a rubric can name python scorers and a judge to send an API key to). Built-in rewards and checks are
used by name; user code only when the command line names it, and the refusal says which file and how."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from mlx_grpo.cli import main
from mlx_grpo.telemetry.rundir.completions import CompletionsWriter, completion_rows
from mlx_grpo.telemetry.rundir.layout import RunPaths
from mlx_grpo.telemetry.rundir.writer import RunInfo, write_run_info

EVIL = ("import pathlib\n"
        "pathlib.Path({marker!r}).write_text('ran')\n"
        "def f(completions, **kw):\n"
        "    return [0.0] * len(completions)\n")


def hostile_run(root: Path, rewards: list[dict], **config) -> tuple[Path, Path]:
    """A finished run with completions whose run.json names code inside the run directory; (run, marker)."""
    run_dir = root / "sent_to_you"
    run_dir.mkdir()
    marker = root / "PWNED"
    (run_dir / "evil.py").write_text(EVIL.format(marker=str(marker)))
    (run_dir / "evil2.py").write_text(EVIL.format(marker=str(marker)))
    (run_dir / "r.yaml").write_text("name: r\ncriteria:\n  - name: c\n    scorer: python\n    file: evil2.py\n"
                                    "    function: f\n")
    write_run_info(run_dir, RunInfo(name="sent", status="finished", total_steps=2, config={
        "rewards": rewards, "num_generations": 2, "scale_rewards": "group", "base_dir": str(run_dir),
        "dataset": "arithmetic", "correctness": "auto", **config}))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "rewards/total/mean": 0.5}) + "\n"
                                                   for s in (1, 2)))
    writer = CompletionsWriter(run_dir, 0)
    names = [r["name"].rpartition(":")[2] for r in rewards]
    for step in (1, 2):
        scores = np.array([[1.0, 0.0, 0.5, 0.25]] * len(names))
        texts = ["<answer>2</answer>", "x", "<answer>4</answer>", "4"]
        writer.write(step, completion_rows(step=step, prompts=["1+1=", "2+2="], answers=["2", "4"], texts=texts,
                                           reasoning=texts, predicted=[None] * 4, group_size=2, reward_names=names,
                                           scores=scores, total=scores.sum(0), advantages=np.array([1.0, -1.0, 1.0, -1.0]),
                                           lengths=np.ones(4), truncated=np.zeros(4, bool), correct=None))
    return run_dir, marker


def one_line_error(capsys, argv) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    return err[0]


def test_replay_never_imports_a_reward_file_the_run_directory_names(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_dir, marker = hostile_run(tmp_path, [{"name": "answer_check", "weight": 1.0},
                                             {"name": "evil.py:f", "weight": 2.0}])
    err = one_line_error(capsys, ["replay", str(run_dir)])
    assert not marker.exists()
    evil = run_dir / "evil.py"
    assert f"the run's reward evil.py:f is user code ({evil})" in err and "replay imports no code" in err
    assert f"--rewards answer_check=1 {evil}:f=2" in err and "--without f" in err
    # the built-ins alone, by leaving it out: replayed without importing anything
    assert main(["replay", str(run_dir), "--without", "f"]) == 0 and not marker.exists()
    assert "replayed 8 completions in 4 groups over 2 steps" in capsys.readouterr().out
    # named on the command line by the user: imported, as they asked
    assert main(["replay", str(run_dir), "--rewards", "answer_check=1", f"{evil}:f=2"]) == 0
    assert marker.read_text() == "ran"


def test_replay_never_reads_a_rubric_the_run_directory_names(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_dir, marker = hostile_run(tmp_path, [{"name": "answer_check", "weight": 1.0}], rubric_file="r.yaml")
    err = one_line_error(capsys, ["replay", str(run_dir)])
    assert not marker.exists()
    assert f"--rubric-file {run_dir / 'r.yaml'}" in err and "--without rubric" in err
    assert main(["replay", str(run_dir), "--without", "rubric"]) == 0 and not marker.exists()


def test_eval_of_a_run_never_imports_its_correctness_or_reward_files(tmp_path, capsys, monkeypatch):
    """eval's checks and rewards come from run.json before any model loads."""
    import argparse

    from mlx_grpo.commands.eval import checks_and_rewards
    from mlx_grpo.config.train_config import load_config

    monkeypatch.chdir(tmp_path)
    run_dir, marker = hostile_run(tmp_path, [{"name": "answer_check", "weight": 1.0},
                                             {"name": "evil.py:f", "weight": 1.0}])
    config = load_config(None, {"rewards": ["answer_check", str(run_dir / "evil.py") + ":f"],
                                "correctness": str(run_dir / "evil.py") + ":f"})
    args = argparse.Namespace(target=str(run_dir), correctness=None, rewards=None, rubric_file=None)
    with pytest.raises(Exception) as refused:
        checks_and_rewards(args, config, run_dir)
    assert "the run's correctness check" in str(refused.value) and "--correctness" in str(refused.value)
    assert not marker.exists()
    config = load_config(None, {"rewards": ["answer_check", str(run_dir / "evil.py") + ":f"],
                                "correctness": "last_number"})
    check, functions, notes = checks_and_rewards(args, config, run_dir)
    from mlx_grpo.rewards.correctness import last_number_check

    assert check is last_number_check  # the run's own check, not the built-in answer check (T16)
    assert [f.name for f in functions] == ["answer_check"] and not marker.exists()
    assert len(notes) == 1 and "--rewards" in notes[0] and "evil.py:f" in notes[0]


@pytest.mark.parametrize("values,expected", [
    ({"num_generations": [2]}, "config num_generations is [2]; expected a whole number"),
    ({"rubric_weight": "abc"}, "config rubric_weight is 'abc'; expected a finite number"),
])
def test_replay_reads_odd_run_json_values_as_one_line(tmp_path, capsys, values, expected):
    run_dir, _ = hostile_run(tmp_path, [{"name": "answer_check", "weight": 1.0}], **values)
    assert expected in one_line_error(capsys, ["replay", str(run_dir)])


def test_replay_of_a_run_whose_totals_are_null_reports(tmp_path, capsys):
    import gzip

    run_dir, _ = hostile_run(tmp_path, [{"name": "answer_check", "weight": 1.0}])
    for path in (run_dir / "completions").iterdir():
        rows = [json.loads(line) for line in gzip.decompress(path.read_bytes()).splitlines()]
        path.write_bytes(gzip.compress("".join(json.dumps({**r, "total": None}) + "\n" for r in rows).encode()))
    assert main(["replay", str(run_dir)]) == 0
    assert "replayed 8 completions" in capsys.readouterr().out


def test_a_reward_exception_reaches_the_terminal_as_text(tmp_path, capsys):
    run_dir, _ = hostile_run(tmp_path, [{"name": "answer_check", "weight": 1.0}])
    (tmp_path / "rw.py").write_text("def esc(completions, **kw):\n    raise ValueError('bad \\x1b]0;T\\x07 \\x1b[2J')\n")
    main(["replay", str(run_dir), "--rewards", f"{tmp_path / 'rw.py'}:esc"])
    out = capsys.readouterr()
    assert "\x1b" not in out.out + out.err and "\\x1b]0;T" in out.out


def test_a_gzip_bomb_in_completions_inflates_no_further_than_the_cap(tmp_path, monkeypatch):
    import gzip

    from mlx_grpo.telemetry.rundir import completions

    run_dir, _ = hostile_run(tmp_path, [{"name": "answer_check", "weight": 1.0}])
    good = completions.read_step(run_dir, 1)
    monkeypatch.setattr(completions, "MAX_STEP_TEXT_BYTES", 1 << 20)
    member = gzip.compress(b"\n" * (8 << 20), 9)
    path = RunPaths(run_dir).completions_step(2)
    path.write_bytes(path.read_bytes() + member * 4)  # 32 MB of newlines after the step's rows
    peak = []
    real = completions.inflate
    monkeypatch.setattr(completions, "inflate", lambda data, limit: peak.append(len(out := real(data, limit))) or out)
    assert len(completions.read_step(run_dir, 2)) == len(good)  # the rows before the bomb are read
    assert peak == [1 << 20]
    shutil.copy(RunPaths(run_dir).completions_step(1), path)
    assert completions.read_step(run_dir, 2) == completions.read_step(run_dir, 1)


def test_no_completions_archive_crashes_its_readers(tmp_path):
    """Damaged, truncated, concatenated, re-typed and bomb gzip members in a step file: every reader of
    completions yields rows or nothing, `replay` and `report` answer or refuse in one line."""
    import gzip
    import random

    from mlx_grpo.telemetry.rundir import completions

    run_dir, _ = hostile_run(tmp_path, [{"name": "answer_check", "weight": 1.0}])
    path = RunPaths(run_dir).completions_step(1)
    good = path.read_bytes()
    rng = random.Random(0)
    variants = [good[:n] for n in (0, 10, len(good) // 2, len(good) - 1)] + [
        good + good, good + b"garbage", gzip.compress(b"not json\n\xff\xfe\n" * 100), gzip.compress(b""),
        gzip.compress(b'{"prompt_index": "x", "total": {}}\n[1, 2]\n' + b"[" * 100_000 + b"\n"),
        gzip.compress(b"\n" * (1 << 20), 9) * 3 + good, bytes(rng.getrandbits(8) for _ in range(500))]
    for _ in range(20):
        flipped = bytearray(good)
        for _ in range(rng.randint(1, 10)):
            flipped[rng.randrange(len(flipped))] ^= 0xFF
        variants.append(bytes(flipped))
    for i, data in enumerate(variants):
        path.write_bytes(data)
        rows = completions.read_step(run_dir, 1, display=True)
        assert isinstance(rows, list) and all(isinstance(r, dict) for r in rows)
        if i in (5, 9, 12):  # the commands too, on a few (each takes seconds)
            assert main(["replay", str(run_dir)]) in (0, 2)
    assert main(["report", "--no-write", str(run_dir)]) in (0, 2)


def test_replay_reads_rows_whose_fields_have_other_types(tmp_path, capsys):
    """A damaged step file whose rows parse but hold other types (the fuzz pass found `rewards: "str"`)."""
    import gzip

    run_dir, _ = hostile_run(tmp_path, [{"name": "answer_check", "weight": 1.0}])
    path = run_dir / "completions" / "step_000001.jsonl.gz"
    rows = [json.loads(line) for line in gzip.decompress(path.read_bytes()).splitlines()]
    odd = ["str", 2**70, None, [], {}, True]
    for i, row in enumerate(rows):
        for j, key in enumerate(("rewards", "prompt", "completion", "answer", "completion_index", "total", "advantage")):
            row[key] = odd[(i + j) % len(odd)]
    path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    assert main(["replay", str(run_dir)]) == 0
    assert "replayed 8 completions" in capsys.readouterr().out


def test_replay_never_imports_a_reward_named_in_trls_dotted_form(tmp_path, capsys, monkeypatch):
    """TRL's `module.function` spelling is read as `module.py:function`: a file too, so refused the same."""
    monkeypatch.chdir(tmp_path)
    run_dir, marker = hostile_run(tmp_path, [{"name": "answer_check", "weight": 1.0}, {"name": "evil.f", "weight": 1.0}])
    err = one_line_error(capsys, ["replay", str(run_dir)])
    assert not marker.exists() and f"({run_dir / 'evil.py'})" in err and "--rewards" in err
