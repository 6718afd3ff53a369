"""The access token: required on every API route when the server listens beyond
loopback (`--listen`). There is no default password: the token comes from
AI_TOOLKIT_AUTH, else it is generated once and stored owner-only (0600) beside the
database, and printed once, when it is made."""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
from pathlib import Path

ENV_VAR = "AI_TOOLKIT_AUTH"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load_or_create(path: Path, env: dict[str, str] | None = None) -> tuple[str, bool]:
    """(token, created now)."""
    env = dict(os.environ) if env is None else env
    if env.get(ENV_VAR):
        return env[ENV_VAR], False
    try:
        token = path.read_text(encoding="utf-8").strip()
        if token:
            return token, False
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(24)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(token + "\n")
    os.replace(tmp, path)
    return token, True


def matches(given: str | None, token: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), token.encode())
