"""`mlx-grpo watch --web`: the dashboard served on localhost by textual-serve.

Most tests talk to the server like the page's script does (HTTP, then the
websocket that carries the terminal) and need no browser: the page and its
terminal, what the server refuses (no token, another site's Origin, more
sessions than allowed) and that the page asks nothing of the network. The last
loads the page in headless Chromium, reads what the page's terminal received
and lists every request the page made; it is skipped when Chromium is not
installed (Debian: apt-get install chromium).
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
from dataclasses import dataclass
from typing import Callable

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


@dataclass
class Served:
    url: str    # as printed at start, with the token
    base: str   # http://localhost:PORT
    run_name: str
    log: object  # the server's output (a Path)


def serve(tmp_path, *extra: str):
    """A run directory and `mlx-grpo watch --web` serving it, until the generator is closed."""
    writer = RunWriter(tmp_path / "webrun", name="web-demo-run", total_steps=40)
    writer.start()
    for _ in range(12):
        writer.log_step()
    port = free_port()
    log_path = tmp_path / "server.log"
    log = open(log_path, "wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "mlx_grpo.cli", "watch", "--web", "--port", str(port), *extra, str(writer.run_dir)],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while not (printed := re.search(r"open (http://\S+)", log_path.read_text())):
        if server.poll() is not None or time.monotonic() > deadline:
            log.close()
            pytest.fail("server did not start: " + log_path.read_text())
        time.sleep(0.1)
    base = f"http://localhost:{port}"
    while True:
        try:
            socket.create_connection(("localhost", port), timeout=0.5).close()
            break
        except OSError:
            assert time.monotonic() < deadline, "the server printed its address but does not listen"
            time.sleep(0.1)
    try:
        yield Served(printed.group(1), base, writer.name, log_path)
    finally:
        stop_session(server)  # with the dashboard processes the server started
        log.close()


@pytest.fixture
def served_run(tmp_path):
    yield from serve(tmp_path)


@pytest.fixture
def served_one_session(tmp_path):
    yield from serve(tmp_path, "--max-sessions", "1")


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


async def open_page(http: aiohttp.ClientSession, url: str) -> str:
    """The page's HTML; the session keeps the cookie the page sets, as a browser does."""
    async with http.get(url) as page:
        assert page.status == 200, await page.text()
        return await page.text()


def websocket_url(html: str) -> str:
    return re.search(r'data-session-websocket-url="([^"]+)"', html).group(1) + "?width=120&height=40"


async def read_terminal(ws, until: Callable[[str], bool], timeout: float = 30) -> str:
    received = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not until(terminal_text(received)):
        try:
            msg = await ws.receive(timeout=2)
        except asyncio.TimeoutError:
            continue
        if msg.type == aiohttp.WSMsgType.BINARY:
            received += msg.data
        elif msg.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
            break
    return terminal_text(received)


async def test_served_page_and_its_terminal_show_the_run(served_run):
    name = served_run.run_name
    assert "?token=" in served_run.url
    async with aiohttp.ClientSession() as http:
        html = await open_page(http, served_run.url)
        assert "textual.js" in html
        async with http.ws_connect(websocket_url(html)) as ws:
            text = await read_terminal(ws, lambda t: name in t and "step 12/40" in t)
    assert name in text and "step 12/40" in text and "Overview" in text


async def status_of(http: aiohttp.ClientSession, url: str, **headers: str) -> int:
    async with http.get(url, headers=headers) as response:
        return response.status


async def test_requests_without_the_token_are_refused(served_run):
    base = served_run.base
    async with aiohttp.ClientSession() as http:
        assert await status_of(http, base + "/") == 403
        assert await status_of(http, base + "/?token=0123456789abcdef") == 403
        assert await status_of(http, base + "/static/js/textual.js") == 403
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(base.replace("http", "ws") + "/ws?width=80&height=24")
        assert refused.value.status == 403


async def test_another_sites_page_is_refused_even_with_the_token(served_run):
    evil = {"Origin": "http://evil.example"}
    async with aiohttp.ClientSession() as http:
        assert await status_of(http, served_run.url, **evil) == 403
        html = await open_page(http, served_run.url)  # the cookie a real visit gets does not help either
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(websocket_url(html), headers=evil)
        assert refused.value.status == 403
        # The page's own origin is admitted, on localhost or 127.0.0.1.
        assert await status_of(http, served_run.url, Origin=served_run.base) == 200
        local = served_run.url.replace("localhost", "127.0.0.1")
        assert await status_of(http, local, Origin=served_run.base.replace("localhost", "127.0.0.1")) == 200


async def test_sessions_are_capped(served_one_session):
    served = served_one_session
    async with aiohttp.ClientSession() as http:
        html = await open_page(http, served.url)
        async with http.ws_connect(websocket_url(html)) as first:
            await read_terminal(first, lambda t: "Overview" in t)
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(websocket_url(html))
            assert refused.value.status == 503
        # Once the first tab is closed, a new one gets in.
        deadline = time.monotonic() + 10
        while True:
            try:
                async with http.ws_connect(websocket_url(html)) as second:
                    assert "Overview" in await read_terminal(second, lambda t: "Overview" in t)
                break
            except aiohttp.WSServerHandshakeError:
                assert time.monotonic() < deadline, "the closed session was never released"
                await asyncio.sleep(0.2)


async def test_page_loads_nothing_from_the_network(served_run):
    async with aiohttp.ClientSession() as http:
        html = await open_page(http, served_run.url)
        addresses = re.findall(r"""(?:src|href|url)\s*[=(]\s*["']?([^"')\s>]+)""", html)
        assert addresses
        remote = [a for a in addresses if re.match(r"(https?:)?//", a) and not a.startswith(served_run.base)]
        assert not remote, remote
        font = re.search(r'src: url\("([^"]+\.ttf)"\)', html).group(1)
        async with http.get(served_run.base + font) as response:
            assert response.status == 200 and len(await response.read()) > 10_000


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
    url, name = served_run.url, served_run.run_name
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
                requested: list[str] = []  # every URL the page asked for

                async def call(method: str, **params):
                    msg_id = next(ids)
                    await cdp.send_str(json.dumps({"id": msg_id, "method": method, "params": params}))
                    while True:
                        reply = json.loads((await cdp.receive(timeout=30)).data)
                        if reply.get("method") == "Network.requestWillBeSent":
                            requested.append(reply["params"]["request"]["url"])
                        if reply.get("id") == msg_id:
                            assert "error" not in reply, reply
                            return reply.get("result", {})

                await call("Network.enable")
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
        # Works offline: everything the page asked for came from this server (no font or CDN requests).
        assert any(u.endswith(".ttf") for u in requested), requested
        assert all(u.startswith(served_run.base) for u in requested), requested
    finally:
        stop_session(browser)


async def test_the_token_is_printed_once_and_never_written_to_the_access_log(served_run):
    token = served_run.url.split("token=", 1)[1]
    async with aiohttp.ClientSession() as http:
        for _ in range(2):
            await open_page(http, served_run.url)
    await asyncio.sleep(0.5)
    log = served_run.log.read_text()
    assert "GET /?token=…" in log  # requests are still logged
    assert log.count(token) == 1, log  # only in the address printed at start
