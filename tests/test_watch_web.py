"""`mlx-grpo watch --web`: the dashboard served on localhost by textual-serve.

The first test talks to the server like the page's script does (HTTP, then the
websocket that carries the terminal) and needs no browser. The second loads the
page in headless Chromium and reads what the page's terminal received; it is
skipped when Chromium is not installed (Debian: apt-get install chromium).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import aiohttp
import pytest

from run_writer import RunWriter

pytestmark = pytest.mark.anyio

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
# Flags for a sandboxed CI machine without network (see the environment notes).
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ANSI = re.compile(rb"\x1b\[[0-9;?<>=]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b[=>]|\x1b\][^\x07]*\x07")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def served_run(tmp_path):
    """A run directory and `mlx-grpo watch --web` serving it; yields (url, run name)."""
    writer = RunWriter(tmp_path / "webrun", name="web-demo-run", total_steps=40)
    writer.start()
    for _ in range(12):
        writer.log_step()
    port = free_port()
    log = open(tmp_path / "server.log", "wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "mlx_grpo.cli", "watch", "--web", "--port", str(port), str(writer.run_dir)],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    url = f"http://localhost:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("localhost", port), timeout=0.5).close()
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                log.close()
                pytest.fail("server did not start: " + (tmp_path / "server.log").read_text())
            time.sleep(0.1)
    try:
        yield url, writer.name
    finally:
        stop_session(server)  # with the dashboard processes the server started
        log.close()


def stop_session(proc: subprocess.Popen) -> None:
    """End a process started with start_new_session=True and everything it started."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def terminal_text(data: bytes) -> str:
    return ANSI.sub(b"", data).decode("utf-8", errors="replace")


async def test_served_page_and_its_terminal_show_the_run(served_run):
    url, name = served_run
    async with aiohttp.ClientSession() as http:
        async with http.get(url) as page:
            html = await page.text()
        assert page.status == 200 and "textual.js" in html
        ws_url = re.search(r'data-session-websocket-url="([^"]+)"', html).group(1)
        received = b""
        async with http.ws_connect(f"{ws_url}?width=120&height=40") as ws:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not (name in terminal_text(received) and "step 12/40" in terminal_text(received)):
                try:
                    msg = await ws.receive(timeout=2)
                except asyncio.TimeoutError:
                    continue
                if msg.type == aiohttp.WSMsgType.BINARY:
                    received += msg.data
                elif msg.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                    break
    text = terminal_text(received)
    assert name in text and "step 12/40" in text and "Overview" in text


# Before the page's own script runs: keep a copy of every terminal frame the page receives.
RECORD_FRAMES = """
window.__frames = [];
const NativeWebSocket = window.WebSocket;
window.WebSocket = function (...args) {
  const socket = new NativeWebSocket(...args);
  socket.addEventListener("message", (event) => {
    if (typeof event.data !== "string") window.__frames.push(new TextDecoder().decode(event.data));
  });
  return socket;
};
window.WebSocket.prototype = NativeWebSocket.prototype;
"""


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)")
async def test_headless_chromium_loads_the_dashboard(served_run, tmp_path):
    url, name = served_run
    profile = tmp_path / "chromium-profile"
    browser = subprocess.Popen([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                                "--remote-debugging-port=0", "--window-size=1400,900", "about:blank"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            assert browser.poll() is None and time.monotonic() < deadline, "Chromium did not start"
            await asyncio.sleep(0.1)
        devtools = int(port_file.read_text().split()[0])
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{devtools}/json/list") as resp:
                targets = await resp.json(content_type=None)
            page = next(t for t in targets if t["type"] == "page")
            async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as cdp:
                ids = iter(range(1, 10**6))

                async def call(method: str, **params):
                    msg_id = next(ids)
                    await cdp.send_str(json.dumps({"id": msg_id, "method": method, "params": params}))
                    while True:
                        reply = json.loads((await cdp.receive(timeout=30)).data)
                        if reply.get("id") == msg_id:
                            assert "error" not in reply, reply
                            return reply.get("result", {})

                await call("Page.enable")
                await call("Page.addScriptToEvaluateOnNewDocument", source=RECORD_FRAMES)
                await call("Page.navigate", url=url)
                shown = ""
                deadline = time.monotonic() + 45
                while time.monotonic() < deadline:
                    await asyncio.sleep(0.5)
                    result = await call("Runtime.evaluate", returnByValue=True, expression=(
                        "JSON.stringify({frames: (window.__frames || []).join(''),"
                        " started: document.body && document.body.classList.contains('-first-byte'),"
                        " canvas: document.querySelectorAll('.xterm-screen canvas').length})"))
                    state = json.loads(result["result"]["value"])
                    shown = terminal_text(state["frames"].encode())
                    if state["started"] and name in shown and "step 12/40" in shown:
                        break
                shot = await call("Page.captureScreenshot", format="png")
                (tmp_path / "dashboard.png").write_bytes(__import__("base64").b64decode(shot["data"]))
        assert state["started"], "the page's terminal never received the app's output"
        assert state["canvas"] > 0, "xterm did not draw"
        assert name in shown and "step 12/40" in shown
        assert (tmp_path / "dashboard.png").stat().st_size > 10_000
    finally:
        stop_session(browser)
