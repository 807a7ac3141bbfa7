"""Snapshots of the dashboard's main views on a fixed run (pytest-textual-snapshot).

The clock and the time zone are fixed and the run directories have fixed
relative paths, so the screens are the same on every machine. After an intended change to the look:
pytest tests/tui/test_watch_snapshots.py --snapshot-update, and check the SVGs. Each test presses its keys in
run_before and waits there for the screen to settle (screen_text.settle), so a loaded machine takes the same picture.
"""

from __future__ import annotations

import time
from functools import partial

import pytest
from run_writer import RunWriter
from screen_text import settle

from mlx_grpo.tui.app import WatchApp

SIZE = (130, 42)
STEPS = 60


@pytest.fixture
def fixed_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the config view shows the run directory as given
    monkeypatch.setenv("TZ", "UTC")  # and run.json's times as local times
    time.tzset()
    main = RunWriter(tmp_path / "runs" / "demo", name="demo", total_steps=100)
    main.start()
    for _ in range(STEPS):
        main.log_step()
    main.alert("policy/kl", level="warning", message="KL above 0.1 for 3 steps")
    other = RunWriter(tmp_path / "runs" / "other", name="other", total_steps=100, start_time=main.start_time + 3)
    other.start(config={"model": "tiny-llama", "learning_rate": 3e-4, "num_steps": 100, "enable_alerts": False})
    for _ in range(STEPS // 2):
        other.log_step()
    yield main
    monkeypatch.undo()  # the time zone as it was, for the tests after this one
    time.tzset()


def app_for(*names: str, main: RunWriter) -> WatchApp:
    return WatchApp([f"runs/{n}" for n in names], refresh=3600, clock=lambda: main.time_of(STEPS) + 1.0)


@pytest.mark.parametrize("keys", [[], ["2"], ["5"], ["6"], ["7"], ["8"], ["9"], ["question_mark"]],
                         ids=["overview", "policy", "system", "alerts", "samples", "config", "metrics", "help"])
def test_view(snap_compare, fixed_runs, keys):
    assert snap_compare(app_for("demo", main=fixed_runs), run_before=partial(settle, keys=keys), terminal_size=SIZE)


def test_two_runs_overlaid(snap_compare, fixed_runs):
    assert snap_compare(app_for("demo", "other", main=fixed_runs), run_before=settle, terminal_size=SIZE)


def test_two_runs_config_differences(snap_compare, fixed_runs):
    assert snap_compare(app_for("demo", "other", main=fixed_runs), run_before=partial(settle, keys=["8"]),
                        terminal_size=SIZE)


@pytest.mark.parametrize("keys", [["9", "slash", *"entropy", "enter", "enter"], ["down", "right", "right", "enter"]],
                         ids=["from-metrics-table", "from-tile"])
def test_metric_opened_as_chart(snap_compare, fixed_runs, keys):
    assert snap_compare(app_for("demo", "other", main=fixed_runs), run_before=partial(settle, keys=keys),
                        terminal_size=SIZE)


def test_run_browser(snap_compare, fixed_runs):
    assert snap_compare(app_for("demo", main=fixed_runs), run_before=partial(settle, keys=["r"]), terminal_size=SIZE)


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
def test_small_and_common_terminals_keep_every_tab_and_accuracy_on_the_first_screen(snap_compare, fixed_runs, size):
    """btop-style: at 80x24 the header stays one line a run, every tab is listed (short titles), and total reward
    and accuracy (train against held-out only) are both on the first screen."""
    assert snap_compare(app_for("demo", main=fixed_runs), run_before=settle, terminal_size=size)
