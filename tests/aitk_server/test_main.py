"""`python -m aitk_server` as a real process on an ephemeral 127.0.0.1 port: where it
serves, a busy port, a second server, the token with --listen, live events, Ctrl+C."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.aitk_server.conftest import REPO


class Server:
    def __init__(self, tmp: Path, *args: str, env: dict | None = None) -> None:
        argv = [sys.executable, "-m", "aitk_server", "--no-browser", "--data-dir",
                str(tmp / "data"), "--ui-dir", str(tmp / "no-ui"), "--examples-dir",
                str(tmp / "examples"), "--datasets-dir", str(tmp / "datasets"), *args]
        self.proc = subprocess.Popen(argv, cwd=REPO, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})},
                                     stdin=subprocess.DEVNULL)
        self.lines: list[str] = []
        while True:  # the server says where it serves before it accepts requests
            line = self.proc.stderr.readline()
            if not line:
                break
            self.lines.append(line)
            found = re.search(r"serving the web UI at (http://\S+)", line)
            if found:
                self.url = found.group(1)
                break

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGINT)
        rest = self.proc.stderr.read()
        assert self.proc.wait(timeout=60) == 0
        return "".join(self.lines) + rest


def port_of(url: str) -> int:
    return int(url.rstrip("/").rsplit(":", 1)[1])


def test_serves_says_where_and_stops_on_ctrl_c(tmp_path):
    server = Server(tmp_path, "--port", "0")
    assert server.url.startswith("http://127.0.0.1:")
    assert httpx.get(server.url + "api/health").json()["token_required"] is False
    page = httpx.get(server.url)
    assert page.status_code == 503 and "manager sync" in page.text  # not built here
    with httpx.stream("GET", server.url + "api/events", timeout=30) as events:
        first = next(line for line in events.iter_lines() if line.startswith("data:"))
        assert first == "data: []"
    out = server.stop()
    assert "stopped" in out and not (tmp_path / "data" / "server.json").exists()


def test_a_busy_port_moves_to_the_next_and_says_so(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        server = Server(tmp_path, "--port", str(port))
        try:
            said = "".join(server.lines)
            assert f"port {port} is busy; using port" in said
            assert port_of(server.url) != port
        finally:
            server.stop()


def test_a_second_server_says_where_the_first_one_is(tmp_path):
    first = Server(tmp_path, "--port", "0")
    try:
        second = subprocess.run(
            [sys.executable, "-m", "aitk_server", "--no-browser", "--port", "0",
             "--data-dir", str(tmp_path / "data")], cwd=REPO, capture_output=True, text=True,
            timeout=120)
        assert second.returncode == 0
        assert f"already running at {first.url}" in second.stderr
    finally:
        first.stop()


def test_listen_needs_the_token_printed_once(tmp_path):
    env = {"AI_TOOLKIT_AUTH": ""}
    server = Server(tmp_path, "--listen", "--port", "0", env=env)
    try:
        said = "".join(server.lines)
        token = re.search(r"access token \(shown once.*\): (\S+)", said).group(1)
        local = server.url
        assert httpx.get(local + "api/jobs").status_code == 401
        assert httpx.get(local + "api/jobs", headers={"Authorization": f"Bearer {token}"}
                         ).json() == []
    finally:
        server.stop()
    again = Server(tmp_path, "--listen", "--port", "0", env=env)
    try:
        assert token not in "".join(again.lines)
        assert "the one stored in" in "".join(again.lines)
    finally:
        again.stop()


@pytest.mark.parametrize("argv", [["--port", "x"], ["--bogus"]])
def test_bad_arguments_exit_2(argv):
    done = subprocess.run([sys.executable, "-m", "aitk_server", *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr


def test_ctrl_c_and_sigterm_ask_running_jobs_to_save_and_stop(tmp_path, job_yaml):
    """The job has far more steps than it can run here: it is mid-training when the
    server is told to stop, whatever the machine's speed."""
    import json
    import time

    server = Server(tmp_path, "--port", "0", env={"AITK_CACHE_DIR": str(tmp_path / "c")})
    try:
        job = httpx.post(server.url + "api/jobs", json={"yaml": job_yaml("long", 100000)},
                         timeout=60).json()
        httpx.post(server.url + f"api/jobs/{job['id']}/start", timeout=60)
        deadline = time.monotonic() + 300
        while (httpx.get(server.url + f"api/jobs/{job['id']}", timeout=60).json()
               ["progress"]["step"] or 0) < 1:
            assert time.monotonic() < deadline, "the job never started training"
            time.sleep(0.2)
    finally:
        server.proc.send_signal(signal.SIGTERM)
        said = "".join(server.lines) + server.proc.stderr.read()
        assert server.proc.wait(timeout=300) == 0, said
    assert "asking running jobs to save and stop: long" in said
    status = json.loads((tmp_path / "data" / "jobs" / str(job["id"]) / "status.json")
                        .read_text())
    assert (status["phase"], status["exit_code"]) == ("stopped", 130)
    assert not (tmp_path / "data" / "server.json").exists()
