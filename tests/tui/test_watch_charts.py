"""Dashboard charts as a TensorBoard user reads them: axes from the data (never below zero for a metric
that never is), round labels with gridlines, a log scale, legends that keep every name, accuracy on the
first screen with runs overlaid; System bars against 0-100%, wrapped alerts, prompts and expected
answers in Samples, a filter that takes pasted or fast-typed text."""

from __future__ import annotations

import numpy as np
import pytest
from run_writer import RunWriter, metric_record, sample_record
from screen_text import screen_text
from test_watch_app import chart, header, make_app, wait_for
from textual import events
from textual.widgets import DataTable

from mlx_grpo.tui.braille import log_ticks, nice_range, nice_ticks
from mlx_grpo.tui.chart import MetricChart, legend_lines

pytestmark = pytest.mark.anyio


def test_a_non_negative_metric_never_gets_a_negative_axis():
    for lo, hi in [(0.0, 0.03), (0.001, 0.002), (0.0, 0.0), (0.5, 49.0), (3.0, 3.0)]:
        assert nice_range(lo, hi)[0] >= 0, (lo, hi)
    assert nice_range(-2.0, -0.5)[1] <= 0 and nice_range(-1.0, 2.0)[0] < -1.0  # headroom where it is data


def test_ticks_are_round_values_inside_the_range():
    assert nice_ticks(0.0, 1.0, 6) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(0.013, 0.87, 5) == [0.2, 0.4, 0.6, 0.8]
    assert nice_ticks(0.192, 16.608, 4) == [5.0, 10.0, 15.0]  # three labels, not the single 10
    assert nice_ticks(-0.029, 0.4, 6) == [0.0, 0.1, 0.2, 0.3, 0.4]
    assert log_ticks(-2.1, 1.7, 6) == [-2.0, -1.0, 0.0, 1.0]
    assert [round(10 ** t, 9) for t in log_ticks(np.log10(0.29), np.log10(4.5), 5)] == [1.0, 2.0, 3.0, 4.0]


def test_the_legend_wraps_and_keeps_every_name():
    names = [f"reward_function_number_{i}" for i in range(6)]
    series = [(name, "#ffffff", np.arange(3.0), np.array([1.0, 2.0, 3.0]), None) for name in names]
    rows = legend_lines(series, plot_w=70, most=10)
    text = ["".join(seg.text for seg in row) for row in rows]
    assert len(rows) > 1 and all(len(line) <= 70 for line in text)
    assert all(sum(line.count(name + " ") for line in text) == 1 for name in names)


def _record(step: int, t: float, functions: int) -> dict:
    record = metric_record(step, t)
    record["policy/grad_norm"] = 49.0 if step == 6 else 0.02 + 0.001 * step  # one 49x spike
    record["eval/accuracy"] = 0.3 + 0.01 * step
    for i in range(functions):
        record[f"rewards/reward_function_{i}/mean"] = 0.1 * i + 0.01 * step
    return record


def _writer(path, name, steps=12, functions=5, start=1_700_000_000.0) -> RunWriter:
    writer = RunWriter(path, name=name, total_steps=100, start_time=start)
    writer.start()
    for step in range(1, steps + 1):
        writer.step = step
        t = writer.time_of(step)
        writer.append("metrics.jsonl", _record(step, t, functions))
        for k in range(2):
            writer.append("samples.jsonl", sample_record(step, t, k))
    return writer


def _labels(widget: MetricChart) -> list[str]:
    lines = ["".join(seg.text for seg in strip) for strip in widget._strips]
    return [line[:7].strip() for line in lines if line[7:8] == "┼"]


async def test_axes_gridlines_and_the_log_scale(tmp_path):
    run = _writer(tmp_path / "run", "one")
    app = make_app(run)
    async with app.run_test(size=(140, 45)) as pilot:
        await wait_for(pilot, lambda: "step 12/" in header(app))
        await pilot.press("2")  # policy
        grad = chart(app, "gradient norm")
        await wait_for(pilot, lambda: len(_labels(grad)) >= 3)
        labels = _labels(grad)
        assert all(not label.startswith("-") for label in labels), labels  # was -1.4 with a 0.02..49 series
        assert any("┈" in "".join(seg.text for seg in strip) for strip in grad._strips)  # gridlines
        kl = chart(app, "KL")
        assert all(not label.startswith("-") for label in _labels(kl)), _labels(kl)
        await pilot.press("y")
        await wait_for(pilot, lambda: grad.log_scale)
        assert "y log" in header(app)
        # powers of ten over 0.02..49: the small values are no longer flattened by the spike
        assert {"0.1", "1", "10"} <= set(_labels(grad)), _labels(grad)
        loss = chart(app, "loss")  # a loss goes negative: it stays linear, and says so by not saying log
        assert not loss.log_scale


async def test_two_runs_keep_accuracy_on_the_first_screen_and_every_legend_name(tmp_path):
    a = _writer(tmp_path / "a", "run-a")
    b = _writer(tmp_path / "b", "run-b", start=1_700_000_100.0)
    app = make_app(a, b)
    async with app.run_test(size=(200, 50)) as pilot:
        await wait_for(pilot, lambda: "run-b" in header(app))
        await wait_for(pilot, lambda: any(c.chart_title.startswith("accuracy") for c in
                                          app.active_view().query(MetricChart)))
        await pilot.pause(0.3)
        view = app.active_view()
        first_screen = view.region.y + view.region.height
        accuracy = [c for c in view.query(MetricChart) if c.chart_title.startswith("accuracy")]
        assert accuracy and all(c.region.y < first_screen and c.region.height > 0 for c in accuracy)
        text = screen_text(app)
        assert "run-a" in text and "run-b" in text


async def test_system_bars_read_against_0_to_100_percent(tmp_path):
    run = _writer(tmp_path / "run", "one")
    app = make_app(run)
    async with app.run_test(size=(140, 45)) as pilot:
        await wait_for(pilot, lambda: "step 12/" in header(app))
        await pilot.press("5")  # system
        await wait_for(pilot, lambda: "memory %" in screen_text(app))
        line = next(row for row in screen_text(app).splitlines() if row.strip().startswith("memory %"))
        # 40% memory, flat: a bar at 40% of the height (▄-ish), never a full bar
        assert "█" not in line and ("▃" in line or "▄" in line), line


async def test_long_alert_messages_wrap_and_samples_show_prompt_and_expected_answer(tmp_path):
    run = _writer(tmp_path / "run", "one")
    long = "the KL divergence to the reference rose above its limit " * 4 + "END-OF-MESSAGE"
    run.alert("policy/kl", message=long)
    app = make_app(run)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: "step 12/" in header(app))
        await pilot.press("6")  # alerts
        await wait_for(pilot, lambda: "END-OF-MESSAGE" in screen_text(app))
        await pilot.press("7")  # samples
        await wait_for(pilot, lambda: "What is 12 + 1?" in screen_text(app))
        table = app.active_view().query_one(DataTable)
        # the answer and the scores first, where a narrow list still shows them; then expected and the prompt
        assert [str(c.label) for c in table.columns.values()][:6] == ["step", "total", "ok", "completion (its end)",
                                                                      "expected", "prompt"]
        assert "13" in screen_text(app)


async def test_the_filter_takes_pasted_and_fast_typed_text(tmp_path):
    run = _writer(tmp_path / "run", "one")
    app = make_app(run)
    async with app.run_test(size=(140, 45)) as pilot:
        await wait_for(pilot, lambda: "step 12/" in header(app))
        await pilot.press("9")  # metrics
        app.post_message(events.Paste("/zero_std"))  # a paste of the whole filter, slash included
        await wait_for(pilot, lambda: app.filter == "zero_std")
        await pilot.press("escape")
        assert app.filter == ""
        for character in "/policy/grad_norm":  # a burst, as a fast link delivers it: no pause between keys
            app.post_message(events.Key(character if character != "/" else "slash", character))
        await wait_for(pilot, lambda: app.filter == "policy/grad_norm")  # a second / is text
        assert app.active_view().names == ["policy/grad_norm"]


async def test_at_80x24_accuracy_is_on_the_first_screen_alone_with_held_out_and_every_tab_is_listed(tmp_path):
    a = _writer(tmp_path / "a", "run-a")
    with open(tmp_path / "a" / "metrics.jsonl", "a") as fh:  # the built-in task's per-difficulty accuracy
        import json

        fh.write(json.dumps({"step": 13, "time": a.time_of(13), "difficulty/1/accuracy": 0.5,
                             "difficulty/2/accuracy": 0.4}) + "\n")
    app = make_app(a)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: any(c.chart_title == "accuracy" for c in app.active_view().query(MetricChart)))
        await pilot.pause(0.3)
        view = app.active_view()
        first_screen = view.region.y + view.region.height
        (accuracy,) = [c for c in view.query(MetricChart) if c.chart_title == "accuracy"]
        assert accuracy.region.height > 0 and accuracy.region.y + accuracy.region.height <= first_screen
        assert not any("difficulty" in m for m in accuracy.metrics)
        text = screen_text(app)
        assert all(f"{i} " in text for i in range(1, 10)) and "9 Metr" in text
        assert "ETA" in header(app).splitlines()[0]


async def test_before_the_first_metrics_the_overview_says_the_held_out_evaluation_is_running(tmp_path):
    writer = RunWriter(tmp_path / "a", name="run-a", total_steps=200, start_time=1_700_000_000.0)
    writer.start(config={"num_steps": 200, "eval_every": 25, "eval_size": 200})
    app = make_app(writer)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: "evaluating held-out accuracy (200 prompts) before the first update"
                       in screen_text(app))
        writer.log_step()  # the first record: the note goes, the tiles and charts come
        await wait_for(pilot, lambda: "evaluating held-out" not in screen_text(app))


async def test_an_alerts_view_with_no_alerts_says_so(tmp_path):
    app = make_app(_writer(tmp_path / "a", "run-a"))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("6")
        await wait_for(pilot, lambda: "no alerts yet" in screen_text(app))


def test_the_samples_list_shows_each_completions_answer_not_its_opening_tags():
    from mlx_grpo.tui.samples_view import PREVIEW, _end

    completion = "<reasoning>" + "carry the one " * 20 + "</reasoning>\n<answer>1065</answer>\n"
    assert _end(completion, PREVIEW).endswith("<answer>1065") and len(_end(completion, PREVIEW)) == PREVIEW
