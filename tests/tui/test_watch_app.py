"""The dashboard, driven with Textual's Pilot while a writer appends to the run directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
from run_writer import RunWriter, metric_record
from screen_text import screen_text
from textual.widgets import SelectionList

from mlx_grpo.telemetry.metrics.catalogue import find_entry
from mlx_grpo.telemetry.rundir.reader import STANDING_RECORDS
from mlx_grpo.tui.app import VIEW_KEYS, WatchApp
from mlx_grpo.tui.chart import MetricChart
from mlx_grpo.tui.chart_screen import ChartScreen
from mlx_grpo.tui.run_picker import RunPicker
from mlx_grpo.tui.tile import MetricTile

pytestmark = pytest.mark.anyio

SIZE = (140, 45)


async def wait_for(pilot, condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out; screen was:\n" + screen_text(pilot.app))
        await pilot.pause(0.05)


def header(app) -> str:
    return str(app.query_one("#header").content)


def chart(app, title: str) -> MetricChart:
    return next(c for c in app.active_view().query(MetricChart) if c.chart_title == title)


def tile(app, metric: str) -> MetricTile:
    return next(t for t in app.active_view().query(MetricTile) if t.metric == metric)


class BackgroundWriter:
    """Logs a step every `interval` seconds from a thread, like a trainer would."""

    def __init__(self, writer: RunWriter, steps: int, interval: float = 0.02):
        self.writer, self.steps, self.interval = writer, steps, interval
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        for _ in range(self.steps):
            self.writer.log_step()
            time.sleep(self.interval)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.thread.join()


@pytest.fixture
def run(tmp_path):
    writer = RunWriter(tmp_path / "run", total_steps=200)
    writer.start()
    for _ in range(5):
        writer.log_step()
    return writer


def make_app(*writers, refresh: float = 0.1, **kw) -> WatchApp:
    clock = lambda: writers[0].time_of(writers[0].step) + 1.0  # noqa: E731 - the run looks live
    return WatchApp([w.run_dir for w in writers], refresh=refresh, clock=clock, **kw)


async def test_header_step_and_chart_follow_a_writing_run(run):
    app = make_app(run)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: "step 5/200" in header(app))
        assert "LIVE" in header(app)
        reward = chart(app, "total reward")
        before = (reward.legend[0][2], reward._strips[:])
        with BackgroundWriter(run, 40):
            await wait_for(pilot, lambda: "step 45/200" in header(app))
        await wait_for(pilot, lambda: reward.legend[0][2] != before[0])
        assert reward._strips != before[1]
        # The chart's x axis now ends at the new last step.
        assert "45" in screen_text(app).split("total reward")[1].split("╰")[0]


async def test_alert_lights_up_its_tile_and_chart_until_it_stops_standing(run):
    app = make_app(run)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: "step 5/" in header(app))
        assert not tile(app, "policy/kl").has_class("alert-warning")
        run.alert("policy/kl", level="warning", message="KL is drifting")
        await wait_for(pilot, lambda: tile(app, "policy/kl").has_class("alert-warning"))
        assert "⚠ KL" in screen_text(app)
        assert "⚠ 1 warning" in header(app)
        await pilot.press("2")  # policy view: its KL chart is lit too
        await wait_for(pilot, lambda: chart(app, "KL").has_class("alert-warning"))
        assert not chart(app, "entropy").has_class("alert-warning")
        await pilot.press("6")
        await wait_for(pilot, lambda: "KL is drifting" in screen_text(app))
        assert "● " in screen_text(app)  # standing mark
        for _ in range(STANDING_RECORDS):
            run.log_step()
        await pilot.press("1")
        await wait_for(pilot, lambda: not tile(app, "policy/kl").has_class("alert-warning"))


async def test_error_alert_is_red(run):
    app = make_app(run)
    async with app.run_test(size=SIZE) as pilot:
        run.alert("rewards/total/mean", level="error")
        await wait_for(pilot, lambda: chart(app, "total reward").has_class("alert-error"))
        assert tile(app, "rewards/total/mean").has_class("alert-error")


async def test_samples_view_shows_recent_completions_with_reward_breakdown(run):
    app = make_app(run)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("7")
        await wait_for(pilot, lambda: "What is 5 + 1?" in screen_text(app))
        text = screen_text(app)
        assert "answer_check" in text and "format_exact" in text  # breakdown of the selected sample
        run.log_step()
        await wait_for(pilot, lambda: "What is 6 + 1?" in screen_text(app))
        await pilot.press("k")  # the sample before the newest
        await wait_for(pilot, lambda: "What is 6 + 0?" in screen_text(app))


async def test_a_sample_with_values_of_the_wrong_type_is_shown_as_text(run):
    run.append("samples.jsonl", {"step": 5, "total": "y", "advantage": True, "length": [1], "prompt": "odd sample",
                                 "completion": "...", "rewards": {"answer_check": "z"}, "correct": "maybe"})
    app = make_app(run)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("7")
        await wait_for(pilot, lambda: "odd sample" in screen_text(app))  # selected: the newest
        run.log_step()
        await wait_for(pilot, lambda: "What is 6 + 1?" in screen_text(app))


async def test_truncated_metrics_file_is_recovered(run):
    app = make_app(run)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: "step 5/200" in header(app))
        with open(run.run_dir / "metrics.jsonl", "w") as f:  # truncate and start again
            for step in (1, 2, 3):
                f.write(json.dumps(metric_record(step, run.time_of(step))) + "\n")
        await wait_for(pilot, lambda: "step 3/200" in header(app))
        assert len(app.board.runs[0].table) == 3


async def test_waits_for_a_run_directory_that_appears_later(tmp_path):
    writer = RunWriter(tmp_path / "later", total_steps=10)
    app = WatchApp([writer.run_dir], refresh=0.1, clock=lambda: writer.time_of(2) + 1)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: "WAITING" in header(app))
        writer.start()
        writer.log_step()
        writer.log_step()
        await wait_for(pilot, lambda: "step 2/10" in header(app) and "LIVE" in header(app))


async def test_states_in_the_header(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    crashed = RunWriter(tmp_path / "crashed", pid=dead.pid)
    crashed.start()
    crashed.log_step()
    finished = RunWriter(tmp_path / "done")
    finished.start()
    finished.log_step()
    finished.finish()
    stalled = RunWriter(tmp_path / "stalled", pid=os.getpid())
    stalled.start()
    stalled.log_step()
    clock = lambda: stalled.time_of(1) + 3600  # noqa: E731
    app = WatchApp([crashed.run_dir, finished.run_dir, stalled.run_dir], refresh=0.1, clock=clock)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        lines = header(app).splitlines()
        assert "CRASHED" in lines[0] and "FINISHED" in lines[1] and "STALLED" in lines[2]
        assert "ETA" not in lines[0] + lines[1]


async def test_several_runs_are_overlaid_with_a_colour_each(tmp_path):
    a = RunWriter(tmp_path / "a", name="run-a")
    b = RunWriter(tmp_path / "b", name="run-b", start_time=1_700_000_100.0)
    for w, n in ((a, 8), (b, 5)):
        w.start()
        for _ in range(n):
            w.log_step()
    app = make_app(a, b)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: "run-b" in header(app))
        reward = chart(app, "total reward")
        labels = [label for label, _, _ in reward.legend]
        colors = {color for _, color, _ in reward.legend}
        assert labels == ["run-a", "run-b"] and len(colors) == 2
        # Per-function rewards split into a chart per function, each overlaying both runs.
        titles = [c.chart_title for c in app.active_view().query(MetricChart)]
        assert "reward per function: answer_check" in titles


async def test_keys_smoothing_pause_refresh_filter_views_help(run):
    app = make_app(run)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: "step 5/" in header(app))
        assert "smoothing EMA 0.6" in header(app)
        await pilot.press("s")
        assert "smoothing EMA 0.9" in header(app)
        await pilot.press("s", "s")
        assert "smoothing off" in header(app)

        await pilot.press("p")
        assert "PAUSED" in header(app)
        run.log_step()
        await pilot.pause(0.3)
        assert "step 5/" in header(app)
        await pilot.press("p")
        await wait_for(pilot, lambda: "step 6/" in header(app))

        assert "refresh 0.1s" in header(app)
        await pilot.press("plus", "plus")
        assert "refresh 0.5s" in header(app)
        await pilot.press("minus")
        assert "refresh 0.25s" in header(app)

        await pilot.press("2", "slash", *"entropy", "enter")
        assert "filter 'entropy'" in header(app)
        visible = [c.chart_title for c in app.active_view().query(MetricChart) if c.display]
        assert visible == ["entropy"]
        # The filter belongs to the view it was typed in: the overview still shows everything.
        await pilot.press("1")
        assert "filter" not in header(app)
        assert all(c.display for c in app.active_view().query(MetricChart))
        await pilot.press("2")
        assert "filter 'entropy'" in header(app)
        await pilot.press("slash", "escape")
        assert "filter" not in header(app)
        assert all(c.display for c in app.active_view().query(MetricChart))

        await pilot.press("tab")
        assert app.query_one("#views").active == "lengths"
        await pilot.press("shift+tab", "shift+tab")
        assert app.query_one("#views").active == "overview"
        await pilot.press("8")
        await wait_for(pilot, lambda: "learning_rate" in screen_text(app))

        await pilot.press("question_mark")  # the help screen is drawn once it is mounted
        await wait_for(pilot, lambda: "STALLED" in screen_text(app) and "keys" in screen_text(app))
        await pilot.press("escape")
        await wait_for(pilot, lambda: "STALLED" not in screen_text(app))
        await pilot.press("q")
    assert app.return_code == 0


async def test_long_run_first_screen_then_history_fills_in(tmp_path):
    writer = RunWriter(tmp_path / "long", total_steps=5000)
    writer.start()
    with open(writer.run_dir / "metrics.jsonl", "w") as f:
        for step in range(1, 3001):
            f.write(json.dumps(metric_record(step, writer.time_of(step))) + "\n")
    writer.step = 3000
    size = (writer.run_dir / "metrics.jsonl").stat().st_size
    app = make_app(writer, reader_options={"tail_bytes": size // 10, "sync_history_bytes": 0,
                                           "history_chunk_bytes": size // 3})
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert "step 3,000/5,000" in header(app)
        assert "loading history" in header(app)
        await wait_for(pilot, lambda: "loading history" not in header(app), timeout=60)
        assert len(app.board.runs[0].table) == 3000
        await wait_for(pilot, lambda: "        1 " in screen_text(app).split("total reward")[1])


# ---------------------------------------------------------------------- any metric as a chart, runs


def chart_screen(app) -> ChartScreen | None:
    return app.screen if isinstance(app.screen, ChartScreen) else None


async def test_enter_on_a_metrics_row_opens_it_as_a_chart_that_follows_the_run(run):
    app = make_app(run)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: "step 5/" in header(app))
        await pilot.press("9", "slash", *"grad_norm", "enter")  # a metric with no place in views 1-5 works too
        assert app.active_view().names == ["policy/grad_norm"]
        await pilot.press("enter")
        await wait_for(pilot, lambda: chart_screen(app) is not None)
        shown = chart_screen(app)
        assert [c.metrics for c in shown.query(MetricChart)] == [["policy/grad_norm"]]
        text = screen_text(app)
        assert find_entry("policy/grad_norm").description in text  # what the metric is, from the catalogue
        assert "points" in text and "last step" in text
        await wait_for(pilot, lambda: shown.query_one(MetricChart).legend)
        before = shown.query_one(MetricChart).legend[0][2]
        run.log_step()
        await wait_for(pilot, lambda: shown.query_one(MetricChart).legend[0][2] != before)
        await pilot.press("escape")
        assert chart_screen(app) is None and app.query_one("#views").active == "metrics"


async def test_arrows_select_tiles_and_charts_and_enter_opens_them(run):
    app = make_app(run)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: "step 5/" in header(app))
        await wait_for(pilot, lambda: len(app.active_view().query(MetricChart)) == 3)
        await pilot.press("down")
        assert app.focused is tile(app, "rewards/total/mean")
        await pilot.press("right", "right")  # past accuracy; eval acc is hidden (the run logs no eval)
        assert app.focused is tile(app, "policy/kl")
        await pilot.press("enter")
        await wait_for(pilot, lambda: chart_screen(app) is not None)
        assert chart_screen(app).metrics == ("policy/kl",)
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.focused is tile(app, "policy/kl"))  # back where it was
        # Down goes to the nearest tile below, then to the charts; enter opens a chart with all its metrics.
        await pilot.press("down")
        assert app.focused is tile(app, "timing/step_s")
        await pilot.press("down")
        assert app.focused is chart(app, "accuracy")  # beside total reward: the first row of charts
        await pilot.press("down")
        assert app.focused is chart(app, "reward per function")
        await pilot.press("enter")
        await wait_for(pilot, lambda: chart_screen(app) is not None)
        assert set(chart_screen(app).metrics) == {"rewards/answer_check/mean", "rewards/format_exact/mean"}
        # A number key goes back to the views.
        await pilot.press("2")
        await wait_for(pilot, lambda: chart_screen(app) is None and app.query_one("#views").active == "policy")
        # And it stays there with the keyboard: the overview's focused chart, hidden by the switch, must not
        # pass the focus to a sibling, which would take the tabs back to the overview.
        assert app.query_one("#view-policy").has_focus_within
        await pilot.pause(0.3)
        assert app.query_one("#views").active == "policy"


async def test_a_click_on_a_tile_opens_its_chart(run):
    app = make_app(run)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: "step 5/" in header(app))
        await pilot.click(MetricTile)  # the first tile: reward
        await wait_for(pilot, lambda: chart_screen(app) is not None)
        assert chart_screen(app).metrics == ("rewards/total/mean",)


async def test_the_filter_applies_to_the_view_it_was_typed_in(run):
    run.alert("policy/kl", level="warning", message="KL is drifting")
    app = make_app(run)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: "step 5/" in header(app))
        await pilot.press("9", "slash", *"entropy", "enter")
        assert app.active_view().names == ["policy/entropy"]
        await pilot.press("6")  # the alerts view has its own (empty) filter: the KL alert is listed
        await wait_for(pilot, lambda: "KL is drifting" in screen_text(app))
        await pilot.press("slash", *"nothing-matches", "enter")
        await wait_for(pilot, lambda: "KL is drifting" not in screen_text(app))
        await pilot.press("9")
        assert app.active_view().names == ["policy/entropy"] and "filter 'entropy'" in header(app)


def runs_beside(tmp_path) -> tuple[RunWriter, RunWriter]:
    first = RunWriter(tmp_path / "runs" / "first", name="first")
    second = RunWriter(tmp_path / "runs" / "second", name="second", start_time=1_700_000_100.0)
    first.start()
    second.start(config={"model": "tiny-llama", "learning_rate": 3e-4, "num_steps": 100, "enable_alerts": False})
    for w, n in ((first, 6), (second, 4)):
        for _ in range(n):
            w.log_step()
    return first, second


async def test_run_browser_adds_and_removes_runs_beside_the_watched_one(tmp_path):
    first, second = runs_beside(tmp_path)
    (tmp_path / "runs" / "not-a-run").mkdir()
    app = make_app(first)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: "step 6/" in header(app))
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, RunPicker))
        picker = app.screen.query_one(SelectionList)
        listed = [str(o.prompt) for o in picker._options]
        assert len(listed) == 2 and "second" in listed[0] and "first" in listed[1]  # newest first
        assert "step 4/100" in listed[0] and "running" in listed[0]
        assert picker.selected == [1]  # the watched run
        await pilot.press("space", "enter")  # the highlighted row is the newest: add it
        await wait_for(pilot, lambda: len(header(app).splitlines()) == 3)
        assert header(app).splitlines()[0].startswith("● first")  # the watched run keeps its place and colour
        await wait_for(pilot, lambda: [label for label, _, _ in chart(app, "total reward").legend] == ["first", "second"])
        # Remove the first run again; escape would have changed nothing.
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, RunPicker))
        await pilot.press("escape")
        assert len(app.board.runs) == 2
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, RunPicker))
        await pilot.press("down", "space", "enter")
        await wait_for(pilot, lambda: [r.name for r in app.board.runs] == ["second"])
        assert "first" not in header(app)


async def test_config_view_lists_what_differs_between_overlaid_runs(tmp_path):
    first, second = runs_beside(tmp_path)
    app = make_app(first, second)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("8")
        await wait_for(pilot, lambda: "differences between the runs" in screen_text(app))
        lines = screen_text(app).splitlines()
        row = next(line for line in lines if "learning_rate" in line)
        assert "0.0001" in row and "0.0003" in row
        assert not any("model" in line and "tiny-llama" in line and "0.0" in line for line in lines)
        await pilot.press("slash", *"num_steps", "enter")  # the filter narrows the differences too
        await wait_for(pilot, lambda: "none: the runs have the same config" in screen_text(app))


async def test_every_view_renders_a_run_full_of_bad_records(run):
    """Deep nesting, wrong types, non-UTF-8 bytes and non-objects in every file: every view still draws,
    and the header counts the bad lines instead of the dashboard dying (reliability review D7)."""
    with open(run.run_dir / "metrics.jsonl", "ab") as fh:
        fh.write(b"[" * 100_000 + b"]" * 100_000 + b'\n{"step": "x", "rewards/total/mean": "y"}\n\xff\xfe\n[1]\n')
    with open(run.run_dir / "alerts.jsonl", "ab") as fh:
        fh.write(b'{"step": "x", "level": 3, "message": ["a"], "metric": null}\n')
    with open(run.run_dir / "samples.jsonl", "ab") as fh:
        fh.write(b'{"step": 5, "total": "y", "rewards": 3, "advantage": [1], "prompt": {"a": 1}}\n')
    info = json.loads((run.run_dir / "run.json").read_text())
    (run.run_dir / "run.json").write_text(json.dumps({**info, "config": {"alerts_file": 5}, "total_steps": "z"}))
    app = make_app(run)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: "step 5" in header(app))
        for view in "1234567":
            await pilot.press(view)
            await wait_for(pilot, lambda: app.query_one("#views").active == VIEW_KEYS[int(view) - 1]
                           and screen_text(app).strip())
        assert app.is_running
