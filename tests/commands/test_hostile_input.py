"""Reliability review 2 (R1-R21), one test per class of fault: what a user can type, point at or have on a
full disk never ends in a traceback, a hang, lost records or a silent wrong result. In-process and fast."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from run_writer import RunWriter, start_sinks
from screen_text import screen_text

from mlx_grpo.cli import main
from mlx_grpo.telemetry.analysis.alert_replay import AlertReplay
from mlx_grpo.telemetry.rundir.writer import RunDirWriter, read_run_info

# train_size: not the default 20,000 rows, whose drawing and tokenizing took ~1 s of each short run
FAST = {"num_steps": 4, "batch_size": 2, "num_generations": 2, "max_generation_steps": 4, "eval_every": 0,
        "checkpoint_every": 2, "tensorboard": False, "wandb": False, "train_size": 64}
ESC = "\x1b]0;PWNED\x07 \x1b[2J"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from tiny_models import make_model_dir

    return make_model_dir(tmp_path_factory.mktemp("model") / "llama", "llama")


def flags(tmp_path, model, *extra, **overrides):
    values = {**FAST, "model_id": str(model), "monitoring_dir": str(tmp_path / "runs"), "run_name": "r",
              **overrides}
    return ["train", *(f"--set={k}={json.dumps(v)}" for k, v in values.items()), *extra]


def one_line_error(capsys, rc: int, *words: str) -> str:
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err
    line = [x for x in err.splitlines() if "error:" in x]
    assert len(line) == 1 and all(w in line[0] for w in words), err
    return line[0]


# ----------------------------------------------------------------------------- YAML files (R4, R6, R14)

def yaml_surfaces(tmp_path: Path, text: str) -> list[list[str]]:
    """Every command-line entry point that reads a YAML file the user names, with `text` as that file."""
    path = tmp_path / "in.yaml"
    path.write_text(text)
    return [["train", str(path)], ["plan", str(path)], ["sweep", "--dry-run", str(path)],
            ["train", "--alerts", str(path)], ["train", "--set", f"rubric_file={path}"],
            ["eval", str(tmp_path), "--config", str(path)]]


def nested(levels: int) -> str:
    return "[" * levels + "]" * levels


# 100 levels are past the limit (64) for every reader; past Python's recursion limit (R4: a RecursionError)
# the one parser every reader shares is tried from a file and from --set below (~0.8 s a reader at that depth)
@pytest.mark.parametrize("text, words", [
    ("a: " + nested(100) + "\n", ("nested more than 64 levels",)),
    ("num_steps: 2\nnum_steps: 3\n", (":2:", "'num_steps' is given twice", "lines 1 and 2")),  # R14: last won
], ids=["deep", "duplicate_key"])
def test_every_yaml_reader_refuses_deep_nesting_and_duplicate_keys_in_one_line(tmp_path, capsys, text, words):
    for argv in yaml_surfaces(tmp_path, text):
        one_line_error(capsys, main(argv), *words)
    one_line_error(capsys, main(["train", "--set", f"seed={nested(100)}"]), "--set seed", "nested")


def test_yaml_nested_past_the_recursion_limit_is_one_line_too(tmp_path, capsys):
    deep = "a: " + nested(5000) + "\n"  # R4: was a RecursionError
    one_line_error(capsys, main(yaml_surfaces(tmp_path, deep)[0]), "nested more than 64 levels")
    one_line_error(capsys, main(["train", "--set", f"seed={nested(5000)}"]), "--set seed", "nested")


def test_binary_fifo_and_directory_yaml_files_are_one_line(tmp_path, capsys):
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"rules:\n  - \x82\xff\n")
    one_line_error(capsys, main(["train", "--alerts", str(binary)]), "not UTF-8", ":2:")  # R6: was a traceback
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    for argv, words in ((["train", str(fifo)], "not a regular file"), (["train", "--alerts", str(fifo)],
                        "not a regular file"), (["plan", str(tmp_path)], "is a directory")):
        one_line_error(capsys, main(argv), words)


# ----------------------------------------------------------------------------- config values (R7, R16, R19, R20)

def test_impossible_config_values_and_model_configs_are_one_line(tmp_path, model, capsys):
    one_line_error(capsys, main(flags(tmp_path, model, use_lora=True, lora_layers=0)), "lora_layers")  # R19
    one_line_error(capsys, main(flags(tmp_path, model, num_steps=10**30)), "num_steps")  # R20: std::bad_cast
    import shutil

    for name, config in (("list", [1, 2]), ("negdim", None)):  # R7: a list crashed the plan; R16: -1 'fit'
        bad = tmp_path / name
        shutil.copytree(model, bad)
        shape = json.loads((Path(model) / "config.json").read_text())
        (bad / "config.json").write_text(json.dumps(config if config is not None
                                                    else {**shape, "num_hidden_layers": -1}))
        one_line_error(capsys, main(["plan", "--set", f"model_id={bad}"]), "config.json")
        one_line_error(capsys, main(flags(tmp_path, model, model_id=str(bad))), str(bad))


def test_a_long_run_name_in_bytes_blames_run_name(tmp_path, model, capsys):
    argv = flags(tmp_path, model)
    one_line_error(capsys, main([*argv, "--set", "run_name=" + "\U0001F600" * 100]), "run_name", "too long")
    one_line_error(capsys, main([*argv, "--set", 'run_name="\\ud83d"']), "run_name", "not valid text")


# ----------------------------------------------------------------------------- datasets (R6, R12)

def test_a_lone_surrogate_in_a_dataset_is_one_line_with_its_line(tmp_path, model, capsys):
    data = tmp_path / "ds.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "12\\u0000+\\ud800=", "answer": "3"}\n')
    one_line_error(capsys, main(flags(tmp_path, model, dataset=str(data))), f"{data}:2", "lone surrogate")
    one_line_error(capsys, main(["eval", str(model), "--dataset", str(data)]), f"{data}:2")


def test_a_huge_chat_message_is_cut_before_it_is_rendered():
    from types import SimpleNamespace

    from mlx_grpo import data
    from mlx_grpo.data.rows import _transcript

    seen = []

    class Tokenizer:
        chat_template = None

        def encode(self, text):
            seen.append(len(text))
            return list(range(min(len(text), 50)))

    config = SimpleNamespace(max_prompt_length=16, system_prompt=None, use_chat_template=True)
    messages = [{"role": "user", "content": "x" * 10_000_000}, {"role": "user", "content": "1+1="}]
    encoded = data.encode_prompt(Tokenizer(), _transcript(messages), config, messages)
    assert encoded.truncated and seen[0] <= 16 * data.MAX_CHARS_PER_TOKEN + 1  # was the whole 10 MB (R12)


# ----------------------------------------------------------------------------- terminal escapes (R2)

def write_escaped_run(run_dir: Path) -> None:
    writer = RunWriter(run_dir, total_steps=12)
    writer.start()
    for _ in range(10):
        writer.log_step()
    writer.append("metrics.jsonl", {"step": 11, "time": writer.time_of(11), f"custom/{ESC}": 1.0,
                                    "rewards/total/mean": 1.0})
    writer.alert("policy/kl", message=f"kl {ESC} high")
    with open(run_dir / "samples.jsonl", "a") as f:
        f.write(json.dumps({"step": 10, "time": 1.0, "prompt": f"1+1={ESC}", "completion": f"2{ESC}",
                            "total": 1.0, "rewards": {}, "advantage": 0.0}) + "\n")
    info = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**info, "name": f"name{ESC}"}))


def test_report_compare_and_the_readers_never_pass_an_escape_sequence_on(tmp_path, capsys):
    from mlx_grpo.telemetry.rundir.reader import RunReader

    run_dir = tmp_path / "run"
    write_escaped_run(run_dir)
    for argv in (["report", "--no-write", str(run_dir)], ["compare", str(run_dir), str(run_dir)]):
        assert main(argv) == 0
        out = capsys.readouterr()
        assert "\x1b" not in out.out + out.err and "\\x1b" in out.out
    reader = RunReader(run_dir, replay=AlertReplay())
    reader.poll()
    shown = json.dumps([reader.state.info.name, list(reader.state.samples), reader.state.table.names,
                        [e.alert.message for e in reader.state.alerts]])
    assert "\\u001b" not in shown and "\\\\x1b" in shown


@pytest.mark.anyio
async def test_the_dashboard_shows_escape_sequences_as_text(tmp_path):
    from mlx_grpo.tui.app import WatchApp

    run_dir = tmp_path / "run"
    write_escaped_run(run_dir)
    app = WatchApp([run_dir], refresh=0.1, clock=lambda: 1e12)
    async with app.run_test(size=(140, 45)) as pilot:
        for key in "1267":
            await pilot.press(key)
            await pilot.pause(0.3)
            text = screen_text(app)
            assert "\x1b]" not in text and "\x1b[2J" not in text
        assert app.is_running


def test_the_trainer_console_shows_escape_sequences_as_text(capsys):
    from mlx_grpo.run.console import TrainingConsole
    from mlx_grpo.telemetry.alerts.alert import Alert
    from mlx_grpo.telemetry.alerts.console import format_alert

    console = TrainingConsole(10, enabled=False)
    console.message(f"warning: reward failed: ValueError: {ESC}")
    console.message(format_alert(Alert(step=1, time=0.0, level="warning", rule=f"r{ESC}", metric="m", value=1.0,
                                       message=f"m {ESC}")))
    out = capsys.readouterr().out
    assert "\x1b" not in out and out.count("\\x1b") == 6


# ----------------------------------------------------------------------------- hostile file types (R21)

def hostile_runs(tmp_path: Path, good: Path) -> dict[str, Path]:
    """A copy of a good run per hostile file type where a run file should be."""
    import shutil

    cases = {}
    for name, target, make in (
            ("fifo_runjson", "run.json", os.mkfifo),
            ("fifo_metrics", "metrics.jsonl", os.mkfifo),
            ("dir_metrics", "metrics.jsonl", os.mkdir),
            ("zero_runjson", "run.json", lambda p: os.symlink("/dev/zero", p)),
            ("zero_metrics", "metrics.jsonl", lambda p: os.symlink("/dev/zero", p)),
            ("loop_samples", "samples.jsonl", lambda p: os.symlink(p, p)),
            ("urandom_alerts", "alerts.jsonl", lambda p: os.symlink("/dev/urandom", p)),
            ("dir_final", "final_metrics.json", os.mkdir)):
        run_dir = tmp_path / name
        shutil.copytree(good, run_dir)
        (run_dir / target).unlink(missing_ok=True)
        make(run_dir / target)
        cases[name] = run_dir
    return cases


@pytest.fixture
def good_run(tmp_path):
    writer = RunWriter(tmp_path / "good", total_steps=6)
    writer.start()
    for _ in range(6):
        writer.log_step()
    writer.alert("policy/kl")
    writer.finish()
    return writer.run_dir


# Runs each command through the CLI's main(), one process for all of them (a process per command cost ~0.5 s
# each) but not the test's own, so that a hang is a timeout rather than a stuck suite. It notes each command's
# start and exit code in a file (their own output goes to stdout and stderr).
EACH_COMMAND = """
import json, sys
from mlx_grpo.cli import main
with open(sys.argv[2], "a") as notes:
    for name, argv in json.loads(sys.argv[1]):
        print(name, "started", file=notes, flush=True)
        print(name, main(argv), file=notes, flush=True)
"""


def test_report_and_compare_refuse_hostile_file_types_without_hanging(tmp_path, good_run):
    cases = [(f"{name}-{argv[0]}", argv) for name, run_dir in hostile_runs(tmp_path / "h", good_run).items()
             for argv in (["report", "--no-write", str(run_dir)], ["compare", str(run_dir), str(good_run)])]
    notes = tmp_path / "exit_codes.txt"
    try:
        done = subprocess.run([sys.executable, "-c", EACH_COMMAND, json.dumps(cases), str(notes)],
                              capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"hung: {notes.read_text().splitlines()[-1]}") from None
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    codes = dict(line.split() for line in notes.read_text().splitlines() if not line.endswith(" started"))
    assert list(codes) == [name for name, _ in cases] and set(codes.values()) <= {"0", "2"}, codes


def test_a_line_longer_than_the_limit_is_skipped_not_held_in_memory(tmp_path, monkeypatch):
    from mlx_grpo.telemetry.rundir import jsonl_tail

    monkeypatch.setattr(jsonl_tail, "MAX_LINE_BYTES", 1 << 16)
    monkeypatch.setattr(jsonl_tail, "READ_BLOCK", 1 << 14)
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1}\n' + b"\0" * (1 << 20) + b'\n{"step": 2}\n')
    tail = jsonl_tail.JsonlTail(path)
    assert [r["step"] for r in tail.poll(final=True).records] == [1, 2] and tail.garbage_lines == 1


@pytest.mark.anyio
async def test_the_dashboard_survives_hostile_file_types_and_the_run_browser_too(tmp_path, good_run):
    from mlx_grpo.tui.app import WatchApp

    cases = hostile_runs(tmp_path / "h", good_run)
    for name, run_dir in cases.items():
        app = WatchApp([run_dir], refresh=0.1, clock=lambda: 1e12)
        # each run's views; the run browser lists every hostile sibling, so it is opened from the last one only
        keys = ("1", "6", "7", "r") if name == list(cases)[-1] else ("1", "6", "7")
        async with app.run_test(size=(140, 45)) as pilot:
            for key in keys:
                await pilot.press(key)
                await pilot.pause(0.2)
            assert app.is_running, name


# ----------------------------------------------------------------------------- disk full under the logs (R1)

def fail_writes(monkeypatch, filename: str, from_call: int, times: int) -> None:
    """RunDirWriter's appends to `filename` fail with ENOSPC from the `from_call`-th on, `times` times,
    after writing half their bytes (a torn line), as a full disk does."""
    original = RunDirWriter._append_bytes
    calls = {"n": 0, "failed": 0}

    def append(self, path, data):
        if path.name == filename:
            calls["n"] += 1
            if calls["n"] >= from_call and calls["failed"] < times:
                calls["failed"] += 1
                original(self, path, data[: len(data) // 2])
                f = self._files[path.name]
                f.truncate(f.seek(0, os.SEEK_END) - len(data) // 2)  # what _append_bytes' own cut does
                raise OSError(errno.ENOSPC, "No space left on device")
        return original(self, path, data)

    monkeypatch.setattr(RunDirWriter, "_append_bytes", append)


def test_a_disk_that_fills_under_the_logs_stops_with_a_checkpoint_and_every_step(tmp_path, model, capsys, monkeypatch):
    fail_writes(monkeypatch, "metrics.jsonl", from_call=3, times=1)
    line = one_line_error(capsys, main(flags(tmp_path, model, num_steps=8, checkpoint_every=0)),
                          "disk", "full", "stopped after step 3", "--resume")
    run_dir = tmp_path / "runs" / "r"
    assert [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    assert read_run_info(run_dir).status == "failed"
    assert (run_dir / "checkpoints" / "step_3" / "state.json").is_file(), line
    assert main(["train", "--resume", str(run_dir)]) == 0  # and the run continues from there, each step once
    assert [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()] == list(range(1, 9))


def test_a_disk_with_no_room_at_all_is_one_line_with_no_torn_record(tmp_path, model, capsys, monkeypatch):
    monkeypatch.setattr("mlx_grpo.telemetry.rundir.writer.RESERVE_BYTES", 0)
    fail_writes(monkeypatch, "metrics.jsonl", from_call=3, times=99)
    one_line_error(capsys, main(flags(tmp_path, model, num_steps=8)), "metrics.jsonl", "cannot be written",
                   "last complete checkpoint", "--resume")
    run_dir = tmp_path / "runs" / "r"
    text = (run_dir / "metrics.jsonl").read_text()
    assert text.endswith("\n") and [json.loads(x)["step"] for x in text.splitlines()] == [1, 2]
    assert read_run_info(run_dir).status == "failed"


# ----------------------------------------------------------------------------- a closed stdout (R3)

@pytest.mark.slow
def test_a_closed_stdout_does_not_end_training(tmp_path, model):
    argv = [sys.executable, "-m", "mlx_grpo.cli", *flags(tmp_path, model, num_steps=6)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.readline()
    proc.stdout.close()  # `| head -1`
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 0 and "broken pipe" in err and "Traceback" not in err
    assert read_run_info(tmp_path / "runs" / "r").status == "finished"


def test_the_console_survives_a_broken_pipe(monkeypatch, capsys):
    from mlx_grpo.run.console import TrainingConsole

    console = TrainingConsole(4, enabled=False)
    monkeypatch.setattr(os, "dup2", lambda *a: None)  # the test's own stdout stays
    monkeypatch.setattr(sys, "stdout", open(os.devnull, "w"))
    console.console.on_broken_pipe()  # what rich calls on EPIPE: it raised SystemExit(1)
    assert console.console.quiet and "broken pipe" in capsys.readouterr().err


# ----------------------------------------------------------------------------- sweeps (R8, R10, R11)

def test_a_sweep_too_large_is_refused_before_any_trial_is_built(tmp_path, capsys):
    sweep = tmp_path / "huge.yaml"
    sweep.write_text("parameters:\n  seed: {min: 0, max: 100000000, step: 1}\n")
    one_line_error(capsys, main(["sweep", "--dry-run", str(sweep)]), "100,000,001 trials", "at most 10,000")
    sweep.write_text("method: random\ntrials: 1000000000000\nparameters:\n  seed: {min: 0, max: 10, step: 1}\n")
    one_line_error(capsys, main(["sweep", "--dry-run", str(sweep)]), "trials")


def test_a_sweep_whose_output_dir_is_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "out").write_text("")
    sweep = tmp_path / "s.yaml"
    sweep.write_text(f"output_dir: {tmp_path / 'out'}\nparameters:\n  seed: [1]\nfixed: {{num_steps: 1}}\n")
    one_line_error(capsys, main(["sweep", str(sweep)]), "cannot write the sweep")


def test_sighup_stops_a_sweep_like_sigterm_and_a_trial_trained_elsewhere_is_not_a_failure(tmp_path):
    from mlx_grpo.measuring import sweep

    previous = sweep._stop_on_sigterm()
    try:
        assert signal.getsignal(signal.SIGHUP) is sweep._raise_interrupt
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    log = tmp_path / "t.log"
    log.write_text("step 29/30 reward +1.0 (an old session)\n")
    start = log.stat().st_size
    with open(log, "a") as f:
        f.write("mlx-grpo train: error: runs/t: this run is still being trained by process 7; stop it first\n"
                "step 30/30 reward +1.0 (the orphan goes on)\n")
    assert "still being trained" in sweep._error_line(log, start)


# ----------------------------------------------------------------------------- export, report, TensorBoard (R8)

def test_an_export_that_fails_leaves_nothing_behind(tmp_path, model, capsys, monkeypatch):
    from mlx_grpo.run import export

    assert main(flags(tmp_path, model, num_steps=2)) == 0
    capsys.readouterr()
    original = export._write

    def fills_the_disk(out, *args):
        original(out, *args)
        raise RuntimeError("[write] Unable to write 27048 bytes to file.")

    monkeypatch.setattr(export, "_write", fills_the_disk)
    out = tmp_path / "exported"
    one_line_error(capsys, main(["export", str(tmp_path / "runs" / "r"), "--out", str(out)]), "cannot write")
    assert not out.exists() and not [p for p in tmp_path.iterdir() if ".partial" in p.name]
    monkeypatch.setattr(export, "_write", original)
    assert main(["export", str(tmp_path / "runs" / "r"), "--out", str(out)]) == 0  # the rerun is not refused


def test_report_on_a_read_only_run_still_prints_and_an_uncreatable_tensorboard_dir_is_a_warning(
        tmp_path, model, capsys, monkeypatch):
    from mlx_grpo.telemetry.analysis import report

    assert main(flags(tmp_path, model, num_steps=2, tensorboard=True, tensorboard_dir="/proc/nonexistent/tb")) == 0
    out = capsys.readouterr()
    assert "TensorBoard logging is off" in out.out + out.err and "Traceback" not in out.err

    def read_only(*args):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(report, "atomic_write_text", read_only)
    assert main(["report", str(tmp_path / "runs" / "r")]) == 0
    out = capsys.readouterr()
    assert "could not write report.json" in out.err and "Reward report" in out.out


# ----------------------------------------------------------------------------- W&B and Trackio (R5, R9)

def test_a_token_in_the_wandb_entity_turns_wandb_off_without_repeating_it(tmp_path, monkeypatch):
    from mlx_grpo.telemetry.events import Start
    from mlx_grpo.telemetry.rundir.writer import RunInfo
    from mlx_grpo.telemetry.sinks.wandb import WandbOptions, WandbSink

    token = "ghp_" + "A" * 36
    given = {}

    class FakeWandb:
        Settings = dict

        def init(self, **kwargs):
            given.update(kwargs)

    sink = WandbSink.__new__(WandbSink)  # without importing wandb: what start() hands to wandb.init is the point
    sink.wandb, sink.options = FakeWandb(), WandbOptions(entity=token, name=f"run-{token}", mode="offline")
    with pytest.raises(ValueError) as err:
        sink.handle(Start(RunInfo(name="r"), tmp_path))
    assert token not in str(err.value) and not given
    sink.options = WandbOptions(entity="team", name=f"run-{token}", mode="offline")
    sink._chart_every = 0
    sink.handle(Start(RunInfo(name="r"), tmp_path))
    assert token not in json.dumps(given, default=str)


def test_a_trackio_store_that_cannot_be_written_is_reported(tmp_path, monkeypatch):
    pytest.importorskip("trackio")
    import warnings

    from mlx_grpo.telemetry.events import Scalars
    from mlx_grpo.telemetry.sinks import SinkSet
    from mlx_grpo.telemetry.sinks.trackio import TrackioOptions, TrackioSink

    store = tmp_path / "store"
    store.write_text("a file, not a directory")
    monkeypatch.setattr("mlx_grpo.telemetry.sinks.trackio.trackio_store", lambda: store)
    messages = []
    sinks = SinkSet(RunDirWriter(tmp_path / "run"), [TrackioSink(TrackioOptions(project="p"))], warn=messages.append)
    start_sinks(sinks, tmp_path / "run", total_steps=2)
    assert sinks.active == [] and "trackio logging failed in start" in messages[0]
    # a failure trackio's writer thread only warns about is raised by the sink's next call
    sink = TrackioSink(TrackioOptions(project="p"))
    sink._catch_flush_failures()
    try:
        warnings.warn("trackio failed to flush metric logs for run 'r': disk I/O error", UserWarning)
        with pytest.raises(OSError, match="trackio failed to flush"):
            sink.handle(Scalars(1, {}))
    finally:
        warnings.showwarning = sink._shown


# ----------------------------------------------------------------------------- run directories and alerts (R13, R17, R18)

def test_an_empty_run_directory_left_by_a_killed_start_is_taken_over(tmp_path):
    from mlx_grpo.run.run_lock import create_run_dir

    (tmp_path / "runs" / "kdir").mkdir(parents=True)  # mkdir done, killed before run.json
    path, lock = create_run_dir(tmp_path / "runs", "kdir")
    assert path.name == "kdir"  # was kdir-2, silently
    lock.release()
    (path / "run.json").write_text("{}")
    path2, lock2 = create_run_dir(tmp_path / "runs", "kdir")
    assert path2.name == "kdir-2"
    lock2.release()


def test_an_alert_rule_on_a_metric_no_run_logs_is_refused_or_warned(tmp_path, model, capsys):
    rules = tmp_path / "alerts.yaml"
    rules.write_text("rules:\n  - {name: typo, kind: threshold, metric: policy/kll, op: '>', value: 1, "
                     "action: stop}\n")
    one_line_error(capsys, main(flags(tmp_path, model, alerts_file=str(rules))), "typo", "policy/kll",
                   "did you mean 'policy/kl'")
    rules.write_text("rules:\n  - {name: typo, kind: threshold, metric: policy/kll, op: '>', value: 1}\n"
                     "  - {name: pat, kind: threshold, metric: 'nothing/*', op: '>', value: 1}\n")
    assert main(flags(tmp_path, model, alerts_file=str(rules), num_steps=1)) == 0
    out = capsys.readouterr()
    assert "'policy/kll', which no run logs" in out.err and "'nothing/*' matches no metric" in out.out


def test_a_rank_that_loses_its_peer_stops_in_one_line_with_its_checkpoint(tmp_path, model, capsys, monkeypatch):
    from mlx_grpo.distributed import World
    from mlx_grpo.trainer import Trainer

    assert World(size=2).lost_peer(RuntimeError("[ring] connection to a peer was lost"))
    assert not World(size=1).lost_peer(RuntimeError("[ring] connection to a peer was lost"))
    monkeypatch.setattr(World, "lost_peer", lambda self, err: "[ring]" in str(err))
    original = Trainer.step

    def step(self, n):
        if n == 3:
            raise RuntimeError("[ring] connection to a peer was lost")
        return original(self, n)

    monkeypatch.setattr(Trainer, "step", step)
    rc = main(flags(tmp_path, model, num_steps=6))
    err = capsys.readouterr().err
    assert rc == 4 and "Traceback" not in err and "lost another process" in err and "step_2" in err
    run_dir = tmp_path / "runs" / "r"
    assert read_run_info(run_dir).status == "failed"
    assert [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2]
