"""`python -m aitk_server` as a real process on an ephemeral 127.0.0.1 port: where it
serves, its secret and sign-in link, a busy port, a second server, a stale record, a
damaged database, an unusable data folder, the token with --listen, live events, Ctrl+C."""

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


def argv_for(tmp: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "aitk_server", "--no-browser", "--data-dir",
            str(tmp / "data"), "--ui-dir", str(tmp / "no-ui"), "--examples-dir",
            str(tmp / "examples"), "--datasets-dir", str(tmp / "datasets"), "--outputs-dir",
            str(tmp / "out"), *args]


class Server:
    def __init__(self, tmp: Path, *args: str, env: dict | None = None) -> None:
        argv = argv_for(tmp, *args)
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
            link = re.search(r"sign in once with (http://\S+)", line)
            if link:  # said right after where it serves
                self.link = link.group(1)
                break
        self.secret = (tmp / "data" / "secret").read_text().strip() if hasattr(
            self, "url") else ""

    def tool(self) -> httpx.Client:
        """A client as this user's own tools call the API: with the secret file."""
        return httpx.Client(base_url=self.url, timeout=60,
                            headers={"Authorization": f"Bearer {self.secret}"})

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
    secret = tmp_path / "data" / "secret"
    if os.name != "nt":
        assert secret.stat().st_mode & 0o777 == 0o600  # other users cannot sign in
    assert httpx.get(server.url + "api/health").status_code == 401
    with server.tool() as tool:
        assert tool.get("api/health").json()["token_required"] is False
        with tool.stream("GET", "api/events") as events:
            first = next(line for line in events.iter_lines() if line.startswith("data:"))
            assert first == "data: []"
    page = httpx.get(server.url)
    assert page.status_code == 503 and "manager sync" in page.text  # not built here
    # No browser here: the one-time link is printed; it signs a browser in once.
    signed = httpx.get(server.link)
    assert signed.status_code == 303 and signed.headers["location"] == "/"
    cookie = signed.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    assert server.secret not in cookie
    assert httpx.get(server.url + "api/jobs", cookies=signed.cookies).json() == []
    assert httpx.get(server.link).status_code == 403  # used: worthless to anyone else
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


def test_a_second_server_says_where_the_first_one_is_with_a_new_link(tmp_path):
    first = Server(tmp_path, "--port", "0")
    try:
        second = subprocess.run(
            [sys.executable, "-m", "aitk_server", "--no-browser", "--port", "0",
             "--data-dir", str(tmp_path / "data")], cwd=REPO, capture_output=True, text=True,
            timeout=120)
        assert second.returncode == 0
        assert f"already running at {first.url}" in second.stderr
        link = re.search(r"sign in once with (http://\S+)", second.stderr).group(1)
        assert link != first.link and httpx.get(link).status_code == 303
    finally:
        first.stop()


def test_a_stale_record_whose_pid_was_reused_does_not_block(tmp_path):
    """issue 21: a killed server's record, its pid now another process's: `launch` said
    "already running" and exited 0. The record names the process by pid and start
    time; a live pid that started at another time is someone else."""
    import json

    from aitk_common import procs

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        (tmp_path / "data").mkdir()
        record = tmp_path / "data" / "server.json"
        identity = procs.identify(other.pid)
        assert identity is not None and identity.started is not None
        for stale in ({"process": {**identity.to_json(), "started": "an earlier start"},
                       "pid": other.pid, "url": "http://127.0.0.1:1/"},
                      {"pid": other.pid, "url": "http://127.0.0.1:1/"}):  # pid only
            record.write_text(json.dumps(stale))
            server = Server(tmp_path, "--port", "0")
            said = server.stop()
            assert "already running" not in said and "serving the web UI" in said, said
    finally:
        other.kill()
        other.wait()


def test_a_damaged_database_is_kept_aside_and_a_new_one_started(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "jobs.sqlite").write_bytes(b"this is not a database" * 100)
    server = Server(tmp_path, "--port", "0")
    try:
        with server.tool() as tool:
            assert tool.get("api/jobs").json() == []
    finally:
        said = server.stop()
    assert "Traceback" not in said
    [kept] = (tmp_path / "data").glob("jobs.sqlite.corrupt-*")
    assert kept.read_bytes().startswith(b"this is not a database")
    assert f"kept it as {kept}" in said


@pytest.mark.parametrize("where", ["data dir", "database"])
def test_an_unusable_data_folder_is_one_line_and_exit_1(tmp_path, where):
    """A read-only checkout, a data folder that cannot be made or written: one line
    naming it, exit 1, no traceback (the same path as the blocker here: a file where
    the folder should be; root ignores permission bits)."""
    blocker = tmp_path / "a file"
    blocker.write_text("")
    args = ["--data-dir", str(blocker / "data")] if where == "data dir" else [
        "--db", str(blocker / "jobs.sqlite")]
    done = subprocess.run(argv_for(tmp_path, "--port", "0", *args), cwd=REPO,
                          capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "cannot use the data folder" in done.stderr and str(blocker) in done.stderr


def test_listen_needs_the_token_printed_once(tmp_path):
    env = {"AI_TOOLKIT_AUTH": ""}
    server = Server(tmp_path, "--listen", "--port", "0", env=env)
    try:
        said = "".join(server.lines)
        token = re.search(r"access token \(shown once.*\): (\S+)", said).group(1)
        local = server.url
        assert httpx.get(local + "api/jobs").status_code == 401
        assert httpx.get(local + "api/jobs", headers={"Authorization": f"Bearer "
                                                      f"{server.secret}"}).json() == []
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


@pytest.mark.slow
def test_ctrl_c_and_sigterm_ask_running_jobs_to_save_and_stop(tmp_path, job_yaml):
    """The job has far more steps than it can run here: it is mid-training when the
    server is told to stop, whatever the machine's speed."""
    import json
    import time

    server = Server(tmp_path, "--port", "0", env={"AITK_CACHE_DIR": str(tmp_path / "c")})
    try:
        tool = server.tool()
        job = tool.post("api/jobs", json={"yaml": job_yaml("long", 100000)}).json()
        tool.post(f"api/jobs/{job['id']}/start", json={})
        deadline = time.monotonic() + 300
        while (tool.get(f"api/jobs/{job['id']}").json()["progress"]["step"] or 0) < 1:
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
