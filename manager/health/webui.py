"""The web UI: is its front end built from the current sources, and is its port free
(or held by this checkout's own running server)? The server's record is
aitk_server.record's (stdlib only), which names the server by pid and start time, so a
dead server whose pid was reused is not taken for a running one."""

from __future__ import annotations

import socket
from collections.abc import Sequence

from manager.health.check import FIX_SYNC, Check, Probe, ok, warn
from manager.paths import Paths

DEFAULT_PORT = 8675
HOST = "127.0.0.1"


def judge_build(built: bool, detail: str) -> Check:
    return ok("webui.build", detail) if built else warn(
        "webui.build", f"{detail}; `launch` shows a page saying so", FIX_SYNC)


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def judge_port(free: bool, ours: dict | None, port: int = DEFAULT_PORT) -> Check:
    if ours:
        return ok("webui.port", f"this checkout's web UI is running at {ours.get('url')} "
                  f"(pid {ours.get('pid')})")
    if free:
        return ok("webui.port", f"{HOST}:{port} is free")
    return warn("webui.port", f"{HOST}:{port} is in use by another program; `launch` will "
                "use the next free port", f"free port {port}, or pass `--port N` to launch")


def running_server(paths: Paths) -> dict | None:
    from aitk_server import record

    info = record.read(paths.root / ".aitk-ui")
    return info if info is not None and record.alive(info) else None


def probe(paths: Paths) -> Sequence[Check]:
    from manager import ui_build

    built, detail = ui_build.state_line(ui_build.gather(paths))
    ours = running_server(paths)
    port = int(ours.get("port", DEFAULT_PORT)) if ours else DEFAULT_PORT
    return [judge_build(built, detail), judge_port(port_free(HOST, port), ours, port)]


def probes(paths: Paths) -> list[Probe]:
    return [Probe(("webui.build", "webui.port"), lambda: probe(paths), 10.0)]
