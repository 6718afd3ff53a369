"""The one guard in front of every route: an ASGI middleware wrapped around the whole app,
so no handler has to remember a security check.

Threat model. The server drives training jobs and reads and writes files as the user, so
whoever can call its API can run code as the user (a job's config names a model folder,
a dataset, an output folder). It must answer only the user, and only through the page
it serves itself. The attackers:

1. Another site in the user's browser. The browser connects to 127.0.0.1 for any page.
   - DNS rebinding: a page whose own name re-resolves to 127.0.0.1 reads the API as
     "same origin". Refused by the Host allow-list: only the server's own names
     (127.0.0.1, localhost, [::1] with its port; with --listen also IP literals, which
     no other site can own, the machine's names, and each --allowed-host NAME).
   - Cross-site writes (CSRF): a form or `fetch(..., {mode: "no-cors"})` can POST with
     the user's cookie. Every write needs a content type no form can send and no page
     can send cross-site without a CORS preflight (application/json, or
     application/octet-stream for uploads), and an Origin (else Sec-Fetch-Site, else
     Referer) equal to the server's own. The server never sends a CORS header, so no
     preflight is ever approved.
   - Cross-site reads: the session cookie is SameSite=Strict and HttpOnly, /api refuses
     a `Sec-Fetch-Site` of another site, and every response says
     `Cross-Origin-Resource-Policy: same-origin`.
   - Content run in our origin: the file route serves only what the trainer wrote, never
     as HTML (outputs.py); every response carries `X-Content-Type-Options: nosniff`, the
     page a Content-Security-Policy that allows only its own scripts, and no page may
     frame it.
2. Another user on the machine (or on the LAN with --listen) connects directly, with any
   headers. Every /api call needs a credential (auth.py): the per-start secret (a 0600
   file only this user can read) as a bearer token, the session cookie a one-time link
   gave this user's browser, or with --listen the access token.

Not covered: someone who holds the secret or the token; plain HTTP on the LAN (--listen
sends the token in clear: use it on a network you trust, or behind a TLS proxy named with
--allowed-host); browsers send cookies to every port of a host name, so a page served by
another program on this machine that the user's browser visits receives the session
cookie (the secret changes at every start).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from ipaddress import ip_address
from urllib.parse import unquote_to_bytes, urlsplit

from starlette.datastructures import Headers
from starlette.requests import Request, cookie_parser
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from aitk_server.auth import Keys

LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Content types a write may carry: none is one a form can send, and a page may send them
# to another origin only after a CORS preflight, which this server never approves.
WRITE_TYPES = frozenset({"application/json", "application/octet-stream"})
DEFAULT_PORTS = {"http": 80, "https": 443}
SESSION_PATH = "/api/session"  # POST {"token"}: --listen's sign-in from the page
LINKS_PATH = "/api/links"  # POST (tools with the secret): a new one-time sign-in link

PAGE_CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: "
            "blob:; media-src 'self' blob:; connect-src 'self'; object-src 'none'; "
            "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
API_CSP = "default-src 'none'; frame-ancestors 'none'; sandbox"
COMMON_HEADERS = [(b"x-content-type-options", b"nosniff"),
                  (b"referrer-policy", b"same-origin"),
                  (b"x-frame-options", b"DENY"),
                  (b"cross-origin-resource-policy", b"same-origin"),
                  (b"cross-origin-opener-policy", b"same-origin")]

SIGN_IN_LINK = ("sign in first: open the one-time link the server opened or printed; "
                "`python3 -m manager launch` gives a new one")
SIGN_IN_TOKEN = ("a valid access token is required (the one printed when the server "
                 "started, or AI_TOOLKIT_AUTH): send `Authorization: Bearer TOKEN`, or "
                 "enter it in the page")


@dataclass(frozen=True)
class Policy:
    port: int
    listening: bool = False  # beyond loopback: IP literals and the machine's names too
    allowed_hosts: frozenset[str] = frozenset()  # --allowed-host: these names, any port
    machine_names: frozenset[str] = field(default_factory=frozenset)
    max_body_bytes: int = 64 * 1024 * 1024

    @classmethod
    def for_server(cls, port: int, listening: bool, allowed_hosts: Iterable[str] = (),
                   max_body_bytes: int = 64 * 1024 * 1024) -> Policy:
        names = (parse_host(h) for h in allowed_hosts)  # a port given with a name: dropped
        return cls(port, listening, frozenset(n[0] for n in names if n is not None),
                   machine_names() if listening else frozenset(), max_body_bytes)

    def allows_host(self, host: tuple[str, int | None]) -> bool:
        name, port = host
        if name in self.allowed_hosts:
            return True
        if (port if port is not None else 80) != self.port:
            return False
        if name in LOOPBACK_NAMES:
            return True
        return self.listening and (is_ip_literal(name) or name in self.machine_names)

    def cookie_name(self) -> str:
        # Cookies are shared by every port of a host name: one name per server port.
        return f"aitk-session-{self.port}"


def machine_names() -> frozenset[str]:
    """This machine's own names, as a browser on the LAN may type them."""
    names = set()
    for lookup in (socket.gethostname, socket.getfqdn):
        try:
            found = lookup().strip().lower()
        except OSError:
            continue
        if found:
            names |= {found, f"{found.split('.')[0]}.local"}
    return frozenset(names)


def is_ip_literal(name: str) -> bool:
    try:
        ip_address(name)
    except ValueError:
        return False
    return True


def parse_host(value: str) -> tuple[str, int | None] | None:
    """`name[:port]` or `[v6][:port]` -> (name lowercased, port or None); None if bad."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[1:end], value[end + 1:]
        if rest and not rest.startswith(":"):
            return None
        port_text: str | None = rest[1:] if rest else None
    else:
        name, sep, port_text = value.partition(":")
        if ":" in port_text:
            return None
        port_text = port_text if sep else None
    if not name:
        return None
    if port_text is None:
        return name, None
    if not (port_text.isascii() and port_text.isdigit()) or len(port_text) > 5:
        return None
    return name, int(port_text)


def origin_matches(origin: str, host: tuple[str, int | None]) -> bool:
    """`origin` (scheme://name[:port]) is the origin of a page served under `host`."""
    try:
        parts = urlsplit(origin)
        port = parts.port
    except ValueError:
        return False
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        return False
    port = port or DEFAULT_PORTS[parts.scheme]
    name, host_port = host
    if parts.hostname != name:
        return False
    return port == host_port if host_port is not None else port in DEFAULT_PORTS.values()


def same_origin(headers: Headers, host: tuple[str, int | None]) -> bool | None:
    """Whether a browser says the request comes from a page of this server; None when
    it carries none of the headers a browser sends (a tool such as curl)."""
    if "origin" in headers:
        return origin_matches(headers["origin"], host)
    if "sec-fetch-site" in headers:
        return headers["sec-fetch-site"] == "same-origin"
    if "referer" in headers:
        return origin_matches(headers["referer"], host)
    return None


def bearer(headers: Headers) -> str | None:
    value = headers.get("authorization")
    if value is None:
        return None
    scheme, _, given = value.partition(" ")
    return given.strip() if scheme.lower() == "bearer" else ""


def media_type(headers: Headers) -> str:
    return headers.get("content-type", "").split(";")[0].strip().lower()


class Guard:
    def __init__(self, app: ASGIApp, policy: Policy, keys: Keys) -> None:
        self.app, self.policy, self.keys = app, policy, keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # no websocket route exists; refuse them all
            await send({"type": "websocket.close", "code": 1008})
            return
        api = scope["path"].startswith("/api/") or scope["path"] == "/api"
        send = self._with_headers(send, api)
        answer = self.refusal(scope, api) or self.own_route(scope)
        await (answer or self.app)(scope, receive, send)

    # ---- the checks ---------------------------------------------------------------------
    def refusal(self, scope: Scope, api: bool) -> Response | None:
        """The answer that refuses this request, or None to let it through."""
        headers = Headers(scope=scope)
        path, method = scope["path"], scope["method"]
        if any(ord(c) < 0x20 for c in path) or b"\0" in unquote_to_bytes(
                scope.get("query_string", b"")):
            return self.error(api, 400, "the address holds a control character (NUL)")
        host = parse_host(headers.get("host", ""))
        if host is None or not self.policy.allows_host(host):
            return self.error(api, 421, self.host_hint(headers.get("host", "")))
        declared = headers.get("content-length")
        if declared is not None and not (declared.isascii() and declared.isdigit()):
            return self.error(api, 400, "Content-Length is not a number")
        if declared is not None and int(declared) > self.policy.max_body_bytes:
            return self.error(api, 413, f"the request body is larger than "
                              f"{self.policy.max_body_bytes // 2**20} MiB")
        if method not in SAFE_METHODS:
            if media_type(headers) not in WRITE_TYPES:
                return self.error(api, 403, "a change needs Content-Type: application/json "
                                  "(uploads: application/octet-stream)")
            browser = same_origin(headers, host)
            if browser is False or (browser is None and bearer(headers) is None):
                return self.error(api, 403, "a change must come from this server's own "
                                  "page (its Origin), or from a tool with the secret")
        if api and headers.get("sec-fetch-site") in ("cross-site", "same-site"):
            return self.error(api, 403, "another site's page cannot read this server")
        if api and path != SESSION_PATH and not self.signed_in(headers):
            return self.not_signed_in()
        return None

    def signed_in(self, headers: Headers) -> bool:
        given = bearer(headers)
        if given is not None:  # a tool: a wrong token never falls back to a cookie
            return self.keys.bearer_ok(given)
        cookie = cookie_parser(headers.get("cookie", "")).get(self.policy.cookie_name())
        return self.keys.cookie_ok(cookie)

    def not_signed_in(self) -> Response:
        listening = self.keys.token is not None
        return JSONResponse({"error": SIGN_IN_TOKEN if listening else SIGN_IN_LINK,
                             "sign_in": "token" if listening else "link"}, status_code=401)

    def host_hint(self, given: str) -> str:
        shown = given[:80].encode("ascii", "replace").decode() or "(none)"
        if self.policy.listening:
            return (f"this server does not answer to the name {shown}: restart it with "
                    f"--allowed-host NAME to allow a name (an IP address always works)")
        return (f"this server answers only to 127.0.0.1:{self.policy.port} and "
                f"localhost:{self.policy.port}, not {shown}; restart it with "
                "--allowed-host NAME to allow another name")

    @staticmethod
    def error(api: bool, status: int, message: str) -> Response:
        if api:
            return JSONResponse({"error": message}, status_code=status)
        return PlainTextResponse(f"aitk: {message}\n", status_code=status)

    # ---- signing in ---------------------------------------------------------------------
    def own_route(self, scope: Scope) -> ASGIApp | None:
        """The routes the guard answers itself (it holds the keys); None for the rest."""
        path, method = scope["path"], scope["method"]
        if path.startswith("/auth/") and method == "GET":
            if not self.keys.redeem(path[len("/auth/"):]):
                return self.error(False, 403, "this sign-in link was used already or has "
                                  "expired; `python3 -m manager launch` gives a new one")
            return self.session_response(RedirectResponse("/", status_code=303))
        if path == LINKS_PATH and method == "POST":
            if bearer(Headers(scope=scope)) is None:
                return self.error(True, 403, "new sign-in links are for tools holding the "
                                  "secret (Authorization: Bearer)")
            return JSONResponse({"path": f"/auth/{self.keys.new_link()}"}, status_code=201)
        if path == SESSION_PATH and method == "POST" and self.keys.token is not None:
            return self.token_sign_in
        if path == SESSION_PATH:
            return self.error(True, 404, "sign in with the one-time link (no token is set)")
        return None

    async def token_sign_in(self, scope: Scope, receive: Receive, send: Send) -> None:
        """POST /api/session {"token": ...} with --listen (the page's token box): the
        right token gets the session cookie, as a one-time link does."""
        body = await Request(scope, receive).body()
        try:
            given = json.loads(body).get("token") if len(body) <= 4096 else None
        except (ValueError, AttributeError, RecursionError):
            given = None
        if isinstance(given, str) and self.keys.token_ok(given):
            answer = self.session_response(JSONResponse({"signed_in": True}))
        else:
            answer = JSONResponse({"error": "that is not the access token",
                                   "sign_in": "token"}, status_code=401)
        await answer(scope, receive, send)

    def session_response(self, response: Response) -> Response:
        response.set_cookie(self.policy.cookie_name(), self.keys.session, path="/",
                            httponly=True, samesite="strict")
        response.headers["cache-control"] = "no-store"
        return response

    # ---- every response -----------------------------------------------------------------
    @staticmethod
    def _with_headers(send: Send, api: bool) -> Send:
        extra = [*COMMON_HEADERS, (b"content-security-policy",
                                   (API_CSP if api else PAGE_CSP).encode())]
        names = {name for name, _ in extra}

        async def wrapped(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", [])
                        if k.lower() not in names and not k.lower().startswith(
                            b"access-control-")]  # never any CORS header
                message = {**message, "headers": kept + extra}
            await send(message)

        return wrapped

