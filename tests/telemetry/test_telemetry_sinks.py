"""Run directory, TensorBoard sink and the failure-isolating SinkSet, read back by real readers."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
from run_writer import start_sinks as start
from tbparse import SummaryReader
from tensorboard.backend.event_processing import event_accumulator

from mlx_grpo.common.secrets import scrub_secrets
from mlx_grpo.telemetry.events import AlertEvent, Final, Flush, Samples, Scalars, Sink
from mlx_grpo.telemetry.rundir.completions import completion_rows
from mlx_grpo.telemetry.rundir.jsonl_tail import JsonlTail
from mlx_grpo.telemetry.rundir.writer import RunDirWriter, read_run_info
from mlx_grpo.telemetry.sinks import SinkSet, ThreadedSink
from mlx_grpo.telemetry.sinks.base import samples_markdown
from mlx_grpo.telemetry.sinks.tensorboard import TensorBoardSink

SAMPLE = {"prompt": "What is 2+3?", "completion": "<reasoning>2+3=5</reasoning><answer>5</answer>", "answer": "5",
          "rewards": {"format_exact": 1.0, "answer_check": None}, "total": 1.0, "advantage": 0.5, "length": 12,
          "truncated": False, "correct": True}


def read_jsonl(path):
    tail = JsonlTail(path)
    records = tail.poll(final=True).records
    assert tail.garbage_lines == 0
    return records


def test_secrets_never_reach_run_json(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_SERVICE_TOKEN", "plain-looking-value-123")
    config = {
        "learning_rate": 1e-4, "max_tokens": 64, "eos_token": "</s>", "api_key_env": "OPENAI_API_KEY",
        "judge": {"url": "http://127.0.0.1:8000/v1", "api_key": "abc123", "headers": ["Bearer sk-live-secret-value"]},
        "hf_token": "hf_abcdefghijklmnopqrstuvwx", "wandb": {"password": "hunter22"},
        "note": "sk-ABCDEFGHIJKLMNOPQRSTUV", "extra": ["keep me", "plain-looking-value-123"],
    }
    writer = RunDirWriter(tmp_path / "run")
    start(writer, tmp_path / "run", "r", config, versions={"python": "3.11"}, device={"backend": "cpu"}, total_steps=3)
    text = (tmp_path / "run" / "run.json").read_text()
    for secret in ("abc123", "sk-live", "hf_abcdef", "hunter22", "sk-ABCDEF", "plain-looking-value-123"):
        assert secret not in text
    saved = json.loads(text)["config"]
    assert saved["max_tokens"] == 64 and saved["eos_token"] == "</s>" and saved["api_key_env"] == "OPENAI_API_KEY"
    assert saved["judge"] == {"url": "http://127.0.0.1:8000/v1", "headers": []}
    assert saved["extra"] == ["keep me"]
    assert scrub_secrets({"access_token": "x", "client_secret": "y", "num_tokens": 3}) == {"num_tokens": 3}


def test_run_directory_files_follow_the_contract(tmp_path):
    run = tmp_path / "run"
    writer = RunDirWriter(run)
    info = start(writer, run, "demo", {"lr": 0.1}, total_steps=2)
    assert read_run_info(run).status == "running"
    assert info.schema_version == 1 and info.end_time is None and isinstance(info.pid, int)
    writer.handle(Scalars(1, {"policy/loss": float("nan"), "policy/kl": float("inf"),
                              "rewards/total/mean": np.float32(0.5), "tokens/total": np.int64(7)}, time=10.0))
    writer.handle(Scalars(2, {"policy/loss": 0.25}))
    writer.handle(Samples(2, [SAMPLE, {**SAMPLE, "total": float("nan")}]))
    writer.handle(AlertEvent({"step": 2, "level": "warning", "rule": "r", "metric": "policy/kl",
                              "value": float("inf"), "message": "KL is infinite"}))
    writer.handle(Final({"final/total/mean": 0.5, "final/total/std": float("nan")}))
    writer.close("interrupted")

    for name in ("metrics.jsonl", "samples.jsonl", "alerts.jsonl"):
        raw = (run / name).read_text()
        assert raw.endswith("\n") and all(json.loads(line) for line in raw.splitlines())
    metrics = read_jsonl(run / "metrics.jsonl")
    assert metrics[0] == {"step": 1, "time": 10.0, "policy/loss": None, "policy/kl": None,
                          "rewards/total/mean": 0.5, "tokens/total": 7}
    assert metrics[1]["step"] == 2 and metrics[1]["policy/loss"] == 0.25 and metrics[1]["time"] > 1e9
    samples = read_jsonl(run / "samples.jsonl")
    assert [s["total"] for s in samples] == [1.0, None] and samples[0]["rewards"]["answer_check"] is None
    assert read_jsonl(run / "alerts.jsonl")[0]["value"] is None
    assert json.loads((run / "final_metrics.json").read_text()) == {"final/total/mean": 0.5, "final/total/std": None}
    final_info = json.loads((run / "run.json").read_text())
    assert final_info["status"] == "interrupted" and final_info["end_time"] >= final_info["start_time"]
    assert not [p for p in run.iterdir() if p.name.endswith(".tmp")]


def step_scalars(step):
    return {"rewards/total/mean": 0.1 * step, "policy/loss": 1.0 / step, "system/cpu_percent": 50.0,
            "rewards/answer_check/mean": 0.05 * step}


def test_tensorboard_files_hold_scalars_histograms_text_and_hparams_in_the_run_dir(tmp_path):
    run = tmp_path / "run"
    sinks = SinkSet(RunDirWriter(run), [TensorBoardSink(run / "tensorboard")])
    start(sinks, run, "tb", {"learning_rate": 1e-4, "model": {"id": "tiny"}, "rewards": ["a", "b"]})
    for step in (1, 2, 3):
        sinks.handle(Scalars(step, step_scalars(step), {"rewards/total/hist": np.arange(12.0) * step}))
    sinks.handle(Samples(3, [SAMPLE]))
    sinks.handle(AlertEvent({"step": 3, "level": "warning", "rule": "kl_high", "metric": "policy/kl", "value": 1.0,
                             "message": "KL above 0.5"}))
    sinks.handle(Final({"final/total/mean": 0.2}))
    sinks.close()

    tb = run / "tensorboard"
    assert [p for p in tb.iterdir() if p.is_dir()] == []  # hparams did not make a timestamped sub-run
    reader = SummaryReader(str(tb), extra_columns={"dir_name"})
    scalars = reader.scalars
    for step in (1, 2, 3):
        for name, value in step_scalars(step).items():
            got = scalars[(scalars.tag == name) & (scalars.step == step)].value
            assert list(got) == [pytest.approx(value)], name
    assert set(reader.histograms.tag) == {"rewards/total/hist"} and len(reader.histograms) == 3
    text = reader.text
    assert {"samples/completions", "alerts", "final", "run"} <= set(text.tag)
    assert "What is 2+3?" in text[text.tag == "samples/completions"].value.iloc[0]
    assert "KL above 0.5" in text[text.tag == "alerts"].value.iloc[0]
    hparams = dict(zip(reader.hparams.tag, reader.hparams.value))
    assert hparams["learning_rate"] == pytest.approx(1e-4) and hparams["model.id"] == "tiny"
    assert set(reader.hparams.dir_name) == {""}

    acc = event_accumulator.EventAccumulator(str(tb))
    acc.Reload()
    assert "custom_scalars__config__" in acc.Tags()["tensors"]
    assert {"_hparams_/experiment", "_hparams_/session_start_info", "_hparams_/session_end_info"} <= \
        set(acc.PluginTagToContent("hparams"))


def test_tensorboard_flushes_within_seconds_while_the_run_is_live(tmp_path):
    sink = TensorBoardSink(tmp_path / "tb", flush_secs=1)
    sink.handle(Scalars(1, {"rewards/total/mean": 1.0}))
    deadline = time.time() + 6
    seen = False
    while time.time() < deadline and not seen:
        time.sleep(0.5)
        seen = "rewards/total/mean" in set(SummaryReader(str(tmp_path / "tb")).scalars.get("tag", []))
    sink.close("finished")
    assert seen


def test_tensorboard_flush_puts_every_written_step_on_disk_before_it_returns(tmp_path):
    # The checkpoint records that a step's events are on disk: a kill right after must not lose them.
    sink = TensorBoardSink(tmp_path / "tb", flush_secs=3600)
    for step in range(1, 41):
        sink.handle(Scalars(step, {"rewards/total/mean": float(step)}, {"completions/length/hist": np.arange(50.0)}))
    sink.handle(Flush())
    acc = event_accumulator.EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("rewards/total/mean")] == list(range(1, 41))
    sink.close("finished")


def test_sessions_opened_in_the_same_second_keep_each_others_events(tmp_path):
    # A resume can start within the second its killed predecessor started: tensorboardX would give both
    # sessions one file name and the second would erase the first's steps (seen in CI: steps 1-3 lost).
    first = TensorBoardSink(tmp_path / "tb", flush_secs=3600)
    for step in (1, 2, 3):
        first.handle(Scalars(step, {"rewards/total/mean": float(step)}))
    first.handle(Flush())  # a checkpoint at step 3, then the process is killed (no close)
    second = TensorBoardSink(tmp_path / "tb", flush_secs=3600, purge_step=4)
    for step in (4, 5):
        second.handle(Scalars(step, {"rewards/total/mean": float(step)}))
    second.close("finished")
    acc = event_accumulator.EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0},
                                             purge_orphaned_data=True)
    acc.Reload()
    assert [e.step for e in acc.Scalars("rewards/total/mean")] == [1, 2, 3, 4, 5]
    first.close("finished")


class Exploding(Sink):
    name = "exploding"

    def __init__(self, fail_in: str):
        self.fail_in = fail_in
        self.calls = []

    def handle(self, event):
        self._maybe(type(event).__name__)

    def close(self, status):
        self.calls.append("close")

    def _maybe(self, method):
        self.calls.append(method)
        if method == self.fail_in:
            raise ConnectionError("service unreachable")


@pytest.mark.parametrize("fail_in", ["Start", "Scalars"])
def test_a_failing_sink_is_turned_off_with_one_warning_and_the_rest_carry_on(tmp_path, fail_in):
    run = tmp_path / "run"
    warnings = []
    bad = Exploding(fail_in)
    sinks = SinkSet(RunDirWriter(run), [bad, TensorBoardSink(run / "tensorboard")], warn=warnings.append)
    start(sinks, run, "iso")
    for step in range(1, 6):
        sinks.handle(Scalars(step, step_scalars(step)))
    sinks.close()

    assert len(warnings) == 1 and "exploding" in warnings[0] and "ConnectionError" in warnings[0]
    assert sinks.active == ["tensorboard"]
    assert bad.calls.count(fail_in) == 1 and bad.calls[-1] == "close"
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3, 4, 5]
    alerts = read_jsonl(run / "alerts.jsonl")
    assert [(a["rule"], a["level"]) for a in alerts] == [("sink_failed", "warning")]
    scalars = SummaryReader(str(run / "tensorboard")).scalars
    assert sorted(scalars[scalars.tag == "policy/loss"].step) == [1, 2, 3, 4, 5]
    assert read_run_info(run).status == "finished"


@pytest.mark.parametrize("error, status", [(RuntimeError("boom"), "failed"), (KeyboardInterrupt(), "interrupted")])
def test_sinkset_context_manager_records_how_the_run_ended(tmp_path, error, status):
    with pytest.raises(type(error)):
        with SinkSet(RunDirWriter(tmp_path / "run")) as sinks:
            start(sinks, tmp_path / "run", "ctx")
            sinks.handle(Scalars(1, {"policy/loss": 1.0}))
            raise error
    assert read_run_info(tmp_path / "run").status == status


def test_samples_split_completions_with_the_scoring_extractor_and_escape_markdown():
    from mlx_grpo.tasks.answer_format import extract_answer, extract_reasoning

    # One extractor for scoring and display: the last complete block wins, as when scoring.
    assert (extract_reasoning("<reasoning> think </reasoning><answer> 42 </answer>"),
            extract_answer("<answer>1<answer>2</answer>")) == ("think", "2")
    assert extract_reasoning("no tags at all") == "no tags at all"
    table = samples_markdown([{**SAMPLE, "prompt": "a|b\nc"}])
    header, rule, row = table.splitlines()
    assert header.count("|") == rule.count("|") == 11  # 10 columns: 3 texts, 2 rewards, 5 numbers
    assert "a\\|b<br>c" in row and "null" not in row and "| 1 |" in row
    assert "null" in samples_markdown([{**SAMPLE, "total": float("nan")}])


class Recording(Sink):
    name = "recording"

    def __init__(self, gate=None, fail_at_step=None):
        self.gate = gate
        self.fail_at_step = fail_at_step
        self.steps = []
        self.closed = None

    def handle(self, event):
        if not isinstance(event, Scalars):
            return
        if self.gate is not None:
            self.gate.wait(5)
        if event.step == self.fail_at_step:
            raise OSError("disk of the remote service is full")
        self.steps.append((event.step, event.values["policy/loss"]))

    def close(self, status):
        self.closed = status


def test_threaded_sink_keeps_order_and_copies_what_it_was_given(tmp_path):
    inner = Recording()
    sinks = SinkSet(RunDirWriter(tmp_path / "run"), [ThreadedSink(inner)])
    start(sinks, tmp_path / "run", "t")
    record = {"policy/loss": 0.0}
    for step in range(1, 101):
        record["policy/loss"] = float(step)  # the trainer reuses its dict; the worker must see each value
        sinks.handle(Scalars(step, record))
    sinks.close()
    assert inner.steps == [(s, float(s)) for s in range(1, 101)] and inner.closed == "finished"


def test_threaded_sink_errors_surface_as_one_warning_and_the_run_dir_carries_on(tmp_path):
    warnings = []
    inner = Recording(fail_at_step=2)
    sinks = SinkSet(RunDirWriter(tmp_path / "run"), [ThreadedSink(inner)], warn=warnings.append)
    start(sinks, tmp_path / "run", "t")
    sinks.handle(Scalars(1, {"policy/loss": 1.0}))
    sinks.handle(Scalars(2, {"policy/loss": 2.0}))
    deadline = time.time() + 5
    while sinks.active and time.time() < deadline:
        sinks.handle(Scalars(3, {"policy/loss": 3.0}))
        time.sleep(0.01)
    sinks.close()
    assert sinks.active == [] and len(warnings) == 1 and "OSError" in warnings[0]
    assert inner.steps == [(1, 1.0)]
    assert {r["step"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl")} == {1, 2, 3}


def test_threaded_sink_drops_records_instead_of_blocking_when_far_behind(tmp_path):
    warnings = []
    gate = threading.Event()
    inner = Recording(gate=gate)
    sinks = SinkSet(RunDirWriter(tmp_path / "run"), [ThreadedSink(inner, max_pending=3)], warn=warnings.append)
    start(sinks, tmp_path / "run", "t")
    began = time.perf_counter()
    for step in range(1, 21):
        sinks.handle(Scalars(step, {"policy/loss": 1.0}))
    assert time.perf_counter() - began < 1.0  # the blocked sink did not hold the loop up
    gate.set()
    sinks.close()
    assert 1 <= len(inner.steps) < 20
    assert len(warnings) == 1 and "dropped" in warnings[0]



def test_a_lossless_threaded_sink_waits_instead_of_dropping_and_a_flush_waits_for_every_write(tmp_path):
    # the completions writer's wrapper: run data is never dropped, and a checkpoint's Flush returns only once
    # every queued step is written (a kill right after a checkpoint loses no completions file)
    gate = threading.Event()
    inner = Recording(gate=gate)
    sinks = SinkSet(RunDirWriter(tmp_path / "run"), [ThreadedSink(inner, max_pending=3, lossless=True)])
    start(sinks, tmp_path / "run", "t")
    threading.Timer(0.3, gate.set).start()
    for step in range(1, 21):
        sinks.handle(Scalars(step, {"policy/loss": float(step)}))
    sinks.handle(Flush())
    assert inner.steps == [(s, float(s)) for s in range(1, 21)]  # all written before Flush returned
    sinks.close()
    assert inner.steps == [(s, float(s)) for s in range(1, 21)]

def test_tensorboard_hparams_list_the_keys_that_differ_between_runs_first(tmp_path):
    from mlx_grpo.telemetry.sinks.tensorboard import differing_first

    for name, lr in (("a", 1e-4), ("b", 3e-4)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "run.json").write_text(json.dumps({"config": {"beta": 0.04, "learning_rate": lr,
                                                                         "seed": 0}}))
    (tmp_path / "c").mkdir()
    values = {"beta": 0.04, "seed": 0, "learning_rate": 3e-4}
    assert list(differing_first(values, tmp_path / "c")) == ["learning_rate", "beta", "seed"]
    assert differing_first(values, None) == values  # no siblings to compare with: as given


def test_a_huge_prompt_is_stored_clipped_in_samples(tmp_path):
    rows = completion_rows(step=1, prompts=["x" * 10_000_000], answers=["5"], texts=[SAMPLE["completion"]],
                           reasoning=["2+3=5"], predicted=["5"], group_size=1, reward_names=["f"],
                           scores=np.ones((1, 1)), total=np.ones(1), advantages=np.zeros(1), lengths=np.ones(1),
                           truncated=np.zeros(1, bool), correct=None)
    writer = RunDirWriter(tmp_path / "run")
    start(writer, tmp_path / "run", total_steps=1)
    writer.handle(Samples(1, rows))
    writer.close("finished")
    (record,) = read_jsonl(tmp_path / "run" / "samples.jsonl")
    assert len(record["prompt"]) < 20_100 and record["prompt"].endswith("9980000 more characters]")
    assert record["completion"] == SAMPLE["completion"]
