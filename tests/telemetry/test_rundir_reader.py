"""Live tailing of a run directory: what the dashboard reads while a trainer writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from run_writer import RunWriter, metric_record

from mlx_grpo.common.errors import UserError
from mlx_grpo.telemetry.analysis.alert_replay import AlertReplay
from mlx_grpo.telemetry.rundir.jsonl_tail import JsonlTail
from mlx_grpo.telemetry.rundir.metric_table import table_from_records
from mlx_grpo.telemetry.rundir.reader import STANDING_RECORDS, RunReader, resolve_run_dirs


def write(path, text: str, mode: str = "a") -> None:
    with open(path, mode) as f:
        f.write(text)


# ---------------------------------------------------------------------- JsonlTail

def test_partial_last_line_is_held_until_its_newline(tmp_path):
    path = tmp_path / "m.jsonl"
    tail = JsonlTail(path)
    write(path, '{"step": 1}\n{"step": 2, "x": 0.5')
    assert [r["step"] for r in tail.poll().records] == [1]
    assert tail.pending_partial
    write(path, '1}\n')
    assert tail.poll().records == [{"step": 2, "x": 0.51}]
    assert tail.garbage_lines == 0


def test_missing_file_reads_as_empty_until_it_appears(tmp_path):
    path = tmp_path / "later.jsonl"
    tail = JsonlTail(path)
    assert tail.poll().records == []
    write(path, '{"step": 1}\n')
    assert tail.poll().records == [{"step": 1}]


def test_truncated_file_is_read_again_from_the_start(tmp_path):
    path = tmp_path / "m.jsonl"
    tail = JsonlTail(path)
    write(path, "".join(json.dumps({"step": i}) + "\n" for i in range(10)))
    assert len(tail.poll().records) == 10
    write(path, '{"step": 100}\n', mode="w")
    result = tail.poll()
    assert result.reset
    assert result.records == [{"step": 100}]


def test_replaced_file_is_noticed_even_when_it_is_longer(tmp_path):
    path = tmp_path / "m.jsonl"
    tail = JsonlTail(path)
    write(path, '{"step": 1}\n')
    tail.poll()
    new = tmp_path / "new.jsonl"
    write(new, "".join(json.dumps({"step": i, "pad": "x" * 50}) + "\n" for i in range(5, 9)))
    os.replace(new, path)  # a new inode, larger than the old offset
    result = tail.poll()
    assert result.reset
    assert [r["step"] for r in result.records] == [5, 6, 7, 8]


def test_rewritten_in_place_with_same_length_is_noticed(tmp_path):
    path = tmp_path / "m.jsonl"
    tail = JsonlTail(path)
    write(path, '{"step": 1}\n')
    tail.poll()
    with open(path, "r+") as f:  # same inode, same size, different content
        f.write('{"step": 7}\n')
    write(path, '{"step": 8}\n')
    result = tail.poll()
    assert result.reset
    assert [r["step"] for r in result.records] == [7, 8]


def test_file_cut_back_and_grown_past_the_offset_between_polls_is_reread(tmp_path):
    # A resumed run cuts metrics.jsonl back to its checkpoint and logs on; a
    # slow poll can find the file longer than before with other bytes at the offset.
    path = tmp_path / "m.jsonl"
    write(path, "".join(json.dumps({"step": i, "v": 1.0}) + "\n" for i in range(1, 21)))
    tail = JsonlTail(path)
    assert len(tail.poll().records) == 20
    with open(path, "r+") as f:
        lines = f.readlines()
        f.seek(0)
        f.truncate()
        f.writelines(lines[:10])  # back to step 10
        f.writelines(json.dumps({"step": i, "v": 2.0, "resumed": True}) + "\n" for i in range(11, 40))
    result = tail.poll()
    assert result.reset
    assert [r["step"] for r in result.records] == list(range(1, 40))
    assert tail.garbage_lines == 0


def test_garbage_lines_are_skipped_and_counted(tmp_path):
    path = tmp_path / "m.jsonl"
    with open(path, "wb") as f:
        f.write(b'{"step": 1}\nnot json\n[1, 2]\n\xff\xfe\n\n{"step": 2}\n')
    tail = JsonlTail(path)
    assert [r["step"] for r in tail.poll().records] == [1, 2]
    assert tail.garbage_lines == 3


def test_final_poll_takes_a_complete_unterminated_last_line(tmp_path):
    path = tmp_path / "m.jsonl"
    write(path, '{"step": 1}\n{"step": 2}')
    tail = JsonlTail(path)
    assert len(tail.poll().records) == 1
    assert tail.poll(final=True).records == [{"step": 2}]


def test_initial_tail_starts_on_a_line_boundary(tmp_path):
    path = tmp_path / "m.jsonl"
    lines = [json.dumps({"step": i, "v": 0.1 * i}) + "\n" for i in range(1000)]
    write(path, "".join(lines))
    tail = JsonlTail(path, initial_tail_bytes=500)
    result = tail.poll()
    assert 0 < result.skipped_to < path.stat().st_size
    steps = [r["step"] for r in result.records]
    assert steps == list(range(steps[0], 1000))  # whole lines only, up to the end
    assert tail.garbage_lines == 0
    assert len("".join(lines[: steps[0]]).encode()) == result.skipped_to


# ---------------------------------------------------------------------- MetricTable

def test_resumed_run_replaces_the_steps_it_logs_again():
    recs = [metric_record(s, float(s)) for s in (1, 2, 3, 4, 5)]
    recs += [{**metric_record(s, 100.0 + s), "policy/kl": 9.0} for s in (4, 5, 6)]
    table, rejected = table_from_records(recs)
    assert rejected == 0
    assert table.steps.tolist() == [1, 2, 3, 4, 5, 6]
    assert table.column("policy/kl").tolist()[3:] == [9.0, 9.0, 9.0]


def test_bad_values_become_gaps_and_bad_steps_are_rejected():
    table, rejected = table_from_records([
        {"step": 1, "a": 1.0}, {"step": "two", "a": 2.0}, {"step": 3, "a": None}, {"step": 4, "a": [1]},
        {"a": 5.0}, {"step": 6.0, "a": float("inf")}, {"step": 7, "b": 7.0},
    ])
    assert rejected == 2
    assert table.steps.tolist() == [1, 3, 4, 6, 7]
    a = table.column("a")
    assert a[0] == 1.0 and np.isnan(a[1:]).all()
    assert table.last_value("a") == 1.0
    assert table.last_value("b") == 7.0


@pytest.mark.parametrize("value", [[], [2.0], [[1, 2]], {}])
def test_a_field_holding_the_same_container_in_every_record_is_a_gap(value):
    # numpy turns lists of one shape into a 2-D array without complaint ([[]] is (1, 0)): the reader
    # crashed on a metrics.jsonl whose only line was {"time": [], "step": 0} (found by the fuzz test)
    table, rejected = table_from_records([{"step": 1, "time": value, "a": value},
                                          {"step": 2, "time": value, "a": value}])
    assert rejected == 0 and table.steps.tolist() == [1, 2]
    assert np.isnan(table.column("a")).all()


def test_history_prepended_before_the_tail_keeps_one_row_per_step():
    older, _ = table_from_records([metric_record(s, s) for s in range(1, 11)])
    newer, _ = table_from_records([metric_record(s, s) for s in range(8, 15)])
    newer.prepend_table(older)
    assert newer.steps.tolist() == list(range(1, 15))
    assert not np.isnan(newer.column("policy/kl")).any()


# ---------------------------------------------------------------------- RunReader

def test_run_directory_that_appears_later_is_picked_up(tmp_path):
    run_dir = tmp_path / "runs" / "late"
    reader = RunReader(run_dir)
    assert not reader.poll()
    assert reader.state.status(now=0) == "waiting"
    writer = RunWriter(run_dir, total_steps=50)
    writer.start()
    for _ in range(3):
        writer.log_step()
    assert reader.poll()
    assert reader.state.step == 3
    assert reader.state.total_steps == 50
    assert reader.state.status(now=writer.time_of(3) + 1) == "live"
    assert len(reader.state.samples) == 6


def test_truncated_metrics_file_is_reloaded(tmp_path):
    writer = RunWriter(tmp_path / "r")
    writer.start()
    for _ in range(20):
        writer.log_step()
    reader = RunReader(writer.run_dir)
    reader.poll()
    assert reader.state.step == 20
    # The file is rewritten from scratch (e.g. the user restarted the run in place).
    write(writer.run_dir / "metrics.jsonl", json.dumps(metric_record(1, writer.time_of(1))) + "\n", mode="w")
    assert reader.poll()
    assert reader.state.step == 1
    assert len(reader.state.table) == 1


def test_garbage_in_metrics_is_counted_for_the_header(tmp_path):
    writer = RunWriter(tmp_path / "r")
    writer.start()
    writer.log_step()
    write(writer.run_dir / "metrics.jsonl", "{oops\n")
    writer.log_step()
    reader = RunReader(writer.run_dir)
    reader.poll()
    assert reader.state.step == 2
    assert reader.state.garbage["metrics.jsonl"] == 1


def test_states_from_run_json_and_from_silence(tmp_path):
    writer = RunWriter(tmp_path / "r", step_seconds=2.0, total_steps=100)
    writer.start()
    reader = RunReader(writer.run_dir)
    reader.poll()
    st = reader.state
    assert st.status(now=writer.start_time + 10) == "starting"
    assert st.status(now=writer.start_time + 3600) == "stalled"
    for _ in range(20):
        writer.log_step()
    reader.poll()
    last = writer.time_of(20)
    assert st.status(now=last + 5) == "live"
    # 2 s per step: stalled after max(60 s, 10 x 2 s).
    assert st.status(now=last + 59) == "live"
    assert st.status(now=last + 61) == "stalled"
    assert st.eta("live") == pytest.approx(80 * 2.0)
    assert st.elapsed(last + 5, "live") == pytest.approx(last + 5 - writer.start_time)
    for status in ("finished", "interrupted", "failed"):
        writer.finish(status)
        reader.poll()
        assert st.status(now=last + 10_000) == status
        assert st.eta(status) is None
        assert st.elapsed(last + 10_000, status) == pytest.approx(last + 1 - writer.start_time)


def test_dead_writer_process_means_crashed(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    writer = RunWriter(tmp_path / "r", pid=proc.pid)
    writer.start()
    writer.log_step()
    reader = RunReader(writer.run_dir)
    reader.poll()
    assert reader.state.status(now=writer.time_of(1)) == "crashed"
    alive = RunWriter(tmp_path / "r2", pid=os.getpid())
    alive.start()
    alive.log_step()
    reader2 = RunReader(alive.run_dir)
    reader2.poll()
    assert reader2.state.status(now=alive.time_of(1)) == "live"


def test_alert_stands_until_enough_records_follow(tmp_path):
    writer = RunWriter(tmp_path / "r")
    writer.start()
    for _ in range(5):
        writer.log_step()
    writer.alert("policy/kl", level="error")
    reader = RunReader(writer.run_dir)
    reader.poll()
    assert reader.state.standing_alerts() == {"policy/kl": "error"}
    for _ in range(STANDING_RECORDS - 1):
        writer.log_step()
    reader.poll()
    assert reader.state.standing_alerts() == {"policy/kl": "error"}
    writer.log_step()
    reader.poll()
    assert reader.state.standing_alerts() == {}
    assert len(reader.state.alerts) == 1


def test_run_rules_are_evaluated_here_when_the_file_has_no_alert(tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text("defaults: false\nrules:\n  - {name: kl_high, kind: threshold, metric: policy/kl, "
                     "op: '>', value: 0.05, cooldown: 1000}\n")
    writer = RunWriter(tmp_path / "r")
    writer.start(config={"enable_alerts": True, "alerts_file": str(rules)})
    reader = RunReader(writer.run_dir, replay=AlertReplay())
    for _ in range(30):  # policy/kl = 0.002 * step crosses 0.05 at step 26
        writer.log_step()
        reader.poll()
    entries = [e for e in reader.state.alerts if e.alert.rule == "kl_high"]
    assert [(e.alert.step, e.source) for e in entries] == [(26, "dashboard")]
    # The trainer's own copy of the same alert replaces the one evaluated here.
    write(writer.run_dir / "alerts.jsonl", json.dumps({
        "step": 26, "time": writer.time_of(26), "level": "warning", "rule": "kl_high",
        "metric": "policy/kl", "value": 0.052, "message": "from the trainer"}) + "\n")
    reader.poll()
    entries = [e for e in reader.state.alerts if e.alert.rule == "kl_high"]
    assert [(e.alert.message, e.source) for e in entries] == [("from the trainer", "run")]


def test_long_history_loads_in_the_background_and_joins_the_tail(tmp_path):
    writer = RunWriter(tmp_path / "r", total_steps=3000)
    writer.start()
    lines = "".join(json.dumps(metric_record(s, writer.time_of(s))) + "\n" for s in range(1, 3001))
    write(writer.run_dir / "metrics.jsonl", lines)
    size = len(lines.encode())
    reader = RunReader(writer.run_dir, tail_bytes=size // 10, sync_history_bytes=0,
                       history_chunk_bytes=size // 4)
    reader.poll()
    st = reader.state
    assert st.step == 3000  # the first screen already shows the newest step
    assert len(st.table) < 400 and st.history_progress is not None
    deadline = time.time() + 60
    while st.history_progress is not None and time.time() < deadline:
        time.sleep(0.05)
        reader.poll()
    assert st.history_progress is None
    assert st.table.steps.tolist() == list(range(1, 3001))
    full, _ = table_from_records(json.loads(row) for row in lines.splitlines())
    np.testing.assert_array_equal(st.table.column("rewards/total/mean"), full.column("rewards/total/mean"))
    reader.close()


def test_default_run_is_the_newest_under_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="no runs under"):
        resolve_run_dirs([])
    RunWriter(tmp_path / "runs" / "old", start_time=1000.0).start()
    RunWriter(tmp_path / "runs" / "new", start_time=2000.0).start()
    assert resolve_run_dirs([]) == [Path("runs/new")]
    assert resolve_run_dirs([str(tmp_path / "runs")]) == [tmp_path / "runs" / "new"]
    assert resolve_run_dirs(["not/yet"]) == [Path("not/yet")]
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(UserError, match="is not a directory"):
        resolve_run_dirs(["file.txt"])
