"""Notifications: alerts and the run's end reach a local HTTP server; a dead endpoint costs one warning."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from mlx_grpo.common.errors import UserError
from mlx_grpo.config.train_config import load_config
from mlx_grpo.run.loop import train
from mlx_grpo.telemetry.events import AlertEvent, Scalars, Start
from mlx_grpo.telemetry.rundir.writer import RunInfo
from mlx_grpo.telemetry.sinks import SinkSet
from mlx_grpo.telemetry.sinks.notify import Channel, Message, NotifySink, channels_from_env, payload


class Receiver:
    """A local HTTP server keeping every POST (body, headers) with what metrics.jsonl held when it came."""

    def __init__(self, run_dir: Path | None = None):
        self.posts: list[dict] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                metrics = run_dir / "metrics.jsonl" if run_dir is not None else None
                steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()] \
                    if metrics is not None and metrics.exists() else []
                receiver.posts.append({"body": body, "headers": dict(self.headers), "logged": steps})
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def json(self) -> list[dict]:
        return [json.loads(p["body"]) for p in self.posts]

    def wait(self, count: int, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.posts) < count and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def alert(step: int, rule: str = "kl_high", level: str = "warning", **extra) -> AlertEvent:
    return AlertEvent({"step": step, "time": 0.0, "level": level, "rule": rule, "metric": "policy/kl", "value": 2.0,
                       "message": "policy/kl is 2", **extra})


def test_an_alert_and_the_run_end_reach_a_webhook(receiver):
    sink = NotifySink(Channel("webhook", receiver.url))
    sinks = SinkSet(None, [sink], warn=pytest.fail)
    sinks.handle(Start(RunInfo(name="night"), Path("night")))
    sinks.handle(Scalars(3, {}))
    sinks.handle(alert(3))
    receiver.wait(1)
    first = receiver.json()[0]
    assert (first["event"], first["run"], first["rule"], first["step"], first["level"]) == \
        ("alert", "night", "kl_high", 3, "warning")
    sinks.handle(alert(3, rule="constant_reward", level="info"))  # below the default level: not sent
    sinks.close("finished")
    end = receiver.json()[-1]
    assert len(receiver.posts) == 2 and (end["event"], end["status"], end["step"]) == ("end", "finished", 3)
    assert end["text"] == "run night finished at step 3"


def test_repeats_of_a_rule_are_held_back_and_counted(receiver):
    clock = [0.0]
    sinks = SinkSet(None, [NotifySink(Channel("slack", receiver.url), repeat_minutes=30, clock=lambda: clock[0])],
                    warn=pytest.fail)
    sinks.handle(alert(1))
    clock[0] = 60.0
    sinks.handle(alert(2))  # a minute later: held back
    clock[0] = 31 * 60.0
    sinks.handle(alert(9))  # past the repeat time: sent
    sinks.handle(alert(9, rule="reward_collapse", level="error", action="stop"))
    sinks.close("interrupted")
    texts = [b["text"] for b in receiver.json()]  # Slack's shape: one text field
    assert [t.split(": step")[0] for t in texts[:3]] == [
        "mlx-grpo run: warning kl_high", "mlx-grpo run: warning kl_high",
        "mlx-grpo run: error reward_collapse (stopping the run)"]
    assert texts[3] == ("mlx-grpo run: stopped: run run stopped by alert 'reward_collapse'; "
                        "1 repeated alert(s) were not sent")


def test_a_dead_endpoint_costs_one_warning_and_never_blocks(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/hook"
    warnings: list[str] = []
    sinks = SinkSet(None, [NotifySink(Channel("ntfy", dead))], warn=warnings.append)
    started = time.monotonic()
    sinks.handle(alert(1))
    for step in range(2, 40):
        time.sleep(0.005)
        sinks.handle(Scalars(step, {"x": 1.0}))
        sinks.handle(alert(step, rule=f"rule_{step}"))
    sinks.close("finished")
    assert time.monotonic() - started < 5
    assert len(warnings) == 1 and "ntfy notifications" in warnings[0] and "cannot notify ntfy" in warnings[0]
    assert sinks.active == []


def test_payload_shapes():
    message = Message("mlx-grpo r: error reward_collapse", "step 3: fell", "error", {"event": "alert"})
    assert json.loads(payload("slack", message)[0]) == {"text": "mlx-grpo r: error reward_collapse: step 3: fell"}
    assert json.loads(payload("discord", message)[0]) == {"content": "mlx-grpo r: error reward_collapse: step 3: fell"}
    body, headers = payload("ntfy", message)
    assert body == b"step 3: fell" and headers["Title"] == message.title and headers["Priority"] == "5"


def test_channels_come_from_the_environment_and_a_missing_url_is_one_clear_error():
    channels, warnings = channels_from_env(["ntfy", "macos"], {"MLX_GRPO_NTFY_URL": "https://ntfy.sh/t",
                                                               "MLX_GRPO_NTFY_TOKEN": "tk_1234"}, platform="linux")
    assert channels == [Channel("ntfy", "https://ntfy.sh/t", "tk_1234")] and "not one" in warnings[0]
    assert channels_from_env(["macos"], {}, platform="darwin")[0] == [Channel("macos")]
    with pytest.raises(UserError, match="MLX_GRPO_SLACK_URL is not set"):
        channels_from_env(["slack"], {})


def test_a_real_run_notifies_an_alert_within_a_step_and_its_end_without_writing_the_url(tmp_path, monkeypatch):
    run_dir = tmp_path / "runs" / "notified"
    server = Receiver(run_dir)
    secret_url = server.url + "?token=s3cr3t-webhook-token"
    monkeypatch.setenv("MLX_GRPO_WEBHOOK_URL", secret_url)
    # a warning at step 2 that lets the run go on, then a stop at step 4
    (tmp_path / "stop.yaml").write_text(
        "rules:\n  - {name: warn_at_two, kind: threshold, metric: rewards/total/mean, op: '>', value: -1000,\n"
        "     for_steps: 2, level: warning, hint: noticed on purpose}\n"
        "  - {name: stop_at_four, kind: threshold, metric: rewards/total/mean, op: '>', value: -1000,\n"
        "     for_steps: 4, action: stop, hint: stopped on purpose}\n")
    config = load_config(None, {"num_steps": 6, "batch_size": 2, "num_generations": 4, "num_iterations": 1,
                                "train_size": 8, "eval_every": 0, "checkpoint_every": 0, "tensorboard": False,
                                "monitoring_dir": str(tmp_path / "runs"), "run_name": "notified",
                                "alerts_file": str(tmp_path / "stop.yaml"), "notify": ["webhook"]})
    try:
        result = train(config, tmp_path)
        server.wait(3)
    finally:
        server.close()
    assert result["status"] == "interrupted"
    warned = [p for p in server.posts if json.loads(p["body"]).get("rule") == "warn_at_two"]
    assert len(warned) == 1 and max(warned[0]["logged"]) <= 2  # fired at step 2, received before step 3 was logged
    assert [json.loads(p["body"]).get("rule") for p in server.posts].count("stop_at_four") == 1
    end = json.loads(server.posts[-1]["body"])
    assert (end["event"], end["status"], end["stopped_by"], end["step"]) == ("end", "interrupted", "stop_at_four", 4)
    written = "".join(p.read_text(errors="replace") for p in run_dir.rglob("*") if p.is_file()
                      and p.suffix in (".json", ".jsonl", ".yaml", ".txt", ""))
    assert "notify" in (run_dir / "run.json").read_text() and "s3cr3t" not in written
