"""Secrets kept out of every file and service: configs, alert messages, W&B notes. Imports nothing.

- `scrub_secrets(obj)`: a copy of a config with API keys, tokens and passwords removed: keys named like
  one (`api_key`, `hf_token`, `password`, `client_secret`...; `max_tokens`, `eos_token` are kept),
  string values that look like one (`sk-...`, `hf_...`, `ghp_...`, `Bearer ...`), and string values
  equal to a secret-named environment variable's value.
- `scrub_text(text)`: free text with every secret value in it replaced by [secret].
- `register_secret(value)`: a value to scrub whatever its variable is called (a judge's key).
"""

from __future__ import annotations

import os
import re
from typing import Any, Mapping

# A key that names a secret. Anchored at the end so `max_tokens`, `eos_token`, `api_key_env` stay.
_SECRET_KEY = re.compile(
    r"(?i)(api[_-]?key|secret|secret[_-]?key|passw(?:or)?d|credentials?|private[_-]?key|"
    r"(?:^|[_-])(?:access|api|auth|bearer|hf|huggingface|wandb|openai|anthropic|github|gh|session|refresh|"
    r"id)[_-]?token|^token)$"
)
# Values with the shape of common credentials.
_SECRET_VALUE = re.compile(
    r"(sk-[A-Za-z0-9_-]{16,}|hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|"
    r"xox[abprs]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}|(?i:bearer)\s+\S{8,})"
)
_SECRET_ENV = re.compile(r"(?i)(key|token|secret|password)$")


# Values known to be secret whatever their variable is called (a judge's key from its api_key_env).
_REGISTERED: set[str] = set()


def register_secret(value: str | None) -> None:
    """Never write `value`: it is scrubbed from configs, alert messages and W&B notes from now on."""
    if value and len(value) >= 4:
        _REGISTERED.add(value)


def _env_secrets() -> set[str]:
    named = {value for name, value in os.environ.items() if _SECRET_ENV.search(name) and len(value) >= 8}
    return named | _REGISTERED


def scrub_text(text: str) -> str:
    """Free text (an alert message, a judge's error body, W&B notes) with every secret value it contains
    replaced by [secret]: the known secrets, then anything shaped like a credential."""
    for secret in sorted(_env_secrets(), key=len, reverse=True):
        text = text.replace(secret, "[secret]")
    return _SECRET_VALUE.sub("[secret]", text)


def scrub_secrets(obj: Any, _env: set[str] | None = None) -> Any:
    """A copy of `obj` with API keys, tokens and passwords replaced by a mark."""
    env = _env_secrets() if _env is None else _env
    if isinstance(obj, Mapping):
        return {k: scrub_secrets(v, env) for k, v in obj.items()
                if not (isinstance(k, str) and _SECRET_KEY.search(k)) and not _is_secret_value(v, env)}
    if isinstance(obj, (list, tuple)):
        return [scrub_secrets(v, env) for v in obj if not _is_secret_value(v, env)]
    return obj


def _is_secret_value(value: Any, env: set[str]) -> bool:
    return isinstance(value, str) and (value in env or bool(_SECRET_VALUE.search(value)))
