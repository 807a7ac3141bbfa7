"""Readers that cannot be crashed: random and adversarial content in every run-directory file, hostile file
types where a run file should be, and random text on the command line and in every YAML file a user names.

Every reader of a run directory (the dashboard's reader and its views' data, `report`, `compare`,
`sweep`'s trial state, resume's checks and last record, the run browser) must survive anything a file can hold: wrong types, deep
nesting, non-UTF-8 bytes, partial and huge lines, non-objects; and any file type: a FIFO, a directory,
/dev/zero, a symlink loop (opened non-blocking, refused, never hung on). Bad lines are skipped and counted,
never raised. Every config, sweep, rubric and alert file, and every flag, is read to a value or one UserError.
Hypothesis generates the content with a fixed seed (derandomize) and bounded examples, and each test has a
time cap (TIME_CAP_S), so CI stays fast and a hang fails instead of blocking.
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import signal
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from run_writer import RunWriter  # noqa: E402

from mlx_grpo.common.errors import UserError  # noqa: E402
from mlx_grpo.measuring.sweep import trial_state  # noqa: E402
from mlx_grpo.run.resume import last_record, resumable_checkpoint  # noqa: E402
from mlx_grpo.telemetry.analysis.alert_replay import AlertReplay  # noqa: E402
from mlx_grpo.telemetry.analysis.compare import load_summary  # noqa: E402
from mlx_grpo.telemetry.analysis.report import build_report  # noqa: E402
from mlx_grpo.telemetry.rundir.reader import RunReader  # noqa: E402
from mlx_grpo.telemetry.rundir.writer import RunInfo  # noqa: E402
from mlx_grpo.tui.run_picker import read_entry  # noqa: E402

# Every file a run directory can hold that some reader opens (docs/RUN_DIRECTORY.md).
FILES = ("metrics.jsonl", "samples.jsonl", "alerts.jsonl")
JSON_FILES = ("run.json", "final_metrics.json", "report.json", "checkpoints/step_2/state.json", ".lock")
TIME_CAP_S = 240  # per test: a reader that hangs fails the test instead of the CI job
FUZZ = settings(deadline=None, suppress_health_check=list(HealthCheck), database=None, derandomize=True)
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
    state = run_dir / "checkpoints" / "step_2"
    state.mkdir(parents=True)
    (state / "state.json").write_text(json.dumps({"step": 2, "rng": [0, 1], "order": {}}))
    (run_dir / "report.json").write_text("{}")
    return run_dir


@pytest.fixture(autouse=True)
def time_cap():
    """A hang (a FIFO opened blocking, a read of /dev/zero) fails the test after TIME_CAP_S."""
    def expired(signum, frame):
        raise TimeoutError(f"over the {TIME_CAP_S} s cap: a reader hangs")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(TIME_CAP_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def read_everything(run_dir: Path) -> None:
    reader = RunReader(run_dir, replay=AlertReplay())
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


@settings(FUZZ, max_examples=150)
@given(target=st.sampled_from(FILES + JSON_FILES), content=contents, append=st.booleans())
def test_no_content_of_any_run_file_crashes_a_reader(good_run, tmp_path_factory, target, content, append):
    run_dir = tmp_path_factory.mktemp("fuzz") / "run"
    shutil.copytree(good_run, run_dir)
    path = run_dir / target
    path.write_bytes((path.read_bytes() + b"\n" if append and path.exists() else b"") + content)
    read_everything(run_dir)


HOSTILE = {
    "fifo": os.mkfifo,
    "directory": os.mkdir,
    "dev_zero": lambda p: os.symlink("/dev/zero", p),
    "dev_urandom": lambda p: os.symlink("/dev/urandom", p),
    "symlink_loop": lambda p: os.symlink(p, p),
    "dangling_symlink": lambda p: os.symlink(p.parent / "nowhere", p),
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_no_file_type_where_a_run_file_should_be_crashes_or_hangs_a_reader(good_run, tmp_path, kind):
    """Reliability review 2, R21: a FIFO hung report and the dashboard, /dev/zero ate the memory, a
    directory or a symlink loop crashed them."""
    for target in FILES + JSON_FILES:
        run_dir = tmp_path / f"{kind}-{target.replace('/', '_')}"
        shutil.copytree(good_run, run_dir)
        path = run_dir / target
        path.unlink(missing_ok=True)
        HOSTILE[kind](path)
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
    reader = RunReader(run_dir, replay=AlertReplay())
    reader.poll()
    assert reader.state.garbage_total >= 3  # the deep line, the bytes, the list
    summary = load_summary(run_dir)
    assert summary.steps == 6
    build_report(run_dir)


# ----------------------------------------------------------------------------- what a user types or points at

yaml_fragments = st.sampled_from([
    "num_steps: 2\nnum_steps: 3\n", "a: " + "[" * 3000 + "]" * 3000, "rewards: &x [*x]\n", "!!python/object:os.system\n",
    "\tnum_steps: 2\n", "rules:\n  - {name: a, kind: threshold, metric: '[[[', op: '>', value: 1, action: stop}\n",
    "parameters:\n  seed: {min: 0, max: 1e12, step: 1}\n", "criteria: [{name: x, scorer: judge}]\n",
    "batch_size: .inf\n", "seed: 1e400\n", "run_name: \"\\ud83d\"\n", "method: random\ntrials: 1e30\n", "---\n---\n",
    "a: !!binary AAAA\n", "? [1, 2]\n: 3\n", "<<: {a: 1}\n", "num_steps: 0x10\n", "lora_layers: 0\n",
])
yaml_texts = st.one_of(st.text(max_size=200), yaml_fragments,
                       st.lists(st.one_of(yaml_fragments, st.text(max_size=40)), max_size=4).map("".join))


@settings(FUZZ, max_examples=120)
@given(text=yaml_texts, raw=st.one_of(st.none(), st.binary(max_size=80)))
def test_no_yaml_file_a_user_names_crashes_its_reader(tmp_path_factory, text, raw):
    """Config, sweep, rubric and alert files: a value or one UserError, never a traceback or a hang."""
    from mlx_grpo.config.train_config import load_config
    from mlx_grpo.measuring.sweep import load_sweep, plan_trials
    from mlx_grpo.rewards.rubric import load_rubric
    from mlx_grpo.telemetry.alerts.config import load_alert_rules

    path = tmp_path_factory.mktemp("yaml") / "in.yaml"
    path.write_bytes(raw if raw is not None else text.encode("utf-8", "surrogatepass"))
    for read in (load_config, load_alert_rules, load_rubric, lambda p: plan_trials(load_sweep(p))):
        try:
            read(path)
        except UserError:
            pass


@functools.lru_cache(maxsize=1)
def train_parser():
    from mlx_grpo.cli import build_parser

    parser = build_parser()
    train = next(a for a in parser._subparsers._group_actions[0].choices.items() if a[0] == "train")[1]
    flags = sorted(s for action in train._actions for s in action.option_strings
                   if s.startswith("--") and s not in ("--help", "--debug", "--resume"))
    return parser, flags


@settings(FUZZ, max_examples=60)  # 150 took 15 s of the default suite
@given(data=st.data())
def test_no_flag_value_crashes_the_config_it_builds(data, capsys):
    """Every `mlx-grpo train` flag with random text: a config or one UserError (argparse's usage exit aside)."""
    from mlx_grpo.commands.train import collect_overrides
    from mlx_grpo.config.train_config import load_config

    parser, flags = train_parser()
    argv = ["train"]
    for flag in data.draw(st.lists(st.sampled_from(flags), min_size=1, max_size=3)):
        argv += [flag, data.draw(st.one_of(st.text(max_size=30), st.sampled_from(
            ["0", "-1", "1e400", "nan", "[1", "{a: 1, a: 2}", "[" * 3000, "\x1b[2J", "true", "10**30", ""])))]
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse: a usage line and exit code 2
        assert exit_.code == 2
        return
    try:
        load_config(None, collect_overrides(args))
    except UserError:
        pass


@settings(FUZZ, max_examples=40)
@given(command=st.sampled_from(["report", "compare", "export", "eval", "watch", "plan", "sweep"]),
       target=st.sampled_from(["missing", "file", "empty_dir", "fifo", "dev_zero", "loop", "binary"]))
def test_no_path_a_user_points_a_command_at_crashes_it(tmp_path_factory, command, target):
    """report, compare, export, eval, watch, plan and sweep pointed at what is not a run, a model or a file
    of theirs: one line and exit code 2 (watch is given a file: it waits for a directory that does not
    exist yet, so only its refusals are checked)."""
    from mlx_grpo.cli import main

    root = tmp_path_factory.mktemp("paths")
    path = root / "thing"
    {"missing": lambda p: None, "file": lambda p: p.write_text("x"), "empty_dir": os.mkdir, "fifo": os.mkfifo,
     "dev_zero": lambda p: os.symlink("/dev/zero", p), "loop": lambda p: os.symlink(p, p),
     "binary": lambda p: p.write_bytes(bytes(range(256)))}[target](path)
    if command == "watch" and target in ("missing", "empty_dir"):
        return  # the dashboard waits for a run to appear there: not a refusal
    argv = {"export": ["export", str(path), "--out", str(root / "out")], "compare": ["compare", str(path)],
            "plan": ["plan", str(path)], "sweep": ["sweep", "--dry-run", str(path)]}.get(command, [command, str(path)])
    if command == "report":
        argv = ["report", "--no-write", str(path)]
    assert main(argv) == 2


def test_history_lines_parse_the_same_with_orjson_and_without(monkeypatch):
    import json as _json

    from mlx_grpo.telemetry.rundir import history_loader

    lines = [b'{"step": 1, "x": NaN, "y": -Infinity}', b'{"step": 2, "big": 12345678901234567890}',
             '{"step": 3, "name": "r\u00e9ward \u2603"}'.encode(), b'{"step": 4, "x": 1e400}']
    expected = [_json.loads(line) for line in lines]
    with_orjson = [history_loader._loads(line) for line in lines]
    monkeypatch.setattr(history_loader, "orjson", None)
    without = [history_loader._loads(line) for line in lines]
    assert repr(with_orjson) == repr(expected) == repr(without)
