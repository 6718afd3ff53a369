"""`python -m aitk_server [--listen] [--port N] [--no-browser] ...`: serve the web UI.

Binds 127.0.0.1:8675, or the next free port (said clearly). `--listen` binds every
interface and requires the token on the API. A second server for the same data folder
does not start: it says where the running one is (exit 0). Ctrl+C (or SIGTERM) stops
the server and asks running jobs to save and stop (they exit 130 and resume later); a
second Ctrl+C stops waiting for them (they still finish their save).

Exit codes: 0 stopped normally (or already running), 1 no free port, 2 bad usage.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
import webbrowser
from pathlib import Path

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


def running_server(data_dir: Path) -> dict | None:
    """The server already serving this data folder, if its process still lives."""
    from aitk_server.runner import pid_alive

    try:
        info = json.loads((data_dir / "server.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(info, dict) and isinstance(info.get("pid"), int) and \
            info["pid"] != os.getpid() and pid_alive(info["pid"]):
        return info
    return None


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


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    from aitk_server import auth
    from aitk_server.app import Settings, create_app

    data_dir = args.data_dir.resolve()
    other = running_server(data_dir)
    if other:
        say(f"already running at {other.get('url')} (pid {other['pid']}); open that "
            "address, or stop it with Ctrl+C in its terminal")
        return 0
    host = args.host or ("0.0.0.0" if args.listen else "127.0.0.1")
    token = None
    if not auth.is_loopback(host):
        token, created = auth.load_or_create(data_dir / "token")
        if created:
            say(f"access token (shown once; stored owner-only in {data_dir / 'token'}): "
                f"{token}")
        else:
            say("access token: " + ("from AI_TOOLKIT_AUTH" if os.environ.get(auth.ENV_VAR)
                                    else f"the one stored in {data_dir / 'token'}"))
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
    settings = Settings.for_checkout(ROOT, data_dir=data_dir, examples_dir=args.examples_dir,
                                     datasets_dir=args.datasets_dir, ui_dir=args.ui_dir,
                                     token=token, **({"db_path": args.db} if args.db else {}))
    info_path = data_dir / "server.json"

    def ready() -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        tmp = info_path.with_name(f".server.json.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), "url": url, "host": host,
                                   "port": port, "started": time.time()}), encoding="utf-8")
        os.replace(tmp, info_path)
        say(f"serving the web UI at {url}" + (" (listening on every interface; the API "
                                              "needs the token)" if token else ""))
        say("press Ctrl+C to stop the server (running jobs save and stop)")
        if not args.no_browser and has_display():
            opened = url + (f"?token={token}" if token else "")
            threading.Timer(0.5, lambda: webbrowser.open(opened)).start()

    app = create_app(settings, on_ready=ready)
    server = make_server(app)
    try:
        server.run(sockets=[sock])
        # A second Ctrl+C or SIGTERM while the jobs save: stop waiting for them.
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        try:
            running = [j.name for j in app.state.api.db.all() if j.state == "running"]
            if running:
                say("asking running jobs to save and stop: " + ", ".join(running) +
                    " (Ctrl+C again stops waiting; they still save)")
            app.state.api.runner.stop_all(settings.stop_timeout_s)
        except KeyboardInterrupt:
            say("not waiting for the jobs; they finish saving on their own")
    finally:
        try:
            if json.loads(info_path.read_text()).get("pid") == os.getpid():
                info_path.unlink()
        except (OSError, ValueError):
            pass
    say("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
