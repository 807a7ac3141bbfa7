"""Alerts and the run's end sent off the machine: a JSON webhook (generic, Slack or Discord shape), an
ntfy-style plain POST, or macOS Notification Center.

Opt-in (`notify: [slack]` in the YAML or `--notify slack`); each channel's address comes from an environment
variable (CHANNEL_ENV), never from the config, so it is never written to run.json, a checkpoint or any other
file of the run. Each channel is one `NotifySink` with its own thread: the training thread only filters and
queues, so a slow or dead endpoint never slows a step. A rule that fires again within `repeat_minutes` is not
sent again (the next message counts what was held back). A send that fails is raised by the sink's next call,
and SinkSet turns that channel off with one warning.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ...common.errors import UserError
from ...common.secrets import register_secret
from ..alerts.alert import LEVELS
from ..events import AlertEvent, Final, Scalars, Sink, Start

# The environment variable holding each channel's URL (macos needs none); NTFY_TOKEN_ENV an optional bearer token.
CHANNEL_ENV = {"webhook": "MLX_GRPO_WEBHOOK_URL", "slack": "MLX_GRPO_SLACK_URL",
               "discord": "MLX_GRPO_DISCORD_URL", "ntfy": "MLX_GRPO_NTFY_URL", "macos": None}
NTFY_TOKEN_ENV = "MLX_GRPO_NTFY_TOKEN"
CHANNELS = tuple(CHANNEL_ENV)
SEND_TIMEOUT_S = 10.0  # one request; a dead endpoint costs the sink's thread this, never the training thread
MAX_QUEUED = 100  # messages waiting to be sent; more are dropped (counted in the end message)
END_WORDS = {"finished": "finished", "interrupted": "stopped", "failed": "crashed"}


@dataclass(frozen=True)
class Channel:
    kind: str  # one of CHANNELS
    url: str | None = None
    token: str | None = None


@dataclass(frozen=True)
class Message:
    title: str
    text: str
    level: str  # info / warning / error
    fields: Mapping[str, Any]  # the alert's record, or the run's end, for the generic webhook


def channels_from_env(names: list[str], env: Mapping[str, str] | None = None,
                      platform: str = sys.platform) -> tuple[list[Channel], list[str]]:
    """The channels named by the config's `notify`, their URLs read from the environment. Returns the channels
    and warnings (macos asked for off a Mac). A channel whose variable is unset is a UserError."""
    env = os.environ if env is None else env
    channels, warnings = [], []
    for name in dict.fromkeys(names):
        if name not in CHANNEL_ENV:
            raise UserError(f"key 'notify' names {name!r}; expected some of {', '.join(CHANNELS)}")
        if name == "macos":
            if platform != "darwin":
                warnings.append("notify: macos sends to the Notification Center of a Mac; this machine is not one, "
                                "so it is left out")
            else:
                channels.append(Channel("macos"))
            continue
        url = env.get(CHANNEL_ENV[name], "").strip()
        if not url.startswith(("http://", "https://")):
            raise UserError(f"key 'notify' names {name!r}, but the environment variable {CHANNEL_ENV[name]} "
                            f"{'is not set' if not url else 'does not hold an http(s) URL'}; set it to the "
                            f"{name} URL (it is read from the environment so it is never written to the run)")
        token = env.get(NTFY_TOKEN_ENV) if name == "ntfy" else None
        register_secret(url)  # scrubbed should it ever reach a message or a file
        register_secret(token)
        channels.append(Channel(name, url, token or None))
    return channels, warnings


def payload(kind: str, message: Message) -> tuple[bytes, dict[str, str]]:
    """The request body and headers for one message on a channel of `kind` (not macos)."""
    line = f"{message.title}: {message.text}"
    if kind == "slack":
        return json.dumps({"text": line}).encode(), {"Content-Type": "application/json"}
    if kind == "discord":
        return json.dumps({"content": line[:2000]}).encode(), {"Content-Type": "application/json"}
    if kind == "ntfy":
        priority = {"error": "5", "warning": "4"}.get(message.level, "3")
        # header values must be latin-1: the title keeps what it can
        title = message.title.encode("latin-1", "replace").decode("latin-1")
        return message.text.encode(), {"Title": title, "Priority": priority, "Tags": message.level}
    body = {"title": message.title, "text": message.text, "level": message.level, **message.fields}
    return json.dumps(body, default=str).encode(), {"Content-Type": "application/json"}


def _applescript_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def send(channel: Channel, message: Message, timeout: float = SEND_TIMEOUT_S) -> None:
    """Deliver one message; raises on any failure (an HTTP error, no answer within `timeout`)."""
    if channel.kind == "macos":
        script = (f"display notification {_applescript_string(message.text[:400])} "
                  f"with title {_applescript_string(message.title[:100])}")
        subprocess.run(["osascript", "-e", script], check=True, timeout=timeout, capture_output=True)
        return
    body, headers = payload(channel.kind, message)
    if channel.token:
        headers["Authorization"] = f"Bearer {channel.token}"
    request = urllib.request.Request(channel.url, data=body, headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 (the user's own URL)
        response.read(1024)


def alert_message(run: str, record: Mapping[str, Any]) -> Message:
    level = str(record.get("level", "warning"))
    action = {"stop": " (stopping the run)", "rollback": " (rolling back)"}.get(str(record.get("action", "")), "")
    return Message(title=f"mlx-grpo {run}: {level} {record.get('rule', '')}{action}",
                   text=f"step {record.get('step')}: {record.get('message', '')}", level=level,
                   fields={"event": "alert", "run": run, **record})


def end_message(run: str, status: str, step: int | None, stopped_by: str | None, held: int) -> Message:
    word = END_WORDS.get(status, status)
    cause = f" by alert '{stopped_by}'" if stopped_by and status == "interrupted" else ""
    where = f" at step {step}" if step is not None else ""
    extra = f"; {held} repeated alert(s) were not sent" if held else ""
    return Message(title=f"mlx-grpo {run}: {word}", text=f"run {run} {word}{cause}{where}{extra}",
                   level="info" if status == "finished" else "error",
                   fields={"event": "end", "run": run, "status": status, "step": step, "stopped_by": stopped_by})


class NotifySink(Sink):
    """One channel: alerts at or above `min_level` and the run's end, sent from a thread of its own."""

    def __init__(self, channel: Channel, min_level: str = "warning", repeat_minutes: float = 30.0,
                 sender: Callable[[Channel, Message], None] = send, clock: Callable[[], float] = time.monotonic,
                 close_timeout: float = 2 * SEND_TIMEOUT_S):
        self.name = f"{channel.kind} notifications"
        self.channel = channel
        self.min_rank = LEVELS.index(min_level)
        self.repeat_s = repeat_minutes * 60.0
        self.sender, self.clock, self.close_timeout = sender, clock, close_timeout
        self.run = "run"
        self.step: int | None = None
        self.stopped_by: str | None = None
        self.last_sent: dict[tuple[str, str], float] = {}
        self.held = 0
        self._error: BaseException | None = None  # the first failed send; nothing is sent after it
        self._reported = False
        self._queue: queue.Queue = queue.Queue(MAX_QUEUED)
        self._thread = threading.Thread(target=self._work, name=f"mlx-grpo-{channel.kind}-notify", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while (message := self._queue.get()) is not None:
            if self._error is None:
                try:
                    self.sender(self.channel, message)
                except Exception as exc:  # raised on the training thread by the next call: SinkSet warns once
                    self._error = exc

    def _raise_error(self) -> None:
        if self._error is not None and not self._reported:
            self._reported = True
            error = self._error
            raise RuntimeError(f"cannot notify {self.channel.kind}: {type(error).__name__}: {error}") from None

    def _put(self, message: Message) -> None:
        try:
            self._queue.put_nowait(message)
        except queue.Full:
            self.held += 1

    def handle(self, event: Any) -> None:
        self._raise_error()
        if isinstance(event, Scalars):
            self.step = event.step
        elif isinstance(event, AlertEvent):
            self._alert(event.record)
        elif isinstance(event, Start):
            self.run = str(getattr(event.info, "name", None) or event.run_dir.name)
        elif isinstance(event, Final) and "final/steps" in event.metrics:
            self.step = int(event.metrics["final/steps"])

    def _alert(self, record: Mapping[str, Any]) -> None:
        level = record.get("level")
        if record.get("action") == "stop":
            self.stopped_by = str(record.get("rule"))
        if level not in LEVELS or LEVELS.index(level) < self.min_rank:
            return
        key, now = (str(record.get("rule")), str(record.get("metric"))), self.clock()
        last = self.last_sent.get(key)
        if last is not None and now - last < self.repeat_s and record.get("action") not in ("stop", "rollback"):
            self.held += 1
            return
        self.last_sent[key] = now
        self._put(alert_message(self.run, record))

    def close(self, status: str) -> None:
        """Send the run's end, wait (at most `close_timeout`) for the queue to drain."""
        self._raise_error()
        if self._error is None:
            self._put(end_message(self.run, status, self.step, self.stopped_by, self.held))
        try:
            self._queue.put(None, timeout=self.close_timeout)
        except queue.Full:
            pass
        self._thread.join(self.close_timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the run's end was not delivered within {self.close_timeout:.0f} s")
        self._raise_error()
