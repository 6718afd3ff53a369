"""`python -m aitk_server [--listen] [--port N] [--no-browser] ...`: serve the web UI.

Binds 127.0.0.1:8675, or the next free port (said clearly). Every start makes a new
secret (stored owner-only in the data folder) and opens the browser on a one-time
sign-in link (printed instead when no browser opens). `--listen` binds every interface
and also accepts the access token. A second server for the same data folder does not
start: it says where the running one is and hands out a new sign-in link (exit 0).
Ctrl+C (or SIGTERM) stops the server and asks running jobs to save and stop (they exit
130 and resume later); a second Ctrl+C stops waiting for them (they still save).

Exit codes: 0 stopped normally (or already running), 1 no free port or an unusable
data folder or database (one line says which), 2 bad usage.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import sqlite3
import sys
import threading
import urllib.error
import urllib.request
import webbrowser
from pathlib import Path

from aitk_common.jobstates import JobState
from aitk_server import record

DEFAULT_PORT = 8675
PORTS_TRIED = 20
ROOT = Path(__file__).resolve().parents[1]


def say(message: str) -> None:
    print(f"aitk ui: {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m aitk_server",
                                description="Serve the aitk web UI.")
    p.add_argument("--listen", action="store_true",
                   help="listen on every interface (LAN); requires the token")
    p.add_argument("--host", default=None, help="bind this address (default 127.0.0.1)")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="also answer to this host name (a proxy, an alias); repeatable")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"first port to try (default {DEFAULT_PORT}; 0 = any free port)")
    p.add_argument("--no-browser", action="store_true", help="do not open a browser")
    p.add_argument("--data-dir", type=Path, default=ROOT / ".aitk-ui",
                   help="jobs' folders, the token and server.json (default .aitk-ui/)")
    p.add_argument("--db", type=Path, default=None,
                   help="the jobs database (default DATA_DIR/jobs.sqlite)")
    p.add_argument("--examples-dir", type=Path, default=ROOT / "config" / "examples")
    p.add_argument("--datasets-dir", type=Path, default=ROOT / "datasets")
    p.add_argument("--ui-dir", type=Path, default=ROOT / "ui" / "dist")
    p.add_argument("--outputs-dir", type=Path, default=ROOT / "output",
                   help="jobs made in the UI write only under this folder (default output/)")
    return p.parse_args(argv)


def bind(host: str, first: int) -> socket.socket | None:
    ports = [0] if first == 0 else range(first, first + PORTS_TRIED)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for port in ports:
        sock = socket.socket(family, socket.SOCK_STREAM)
        if os.name != "nt":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            sock.close()
            continue
        sock.listen(128)
        return sock
    return None


def new_link(info: dict, data_dir: Path) -> str | None:
    """A one-time sign-in link from the server already running (asked with the secret
    its data folder holds); None when it cannot give one."""
    from aitk_server import auth

    secret, url = auth.read_secret(data_dir), info.get("url")
    if not secret or not isinstance(url, str):
        return None
    request = urllib.request.Request(url + "api/links", data=b"{}", method="POST", headers={
        "Authorization": f"Bearer {secret}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310 - loopback
            path = json.loads(answer.read(4096)).get("path")
    except (OSError, ValueError, AttributeError, urllib.error.URLError):
        return None
    return url + path.lstrip("/") if isinstance(path, str) else None


def make_server(app: object) -> object:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn re-raises the Ctrl+C or SIGTERM it handled once it has shut down; a
        re-raised SIGTERM would end this process before the running jobs are asked to
        save. Here both just stop the server; the code after run() does the rest."""

        @contextlib.contextmanager
        def capture_signals(self):  # type: ignore[override]
            handled = [signal.SIGINT, signal.SIGTERM] + (
                [signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])
            old = {s: signal.signal(s, self.handle_exit) for s in handled}
            try:
                yield
            finally:
                for sig, handler in old.items():
                    signal.signal(sig, handler)

    return Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=3))


def has_display() -> bool:
    if sys.platform in ("darwin", "win32"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def open_or_print(link: str, browser: bool) -> None:
    """Hand a one-time sign-in link to this user's browser, or to this user."""
    if browser and has_display():
        threading.Timer(0.5, lambda: webbrowser.open(link)).start()
        say("opening the page in your browser (signed in through a one-time link)")
    else:
        say(f"sign in once with {link} (a one-time link; `python3 -m manager launch` "
            "gives a new one)")


def unusable(exc: OSError | sqlite3.Error, data_dir: Path) -> int:
    reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    where = getattr(exc, "filename", None) or data_dir
    say(f"cannot use the data folder: {where}: {reason}; keep the UI's jobs in a writable "
        "folder with `python -m aitk_server --data-dir DIR`")
    return 1


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    logging.basicConfig(format="aitk ui: %(message)s", level=logging.WARNING)
    data_dir = args.data_dir.resolve()
    other = record.running(data_dir)
    if other:
        say(f"already running at {other.get('url')} (pid {other['pid']}); stop it with "
            "Ctrl+C in its terminal")
        link = new_link(other, data_dir)
        if link is not None:
            open_or_print(link, not args.no_browser)
        return 0
    return serve(args, data_dir)


def serve(args: argparse.Namespace, data_dir: Path) -> int:
    from aitk_server import auth
    from aitk_server.app import Settings, create_app
    from aitk_server.db import Database

    host = args.host or ("0.0.0.0" if args.listen else "127.0.0.1")
    try:  # an unwritable or read-only data folder stops us here, in one line
        data_dir.mkdir(parents=True, exist_ok=True)
        secret = auth.write_secret(data_dir)
        token, created = auth.load_or_create(data_dir / auth.TOKEN_FILE) \
            if not auth.is_loopback(host) else (None, False)
        checked = Database(args.db or data_dir / "jobs.sqlite")  # a damaged one: set aside
    except (OSError, sqlite3.Error) as exc:
        return unusable(exc, data_dir)
    if checked.set_aside is not None:
        say(f"warning: the jobs database was damaged; kept it as {checked.set_aside} and "
            "started a new one")
    if token is not None:
        if created:
            say(f"access token (shown once; stored owner-only in "
                f"{data_dir / auth.TOKEN_FILE}): {token}")
        else:
            say("access token: " + ("from AI_TOOLKIT_AUTH" if os.environ.get(auth.ENV_VAR)
                                    else f"the one stored in {data_dir / auth.TOKEN_FILE}"))
    sock = bind(host, args.port)
    if sock is None:
        say(f"no free port from {args.port} to {args.port + PORTS_TRIED - 1} on {host}; "
            "pass --port N")
        return 1
    port = sock.getsockname()[1]
    if args.port and port != args.port:
        say(f"port {args.port} is busy; using port {port} instead")
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    url = f"http://{shown}:{port}/"
    settings = Settings.for_checkout(
        ROOT, data_dir=data_dir, examples_dir=args.examples_dir,
        datasets_dir=args.datasets_dir, ui_dir=args.ui_dir,
        outputs_dir=args.outputs_dir.resolve(), port=port, token=token, secret=secret,
        allowed_hosts=tuple(args.allowed_host), **({"db_path": args.db} if args.db else {}))

    def ready() -> None:
        record.write(data_dir, url, host, port)
        say(f"serving the web UI at {url}" + (" (listening on every interface; other "
                                              "machines need the token)" if token else ""))
        say("press Ctrl+C to stop the server (running jobs save and stop)")
        open_or_print(f"{url}auth/{app.state.keys.new_link()}", not args.no_browser)

    try:
        app = create_app(settings, on_ready=ready)
    except (OSError, sqlite3.Error) as exc:
        return unusable(exc, data_dir)
    server = make_server(app)
    try:
        server.run(sockets=[sock])
        # A second Ctrl+C or SIGTERM while the jobs save: stop waiting for them.
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        try:
            running = [j.name for j in app.state.api.db.all() if j.state == JobState.RUNNING]
            if running:
                say("asking running jobs to save and stop: " + ", ".join(running) +
                    " (Ctrl+C again stops waiting; they still save)")
            app.state.api.runner.stop_all(settings.stop_timeout_s)
        except KeyboardInterrupt:
            say("not waiting for the jobs; they finish saving on their own")
    finally:
        record.remove_if_ours(data_dir)
    say("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
