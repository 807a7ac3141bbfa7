"""`mlx-grpo watch --web`: textual-serve's server, admitting only its own page.

textual-serve serves the dashboard to whoever connects to the port, and any web
page the user has open may connect to localhost. So, in front of its routes:

- every request needs this server's token: `?token=...` in the URL printed at
  start (as Jupyter does); the page then keeps it in a cookie for its own
  requests (scripts, font, the websocket);
- a request whose `Origin` is not this server's (a page from another site) is
  refused, even with the token;
- at most `max_sessions` dashboards run at once (each browser tab is a process);
- the page loads nothing from the network: textual-serve's page asks Google
  Fonts for Roboto Mono, here it gets the copy textual-serve ships.

Imports no mlx.
"""

from __future__ import annotations

import hmac
import logging
import re
import secrets
from urllib.parse import urlsplit

from aiohttp import web
from textual_serve.server import Server

# textual-serve's page links Roboto Mono from Google Fonts; the same font is in its static files.
_REMOTE_FONT = re.compile(r"<link[^>]*fonts\.googleapis\.com[^>]*>", re.IGNORECASE)
_LOCAL_FONT = ('<style>@font-face { font-family: "Roboto Mono"; '
               'src: url("/static/fonts/RobotoMono-VariableFont_wght.ttf"); }</style>')
_TOKEN = re.compile(r"(token=)[0-9a-f]+")
_HOST = re.compile(r"[A-Za-z0-9.\-]+(:\d+)?|\[[0-9A-Fa-f:.]+\](:\d+)?")


class HideToken(logging.Filter):
    """aiohttp's access log writes each request line, `GET /?token=...` included: it is kept (who asked for
    what), with the token replaced, so a log or a shared terminal never holds the way in."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Replace the token in the record's message; keep the record."""
        message = record.getMessage()
        if "token=" in message:
            record.msg, record.args = _TOKEN.sub(r"\1…", message), ()
        return True


def same_origin(origin: str, host: str) -> bool:
    """True when a browser's Origin header names the host (and port) the request was sent to."""
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower()


class WatchServer(Server):
    """The dashboard served to a browser on localhost, behind a token and a session limit."""

    def __init__(self, command: str, *, port: int, max_sessions: int, title: str = "mlx-grpo watch"):
        super().__init__(command, host="localhost", port=port, title=title)
        self.token = secrets.token_hex(24)
        self.max_sessions = max_sessions
        self.sessions = 0
        # Cookies do not tell ports apart: one name per port lets two servers run side by side.
        self.cookie = f"mlx_grpo_watch_{port}"

    def initialize_logging(self) -> None:
        """The server's logging, with the token hidden from every handler."""
        super().initialize_logging()
        for handler in logging.getLogger().handlers:
            handler.addFilter(HideToken())

    @property
    def url(self) -> str:
        """The address to open: the only way in is with the token it carries."""
        return f"{self.public_url}/?token={self.token}"

    async def _make_app(self) -> web.Application:
        app = await super()._make_app()
        app.middlewares.append(self._guard)
        return app

    async def on_startup(self, app: web.Application) -> None:
        """Print the address to open, token included."""
        self.console.print(f"mlx-grpo watch: open {self.url}", highlight=False, soft_wrap=True)
        self.console.print(f"(the token in it is this server's; at most {self.max_sessions} dashboards at once; "
                           "Ctrl+C stops)", highlight=False)

    def _has_token(self, request: web.Request) -> bool:
        given = request.query.get("token") or request.cookies.get(self.cookie) or ""
        return hmac.compare_digest(given.encode(), self.token.encode())

    @web.middleware
    async def _guard(self, request: web.Request, handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if origin is not None and not same_origin(origin, request.host):
            return web.Response(status=403, text=f"mlx-grpo watch: refused a request from a page of {origin}\n")
        if not self._has_token(request):
            return web.Response(status=403, text="mlx-grpo watch: open the address printed when the server "
                                                 "started; it carries the token (?token=...)\n")
        if request.path == "/ws":
            return await self._session(request, handler)
        response = await handler(request)
        if request.path == "/" and isinstance(response, web.Response) and response.text is not None:
            response.text = self._page(response.text, request.host)
            response.set_cookie(self.cookie, self.token, httponly=True, samesite="Strict", path="/")
        return response

    async def _session(self, request: web.Request, handler) -> web.StreamResponse:
        if self.sessions >= self.max_sessions:
            return web.Response(status=503, text=f"mlx-grpo watch: {self.max_sessions} dashboards are open already "
                                                 "(--max-sessions); close one\n")
        self.sessions += 1
        try:
            return await handler(request)  # returns when the browser's websocket closes
        finally:
            self.sessions -= 1

    def _page(self, html: str, host: str) -> str:
        """The page with a local font, pointing at the host it was asked from (127.0.0.1, an ssh tunnel's port)."""
        html = _REMOTE_FONT.sub(_LOCAL_FONT, html)
        if _HOST.fullmatch(host):
            base = self.public_url.split("://", 1)[1]
            html = html.replace(f"http://{base}/", f"http://{host}/").replace(f"ws://{base}/", f"ws://{host}/")
        return html
