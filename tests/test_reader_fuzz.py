"""Readers that cannot be crashed: random and adversarial content in every run-directory file.

Every reader of a run directory (the dashboard's reader and its views' data, `report`, `compare`,
`sweep`'s trial state, resume's checks and last record, the run browser) must survive anything a file can hold: wrong types, deep
nesting, non-UTF-8 bytes, partial and huge lines, non-objects. Bad lines are skipped and counted,
never raised. Hypothesis generates the content; the examples are bounded so CI stays fast.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mlx_grpo.errors import UserError  # noqa: E402
from mlx_grpo.resume import last_record, resumable_checkpoint  # noqa: E402
from mlx_grpo.sweep import trial_state  # noqa: E402
from mlx_grpo.telemetry.analysis.compare import load_summary  # noqa: E402
from mlx_grpo.telemetry.analysis.report import build_report  # noqa: E402
from mlx_grpo.telemetry.rundir.writer import RunInfo  # noqa: E402
from mlx_grpo.telemetry.rundir.reader import RunReader  # noqa: E402
from mlx_grpo.tui.run_picker import read_entry  # noqa: E402
from run_writer import RunWriter  # noqa: E402

FILES = ("metrics.jsonl", "samples.jsonl", "alerts.jsonl")
FIELDS = ("step", "time", "level", "rule", "metric", "value", "message", "total", "advantage", "length",
          "truncated", "correct", "prompt", "completion", "rewards", "rewards/total/mean", "policy/kl",
          "accuracy/train", "eval/accuracy", "timing/step_s", "tokens/total", "name", "status", "config",
          "start_time", "alerts_file", "total_steps", "pid", "end_time", "hostname", "resumes", "device",
          "world_size", "versions", "run_id", "schema_version", "previous_status")

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                    st.text(max_size=20))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.sampled_from(FIELDS), inner, max_size=4)),
                      max_leaves=12)
records = st.dictionaries(st.sampled_from(FIELDS), values, max_size=8)


def deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


lines = st.one_of(
    records.map(lambda r: json.dumps(r, allow_nan=True).encode()),  # wrong types in known fields
    values.map(lambda v: json.dumps(v, allow_nan=True).encode()),  # not an object at all
    st.binary(max_size=60),  # non-UTF-8, control characters, half a line
    st.sampled_from([deep(100_000), b'{"step": ' + deep(50_000) + b"}", b"x" * 2_000_000,
                     b'{"step": 1e999}', b'{"step": "1"}', b"\xff\xfe{}"]),
)
contents = st.lists(lines, max_size=6).map(lambda ls: b"\n".join(ls))


@pytest.fixture(scope="module")
def good_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("good") / "run"
    writer = RunWriter(run_dir, total_steps=6)
    writer.start()
    for _ in range(6):
        writer.log_step()
    writer.alert("policy/kl")
    writer.finish()
    return run_dir


def read_everything(run_dir: Path) -> None:
    reader = RunReader(run_dir)
    reader.poll()
    view = reader.state
    now = view.start_time or 0.0
    status = view.status(now, alive=lambda pid: False)
    for value in (view.name, view.total_steps, view.step, view.seconds_per_step(), view.elapsed(now, status),
                  view.eta(status), view.standing_alerts(), view.garbage_total):
        str(value)
    last_record(run_dir)
    trial_state(run_dir)
    read_entry(run_dir)
    for read in (load_summary, build_report, lambda path: resumable_checkpoint(path, 6)):
        try:
            read(run_dir)
        except UserError:
            pass  # one clear line for a run with nothing usable: allowed; a traceback is not


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(target=st.sampled_from(FILES + ("run.json", "final_metrics.json")), content=contents, append=st.booleans())
def test_no_content_of_any_run_file_crashes_a_reader(good_run, tmp_path_factory, target, content, append):
    run_dir = tmp_path_factory.mktemp("fuzz") / "run"
    shutil.copytree(good_run, run_dir)
    path = run_dir / target
    path.write_bytes((path.read_bytes() + b"\n" if append and path.exists() else b"") + content)
    read_everything(run_dir)


@settings(max_examples=300, deadline=None, database=None)
@given(obj=st.one_of(records, values))
def test_run_info_reads_anything_and_writes_it_back_the_same(obj):
    info = RunInfo.from_dict(obj)
    for value in (info.name, info.status, info.run_id, info.hostname):
        assert value is None or isinstance(value, str)
    for value in (info.pid, info.total_steps):
        assert value is None or (isinstance(value, int) and value > 0)
    assert info.start_time is None or math.isfinite(info.start_time)
    assert isinstance(info.config, dict) and info.world_size >= 1 and isinstance(info.ended, bool)
    str(info.last_session_start)
    json.dumps(info.to_dict(), allow_nan=True)
    assert RunInfo.from_dict(info.to_dict()) == info


def test_bad_lines_are_skipped_and_counted_not_raised(good_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(good_run, run_dir)
    with open(run_dir / "metrics.jsonl", "ab") as fh:
        fh.write(deep(200_000) + b"\n" + b'{"step": "x"}\n' + b"\xff\xfe\n" + b"[1, 2]\n")
    with open(run_dir / "alerts.jsonl", "ab") as fh:
        fh.write(b'{"step": "x", "level": 3, "message": ["a"]}\n')
    reader = RunReader(run_dir)
    reader.poll()
    assert reader.state.garbage_total >= 3  # the deep line, the bytes, the list
    summary = load_summary(run_dir)
    assert summary.steps == 6
    build_report(run_dir)


def test_history_lines_parse_the_same_with_orjson_and_without(monkeypatch):
    import json as _json

    from mlx_grpo.telemetry import history_loader

    lines = [b'{"step": 1, "x": NaN, "y": -Infinity}', b'{"step": 2, "big": 12345678901234567890}',
             '{"step": 3, "name": "r\u00e9ward \u2603"}'.encode(), b'{"step": 4, "x": 1e400}']
    expected = [_json.loads(line) for line in lines]
    with_orjson = [history_loader._loads(line) for line in lines]
    monkeypatch.setattr(history_loader, "orjson", None)
    without = [history_loader._loads(line) for line in lines]
    assert repr(with_orjson) == repr(expected) == repr(without)
