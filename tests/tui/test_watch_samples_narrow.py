"""The Samples view in an 80x24 terminal (E11 of the 28 Nov review): each row shows the whole expected answer
beside the completion's end, so a right answer never reads as wrong; with one run, no column repeats its name."""

from __future__ import annotations

import json
import time
from functools import partial

import pytest
from run_writer import RunWriter
from screen_text import screen_text, settle
from textual.widgets import DataTable

from mlx_grpo.tui.app import WatchApp

pytestmark = pytest.mark.anyio

ANSWERS = ["736", "1042", "9", "20311"]


@pytest.fixture
def four_digit_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    run = RunWriter(tmp_path / "runs" / "sums", name="grpo-20261128-233650", total_steps=200)
    run.start()
    for _ in range(8):
        run.log_step(samples=0)
    with open(run.run_dir / "samples.jsonl", "a") as fh:
        for k, answer in enumerate(ANSWERS * 3):
            right = k % 2 == 0
            fh.write(json.dumps({"step": 8, "time": run.time_of(8), "prompt": f"{k:03d}+{k:03d}=",
                                 "completion": f"<reasoning>0{k}0</reasoning><answer>{answer if right else 7}</answer>",
                                 "answer": answer, "rewards": {"format_exact": 3.0}, "total": 3.0,
                                 "advantage": 0.5, "length": 10, "correct": right}) + "\n")
    yield run
    monkeypatch.undo()
    time.tzset()


def _app(run: RunWriter) -> WatchApp:
    return WatchApp(["runs/sums"], refresh=3600, clock=lambda: run.time_of(8) + 1.0)


async def test_each_row_shows_the_whole_expected_answer_at_80_columns(four_digit_run):
    app = _app(four_digit_run)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, keys=["7"])
        text = screen_text(app)
        rows = [line for line in text.splitlines() if "<answer>" in line]
        assert rows, text
        for line in rows:
            listed = line.split("│")[0].split()
            assert listed[-1] in ANSWERS, line  # the expected column, whole
            assert listed[-2].endswith(f"<answer>{listed[-1]}") or listed[-2].endswith("<answer>7"), line
        labels = [str(c.label) for c in app.active_view().query_one(DataTable).columns.values()]
        assert "run" not in labels  # one run: its name is in the header, not on every row


def test_samples_at_80x24(snap_compare, four_digit_run):
    assert snap_compare(_app(four_digit_run), run_before=partial(settle, keys=["7"]), terminal_size=(80, 24))
