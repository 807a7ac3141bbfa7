"""run.json as RunInfo: partial and malformed files read without raising, the on-disk layout kept.

The round trip of a run.json written by a real run is in test_default_run_telemetry.py (a fresh run) and
test_resume.py (a resumed one); random content is in test_reader_fuzz.py.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from run_writer import start_sinks

from mlx_grpo.telemetry.rundir.layout import RUN_JSON
from mlx_grpo.telemetry.rundir.writer import Resume, RunDirWriter, RunInfo, read_run_info, write_run_info


@pytest.mark.parametrize("obj", [None, 3, "run", [], [{"name": "x"}], True, 1.5])
def test_anything_but_an_object_is_an_empty_run_info(obj):
    assert RunInfo.from_dict(obj) == RunInfo()


def test_wrong_types_become_defaults_and_unknown_keys_are_kept():
    info = RunInfo.from_dict({
        "schema_version": "1", "run_id": 7, "name": ["a"], "start_time": "yesterday", "end_time": float("nan"),
        "status": None, "pid": True, "hostname": {"h": 1}, "config": [1, 2], "versions": "0.1",
        "device": {"world_size": "2"}, "total_steps": 0, "resumes": {"step": 3},
        "notes": {"deep": [[{"x": None}]]}, "num_tpu_cores": 0,
    })
    assert info == RunInfo(device={"world_size": "2"},
                           extra={"notes": {"deep": [[{"x": None}]]}, "num_tpu_cores": 0})
    assert info.world_size == 1 and not info.ended and info.last_session_start is None


@pytest.mark.parametrize("pid", [0, -1, 2**31, 10**400, 3.0])
def test_a_number_no_process_can_have_is_no_pid(pid):
    assert RunInfo.from_dict({"pid": pid}).pid is None  # os.kill and psutil would raise OverflowError


@pytest.mark.parametrize("start", [float("inf"), -float("inf"), 10**400, False])
def test_a_time_that_is_no_finite_number_is_none(start):
    assert RunInfo.from_dict({"start_time": start}).start_time is None


def test_resumes_keep_their_entries_and_drop_what_is_not_one():
    info = RunInfo.from_dict({"start_time": 10.0, "resumes": [
        {"time": 20.0, "step": 3, "previous_status": "interrupted"}, "junk", None, [1],
        {"time": "late", "step": 1.5, "previous_status": 4, "other": 1}, {"time": 30}]})
    assert info.resumes == [Resume(20.0, 3, "interrupted"), Resume(), Resume(time=30)]
    assert info.last_session_start == 30


def test_to_dict_is_the_writers_layout_with_unknown_keys_last(tmp_path):
    written = start_sinks(RunDirWriter(tmp_path), tmp_path, "r", {"lr": 0.1}, versions={"python": "3.11"},
                          device={"backend": "cpu", "world_size": 2}, total_steps=3)
    on_disk = json.loads((tmp_path / RUN_JSON).read_text())
    assert list(on_disk) == ["schema_version", "run_id", "name", "start_time", "end_time", "status", "pid",
                             "hostname", "config", "versions", "device", "total_steps"]
    assert read_run_info(tmp_path) == written and written.world_size == 2
    write_run_info(tmp_path, RunInfo.from_dict({**on_disk, "later_key": [1]}))
    assert list(json.loads((tmp_path / RUN_JSON).read_text()))[-1] == "later_key"


def test_a_resume_keeps_the_run_id_start_and_unknown_keys_and_records_the_previous_status(tmp_path):
    first = start_sinks(RunDirWriter(tmp_path), tmp_path, "r", {"lr": 0.1}, total_steps=3)
    write_run_info(tmp_path, replace(first, extra={"from_a_later_version": 1}))
    resumed = start_sinks(RunDirWriter(tmp_path), tmp_path, "r", {"lr": 0.1}, total_steps=5, resume_step=2)
    assert (resumed.run_id, resumed.start_time) == (first.run_id, first.start_time)
    assert [(r.step, r.previous_status) for r in resumed.resumes] == [(2, "running")]
    assert resumed.extra == {"from_a_later_version": 1}
    assert json.loads((tmp_path / RUN_JSON).read_text())["resumes"][0]["step"] == 2


@pytest.mark.parametrize("content", [b"", b"{", b"[1]", b"\xff\xfe", b"[" * 100_000 + b"]" * 100_000])
def test_an_unreadable_run_json_reads_as_none(tmp_path, content):
    (tmp_path / RUN_JSON).write_bytes(content)
    assert read_run_info(tmp_path) is None
    assert read_run_info(tmp_path / "missing") is None
