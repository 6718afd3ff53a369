"""Fixtures for the tools tests: a loopback HTTP server that can misbehave, archives
built here with stand-in binaries, a temporary checkout, and fast retries.

All traffic stays on 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from manager import download
from manager.paths import ROOT, Paths
from tests.manager.conftest import ManagerCli, Ran


@dataclass
class Route:
    body: bytes
    # "ok" | "truncate" (always cut short) | "drop_once" (cut short once, then fine)
    # | "stall" (send a little, then hang) | "ignore_range" (always 200 with the whole body)
    # | "flaky" (503 `fail_times` times, then fine) | "no_length" (no Content-Length)
    behaviour: str = "ok"
    status: int = 200
    fail_times: int = 0
    hits: int = 0


@dataclass
class Server:
    base: str
    routes: dict[str, Route] = field(default_factory=dict)
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def add(self, path: str, body: bytes, behaviour: str = "ok", **kw: int) -> str:
        self.routes["/" + path.lstrip("/")] = Route(body, behaviour, **kw)
        return f"{self.base}/{path.lstrip('/')}"

    def url(self, path: str) -> str:
        return f"{self.base}/{path.lstrip('/')}"

    def hits(self, path: str) -> list[dict[str, str]]:
        return [h for p, h in self.requests if p == "/" + path.lstrip("/")]


class _Handler(BaseHTTPRequestHandler):
    server_state: Server  # set on the class made per server

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        return

    def do_GET(self) -> None:  # noqa: N802
        state = self.server_state
        state.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
        route = state.routes.get(self.path)
        if route is None:
            self._plain(404, b"not found")
            return
        route.hits += 1
        if route.behaviour == "flaky" and route.hits <= route.fail_times:
            self._plain(503, b"busy")
            return
        body, start = route.body, 0
        etag = '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
        wanted = self.headers.get("Range")
        if_range = self.headers.get("If-Range")
        if wanted and route.behaviour != "ignore_range" and if_range in (None, etag):
            start = int(wanted.split("=", 1)[1].split("-", 1)[0])
            if start >= len(body):
                self._plain(416, b"")
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            self.send_response(route.status)
        rest = body[start:]
        if route.behaviour != "no_length":
            self.send_header("Content-Length", str(len(rest)))
        self.send_header("ETag", etag)
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        cut_short = route.behaviour == "truncate" or (
            route.behaviour == "drop_once" and route.hits == 1)
        if cut_short:
            self.wfile.write(rest[: len(rest) // 2])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        if route.behaviour == "stall":
            self.wfile.write(rest[:10])
            self.wfile.flush()
            state.stop.wait(10)  # released when the test ends
            self.close_connection = True
            return
        self.wfile.write(rest)
        if route.behaviour == "no_length":
            self.close_connection = True

    def _plain(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def server() -> Iterator[Server]:
    state = Server(base="")
    handler = type("Handler", (_Handler,), {"server_state": state})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    state.base = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield state
    finally:
        state.stop.set()
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    # Short read timeout so the stall test is quick; no proxies from the environment.
    with httpx.Client(timeout=httpx.Timeout(5.0, read=0.5), trust_env=False) as c:
        yield c


@pytest.fixture
def fast_retry() -> download.RetryPolicy:
    # A one-second stall limit: the stalled-server cases end in about a second.
    return download.RetryPolicy(attempts=3, base_delay=0.01, sleep=lambda _s: None, stall=1.0)


class Quiet:
    """A Reporter that records what it was told."""

    def __init__(self) -> None:
        self.notes: list[str] = []
        self.starts: list[tuple[str, int | None, int]] = []
        self.advanced = 0

    def start(self, label: str, total: int | None, done: int) -> None:
        self.starts.append((label, total, done))

    def advance(self, n: int) -> None:
        self.advanced += n

    def finish(self) -> None:
        pass

    def note(self, message: str) -> None:
        self.notes.append(message)


@pytest.fixture
def quiet() -> Quiet:
    return Quiet()


@pytest.fixture
def checkout(tmp_path: Path) -> Paths:
    root = tmp_path / "checkout"
    root.mkdir()
    (root / "README.md").write_text("the user's checkout\n")
    return Paths(root)


@pytest.fixture
def tools_cli(manager_cli: ManagerCli) -> Callable[..., Ran]:
    """`python3 -m manager tools ARGS` for `checkout`, with PATH as given (in-process)."""
    def run(checkout: Paths, path: str, *args: str, extra: dict[str, str] | None = None
            ) -> Ran:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AITK_")}
        env.update(AITK_ROOT=str(checkout.root), PATH=path, NO_COLOR="1",
                   NO_PROXY="127.0.0.1", **(extra or {}))
        return manager_cli("tools", *args, env=env, cwd=ROOT)

    return run
