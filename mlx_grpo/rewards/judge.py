"""A judge model behind an OpenAI-compatible chat-completions endpoint scores completions.

The user runs the judge themselves (for example `mlx_lm.server`); this module only talks to
the one URL named in the rubric file. Every failure (refused connection, timeout, HTTP error,
a reply without a usable number) becomes a missing score plus a `JudgeError` record, never an
exception, so a flaky judge cannot stop a training run.

Decisions (documented in docs/RUBRICS.md):
- the score is the first number in the reply; a number outside the declared range is rejected
  (missing score + error record) rather than clamped, because a judge that answers 15 on a 0..10
  scale did not follow the instructions and clamping would hide it;
- scores are normalised to 0..1 with the declared range, so judge and rule criteria share a scale;
- transport failures, HTTP 429 and 5xx are retried with exponential backoff; other HTTP errors
  (400, 401, 404: configuration problems) and unusable replies are not, since resending the same
  request would fail the same way;
- proxies from the environment and HTTP redirects are not followed: only the configured URL is
  contacted.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

CHAT_PATH = "/chat/completions"
PLACEHOLDERS = ("prompt", "completion", "answer")
_PLACEHOLDER = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")
_FIRST_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)")
_ERROR_BODY_CHARS = 200


@dataclass(frozen=True)
class JudgeConfig:
    """Where the judge lives and how patiently to ask it."""

    url: str  # full chat-completions URL, see chat_completions_url()
    model: str | None = None  # sent as "model" when set; mlx_lm.server serves its loaded model without it
    api_key: str | None = field(default=None, repr=False)  # never printed or logged
    timeout_s: float = 30.0  # per socket operation (connect, each read)
    retries: int = 2  # extra attempts after the first, for retryable failures only
    backoff_s: float = 0.5  # wait before retry k is backoff_s * 2**(k-1)
    concurrency: int = 4  # requests in flight at once
    max_tokens: int = 64
    temperature: float = 0.0
    system: str | None = None  # optional system message sent before every prompt


@dataclass(frozen=True)
class JudgeError:
    """One sample the judge could not score; the trainer turns these into alerts."""

    criterion: str
    sample: int  # index of the completion within the scored batch
    attempts: int  # HTTP requests made for it, retries included
    message: str


@dataclass
class JudgeBatch:
    """What one criterion's judge pass over a batch produced."""

    scores: list[float | None]  # normalised to 0..1; None = missing
    raw: list[float | None]  # the numbers as the judge wrote them
    errors: list[JudgeError]
    api_tokens: int  # from the responses' `usage` field, retries included
    requests: int  # HTTP requests sent, retries included


@dataclass(frozen=True)
class _Reply:
    text: str | None
    tokens: int
    attempts: int
    error: str | None


def chat_completions_url(url: str) -> str:
    """Turn what the user wrote into the chat-completions URL.

    `http://host:8080` -> `http://host:8080/v1/chat/completions`; `.../v1` -> `.../v1/chat/completions`;
    a URL already ending in `/chat/completions` is used as is. Raises ValueError for non-HTTP URLs.
    """
    parts = urllib.parse.urlsplit(url.strip())
    if parts.username or parts.password:
        # Credentials in the URL would end up in error messages; keys belong in api_key_env.
        raise ValueError("must not contain a user name or password; put the key in api_key_env")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"must be an http:// or https:// URL with a host, got {url!r}")
    if parts.query or parts.fragment:
        raise ValueError(f"must not contain a query or fragment, got {url!r}")
    _ = parts.port  # urllib raises ValueError here for a malformed or out-of-range port
    path = parts.path.rstrip("/")
    if not path.endswith(CHAT_PATH):
        path += CHAT_PATH if path.endswith("/v1") else "/v1" + CHAT_PATH
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def render(template: str, prompt: str, completion: str, answer: str) -> str:
    """Fill `{prompt}`, `{completion}`, `{answer}` in one pass; every other brace stays literal.

    One pass matters: a completion that contains the text "{answer}" must not receive the answer.
    """
    values = {"prompt": prompt, "completion": completion, "answer": answer}
    return _PLACEHOLDER.sub(lambda match: values[match.group(1)], template)


def parse_score(reply: str, low: float, high: float) -> float:
    """The first number in the reply, checked against [low, high]; ValueError says why not."""
    match = _FIRST_NUMBER.search(reply)
    if match is None:
        raise ValueError(f"no number in reply {_snippet(reply)}")
    value = float(match.group(0))
    if not low <= value <= high:
        raise ValueError(f"score {value:g} outside range [{low:g}, {high:g}] in reply {_snippet(reply)}")
    return value


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Refuse redirects so a response cannot send us to a host the user did not name."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: D102 - urllib hook
        return None


# Batches not sent to a judge after one in which every request failed (see Judge.score).
SKIP_AFTER_OUTAGE = 4


class Judge:
    """Client for one configured endpoint; safe to share between criteria and threads."""

    def __init__(self, config: JudgeConfig):
        self.config = config
        self.url = chat_completions_url(config.url)
        self._skip_batches = 0  # the circuit breaker: batches left to skip after one where every request failed
        self._last_failure = ""
        # An empty ProxyHandler ignores http_proxy & co: the judge URL is the only host contacted.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())

    def score(self, criterion: str, template: str, low: float, high: float,
              prompts: list[str], completions: list[str], answers: list[str]) -> JudgeBatch:
        """Score every completion; identical rendered prompts in the batch are asked only once.

        A circuit breaker keeps a judge that is down from costing every step its timeouts and retries:
        after a batch in which every request failed, the next SKIP_AFTER_OUTAGE batches are not sent
        (their scores are missing, with the reason); then the judge is tried again."""
        messages = [render(template, p, c, a) for p, c, a in zip(prompts, completions, answers)]
        unique = list(dict.fromkeys(messages))
        if self._skip_batches > 0:
            self._skip_batches -= 1
            skipped = _Reply(None, 0, 0, f"not asked: every request of an earlier batch failed ({self._last_failure}); "
                                         f"the judge is tried again in {self._skip_batches + 1} batch(es)")
            replies = {message: skipped for message in unique}
        else:
            with ThreadPoolExecutor(max_workers=max(1, min(self.config.concurrency, len(unique) or 1))) as pool:
                replies = dict(zip(unique, pool.map(self.ask, unique)))
            if replies and all(reply.error is not None for reply in replies.values()):
                self._skip_batches = SKIP_AFTER_OUTAGE
                self._last_failure = next(iter(replies.values())).error or ""

        batch = JudgeBatch(scores=[], raw=[], errors=[], api_tokens=0, requests=0)
        for reply in replies.values():
            batch.api_tokens += reply.tokens
            batch.requests += reply.attempts
        for index, message in enumerate(messages):
            reply = replies[message]
            error = reply.error
            raw = None
            if error is None:
                try:
                    raw = parse_score(reply.text or "", low, high)
                except ValueError as err:
                    error = str(err)
            if error is not None:
                batch.errors.append(JudgeError(criterion, index, reply.attempts, error))
            batch.raw.append(raw)
            batch.scores.append(None if raw is None else (raw - low) / (high - low))
        return batch

    def ask(self, content: str) -> _Reply:
        """One chat request with retries; never raises for network or server trouble."""
        tokens = 0
        attempts = 0
        while True:
            attempts += 1
            try:
                body = self._post(content)
                tokens += _usage_tokens(body)
                return _Reply(_reply_text(body), tokens, attempts, None)
            except _Failure as failure:
                if not failure.retryable or attempts > self.config.retries:
                    return _Reply(None, tokens, attempts, failure.message)
            time.sleep(self.config.backoff_s * 2 ** (attempts - 1))

    def _post(self, content: str) -> dict:
        messages = [{"role": "user", "content": content}]
        if self.config.system:
            messages.insert(0, {"role": "system", "content": self.config.system})
        payload = {"messages": messages, "max_tokens": self.config.max_tokens,
                   "temperature": self.config.temperature, "stream": False}
        if self.config.model:
            payload["model"] = self.config.model
        headers = {"Content-Type": "application/json"}
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        request = urllib.request.Request(self.url, data=json.dumps(payload).encode(), headers=headers, method="POST")
        try:
            with self._opener.open(request, timeout=self.config.timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as err:
            detail = _error_detail(err.read().decode("utf-8", "replace")) if err.fp else ""
            retryable = err.code == 429 or err.code >= 500
            raise _Failure(f"HTTP {err.code} from {self.url}" + (f": {detail}" if detail else ""), retryable) from err
        except (TimeoutError, socket.timeout) as err:
            raise _Failure(f"no reply from {self.url} within {self.config.timeout_s:g} s", True) from err
        except urllib.error.URLError as err:
            reason = err.reason
            if isinstance(reason, (TimeoutError, socket.timeout)):
                raise _Failure(f"no reply from {self.url} within {self.config.timeout_s:g} s", True) from err
            raise _Failure(f"cannot reach {self.url}: {reason}", True) from err
        except (OSError, http.client.HTTPException) as err:
            raise _Failure(f"connection to {self.url} failed: {type(err).__name__}: {err}", True) from err
        try:
            body = json.loads(raw.decode("utf-8"))
        except ValueError as err:
            raise _Failure(f"reply from {self.url} is not JSON: {_snippet(raw.decode('utf-8', 'replace'))}",
                           False) from err
        if not isinstance(body, dict):
            raise _Failure(f"reply from {self.url} is not a JSON object", False)
        return body


def _error_detail(text: str) -> str:
    """An error reply as a sentence: the message of an OpenAI-style {"error": {"message": ...}} body (or
    {"message"}, {"detail"}), else the start of the text."""
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):
        return _snippet(text)
    if isinstance(body, dict):
        error = body.get("error")
        for message in ((error.get("message") if isinstance(error, dict) else error), body.get("message"),
                        body.get("detail")):
            if isinstance(message, str) and message.strip():
                return _snippet(message)
    return _snippet(text)


class _Failure(Exception):
    def __init__(self, message: str, retryable: bool):
        super().__init__(message)
        self.message = message
        self.retryable = retryable


def _reply_text(body: dict) -> str:
    try:
        content = body["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError) as err:
        raise _Failure("reply has no choices[0].message.content", False) from err
    if not isinstance(content, str):
        raise _Failure("reply content is not text", False)
    return content


def _usage_tokens(body: dict) -> int:
    """Tokens the endpoint says it spent; 0 when it reports no usage."""
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return 0
    total = usage.get("total_tokens")
    if isinstance(total, int) and not isinstance(total, bool):
        return max(total, 0)
    parts = [usage.get("prompt_tokens"), usage.get("completion_tokens")]
    return sum(p for p in parts if isinstance(p, int) and not isinstance(p, bool) and p > 0)


def _snippet(text: str) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= _ERROR_BODY_CHARS else text[:_ERROR_BODY_CHARS] + "...")
