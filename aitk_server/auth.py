"""The server's credentials: the per-start secret, the --listen token and the one-time
sign-in links that hand the browser its session. The guard (guard.py) checks them.

- The secret is random at every start and stored owner-only (0600) in the data folder
  (`secret`), so this user's own tools (`manager launch`, scripts) can call the API with
  `Authorization: Bearer SECRET` and another user on the machine cannot.
- The browser never sees the secret: the server opens it on a one-time link
  (`/auth/CODE`, valid once, for LINK_LIFETIME_S) that sets a session cookie derived from
  the secret and redirects to the page. A browser opened later (or a server restarted)
  gets a new link from `manager launch`, which asks the running server for one.
- `--listen` adds the access token: AI_TOOLKIT_AUTH if set, else generated once, stored
  owner-only beside the database and printed once. Other machines send it as a bearer
  token, or paste it into the page once to get the same session cookie.

Every comparison is constant-time (hmac.compare_digest).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
import threading
import time
from pathlib import Path

from aitk_common.files import atomic_write_text

ENV_VAR = "AI_TOOLKIT_AUTH"
SECRET_FILE = "secret"
TOKEN_FILE = "token"
LINK_LIFETIME_S = 600.0
MAX_OPEN_LINKS = 16  # unredeemed links kept; the oldest goes first


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load_or_create(path: Path, env: dict[str, str] | None = None) -> tuple[str, bool]:
    """The --listen token: (token, created now)."""
    env = dict(os.environ) if env is None else env
    if env.get(ENV_VAR):
        return env[ENV_VAR], False
    try:
        token = path.read_text(encoding="utf-8").strip()
        if token:
            return token, False
    except FileNotFoundError:
        pass
    token = secrets.token_urlsafe(24)
    atomic_write_text(path, token + "\n", mode=0o600)
    return token, True


def write_secret(data_dir: Path) -> str:
    """A new secret for this start, stored owner-only in the data folder."""
    secret = secrets.token_urlsafe(32)
    atomic_write_text(data_dir / SECRET_FILE, secret + "\n", mode=0o600)
    return secret


def read_secret(data_dir: Path) -> str | None:
    """The running server's secret, for this user's own tools."""
    try:
        return (data_dir / SECRET_FILE).read_text(encoding="utf-8").strip() or None
    except (OSError, ValueError):
        return None


def matches(given: str | None, expected: str | None) -> bool:
    if given is None or expected is None:
        return False
    return hmac.compare_digest(given.encode("utf-8", "replace"),
                               expected.encode("utf-8", "replace"))


class Keys:
    """What one start of the server accepts."""

    def __init__(self, secret: str, token: str | None = None) -> None:
        self.secret = secret
        self.token = token  # --listen only
        # The browser's session: derived, so a cookie never reveals the secret itself.
        self.session = hmac.new(secret.encode(), b"aitk browser session",
                                hashlib.sha256).hexdigest()
        self._links: dict[str, float] = {}  # one-time code -> expiry (monotonic)
        self._lock = threading.Lock()

    def bearer_ok(self, given: str | None) -> bool:
        """A tool's `Authorization: Bearer`: the secret, or the --listen token."""
        return matches(given, self.secret) or matches(given, self.token)

    def cookie_ok(self, given: str | None) -> bool:
        return matches(given, self.session)

    def token_ok(self, given: str | None) -> bool:
        return matches(given, self.token)

    def new_link(self) -> str:
        """A one-time sign-in code (the link is `/auth/CODE`)."""
        code = secrets.token_urlsafe(24)
        with self._lock:
            self._drop_expired()
            while len(self._links) >= MAX_OPEN_LINKS:
                del self._links[next(iter(self._links))]
            self._links[code] = time.monotonic() + LINK_LIFETIME_S
        return code

    def redeem(self, code: str) -> bool:
        """True once per code, within its lifetime."""
        with self._lock:
            self._drop_expired()
            found = next((c for c in self._links if matches(code, c)), None)
            if found is None:
                return False
            del self._links[found]
            return True

    def _drop_expired(self) -> None:
        now = time.monotonic()
        for code in [c for c, expiry in self._links.items() if expiry < now]:
            del self._links[code]
