"""Each attack of issue 21 against a real uvicorn on 127.0.0.1 (one server for the
module), with plain HTTP clients that forge what a hostile page or another user can:
Host, Origin, content types, no credentials. Every test here failed before the guard.

The trainer is a stand-in that sleeps without handling SIGTERM (a trainer stopped before
it is ready to save); no test here starts run.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from aitk_server.app import Settings, create_app
from tests.aitk_server.conftest import (
    REPO,
    SECRET,
    aitk_lora,
    aitk_png,
    free_socket,
    short_job,
    uvicorn_serving,
)

# It answers `--check` (the preflight of every create) and `--help` at once, as run.py.
SLEEPER = "import sys, time\nif not any(a.startswith('--') for a in sys.argv):\n" \
    "    time.sleep(300)\n"
EVIL = "http://evil.example"


@dataclass
class Served:
    url: str
    port: int
    settings: Settings
    app: object
    tmp: Path

    @property
    def origin(self) -> str:
        return self.url.rstrip("/")

    def tool(self) -> httpx.Client:
        """This user's own tool: the secret file's content as a bearer token."""
        return httpx.Client(base_url=self.url, timeout=60,
                            headers={"Authorization": f"Bearer {SECRET}"})

    @contextlib.contextmanager
    def browser(self, origin: str | None = None) -> Iterator[httpx.Client]:
        """A browser signed in the way the server signs one in (a one-time link); its
        requests come from a page of `origin` (default: the server's own page)."""
        with self.tool() as tool:
            link = tool.post("api/links", json={}).json()["path"]
        with httpx.Client(base_url=self.url, timeout=60,
                          headers={"Origin": origin or self.origin}) as client:
            assert client.get(link).status_code == 303
            yield client

    def config(self, name: str, **process: object) -> str:
        data = short_job(name, self.settings.outputs_dir, self.tmp / "model")
        data["config"]["process"][0].update(process)
        return yaml.safe_dump(data)

    def create(self, name: str, **process: object) -> dict:
        with self.tool() as tool:
            r = tool.post("api/jobs", json={"yaml": self.config(name, **process)})
        assert r.status_code == 201, r.text
        return r.json()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("guard server")  # a path with a space
    (tmp / "model").mkdir()
    for folder in ("datasets", "examples", "outputs", "ui"):
        (tmp / folder).mkdir()
    (tmp / "ui" / "index.html").write_text("<!doctype html><title>aitk</title>")
    (tmp / "trainer.py").write_text(SLEEPER)
    sock = free_socket()
    port = sock.getsockname()[1]
    settings = Settings.for_checkout(REPO, data_dir=tmp / "data", datasets_dir=tmp /
                                     "datasets", examples_dir=tmp / "examples",
                                     ui_dir=tmp / "ui", outputs_dir=tmp / "outputs",
                                     trainer=tmp / "trainer.py", monitor_interval_s=0.2,
                                     port=port, secret=SECRET)
    app = create_app(settings)
    with uvicorn_serving(app, sock) as url:
        yield Served(url, port, settings, app, tmp)


def no_cors(response: httpx.Response) -> None:
    assert not [h for h in response.headers if h.lower().startswith("access-control-")]


def one_line(response: httpx.Response) -> str:
    message = response.json()["error"]
    assert "\n" not in message and "Traceback" not in response.text
    return message


# ---- 1. DNS rebinding -----------------------------------------------------------------
def test_another_host_name_is_refused_dns_rebinding(served):
    """A page of evil.example whose name re-resolves to 127.0.0.1 sends its own Host."""
    with served.tool() as tool:
        for host in (f"evil.example:{served.port}", "evil.example", f"127.0.0.1:{served.port + 1}",
                     f"127.0.0.1.nip.io:{served.port}", f"localhost.:{served.port}"):
            r = tool.get("api/jobs", headers={"Host": host})
            assert r.status_code == 421, host
            assert "--allowed-host NAME" in one_line(r)
            page = httpx.get(served.url, headers={"Host": host})
            assert page.status_code == 421 and "--allowed-host" in page.text
        for host in (f"127.0.0.1:{served.port}", f"localhost:{served.port}",
                     f"LOCALHOST:{served.port}"):
            assert tool.get("api/jobs", headers={"Host": host}).status_code == 200, host


def test_allowed_host_names_with_listen_and_allowed_host(served):
    from aitk_server.guard import Policy, parse_host

    loopback = Policy.for_server(8675, listening=False, allowed_hosts=["Studio.LAN:8443"])
    listening = Policy.for_server(8675, listening=True)
    assert loopback.allows_host(("studio.lan", 443))  # a named proxy: any port
    assert not loopback.allows_host(("192.168.1.5", 8675))
    assert listening.allows_host(("192.168.1.5", 8675)) and listening.allows_host(
        ("fe80::1", 8675))  # an address is no other site's name
    assert not listening.allows_host(("evil.example", 8675))
    assert parse_host("[::1]:8675") == ("::1", 8675) and parse_host("a:b:c") is None
    assert parse_host("x:８６７５") is None  # fullwidth digits are no port


# ---- the secret -----------------------------------------------------------------------
def test_every_api_call_needs_the_secret_or_the_session(served):
    """Another user on this machine reaches 127.0.0.1 too, with any headers."""
    for headers in ({}, {"Authorization": "Bearer guessed"}, {"Authorization": "Basic x"},
                    {"Cookie": f"aitk-session-{served.port}=guessed"}):
        r = httpx.get(served.url + "api/jobs", headers=headers)
        assert r.status_code == 401 and r.json()["sign_in"] == "link", headers
    with served.browser() as browser:
        assert browser.get("api/jobs").status_code == 200
        cookie = browser.cookies.get(f"aitk-session-{served.port}")
        assert cookie and SECRET not in cookie
    with served.tool() as tool:
        link = tool.post("api/links", json={}).json()["path"]
    assert httpx.get(served.url + link.lstrip("/")).status_code == 303
    assert httpx.get(served.url + link.lstrip("/")).status_code == 403  # one use only
    with served.browser() as browser:  # a session cannot make links: tools only
        assert browser.post("api/links", json={}).status_code == 403


# ---- 2. reading any file through a job ------------------------------------------------
def test_a_job_cannot_read_or_write_outside_the_outputs_root(served):
    """`training_folder: /`, name `etc`, then GET files/passwd was /etc/passwd."""
    with served.tool() as tool:
        for folder in ("/", str(served.tmp), "../../", str(served.tmp / "outputs" / "..")):
            r = tool.post("api/jobs", json={"yaml": served.config("etc",
                                                                  training_folder=folder)})
            assert r.status_code == 422, (folder, r.text)
            assert [e["path"] for e in r.json()["errors"]] == [
                "config.process[0].training_folder"]
        link = served.tmp / "outputs" / "escape"
        link.symlink_to("/")
        r = tool.post("api/jobs", json={"yaml": served.config("etc", training_folder=str(
            link))})
        assert r.status_code == 422
        r = tool.post("api/jobs", json={"yaml": served.config(
            "built", model={"arch": "example", "name_or_path": str(served.tmp / "new-model"),
                            "create_if_missing": True})})
        assert r.status_code == 422 and r.json()["errors"][0]["path"] == \
            "config.process[0].model.name_or_path"
        # A job recorded before this check (a database from an older server): the file
        # route still serves only what the trainer wrote.
        old = served.app.state.api.db.create("etc", served.config("etc"), "/etc")
        for path in ("passwd", "hostname", "../etc/passwd"):
            r = tool.get(f"api/jobs/{old.id}/files/{path}")
            assert r.status_code == 404 and "root:" not in r.text, path


# ---- 3. cross-site request forgery ----------------------------------------------------
def test_cross_site_writes_are_refused(served):
    """A page on another origin: "simple" POSTs (text/plain, a form) need no preflight,
    and start/stop/queue needed no body. The user's browser sends its cookie along."""
    job = served.create("csrf_target")
    text = served.config("forged")
    with served.browser(origin=EVIL) as evil, served.browser() as page:
        attempts = [
            evil.post("api/jobs", content=json.dumps({"yaml": text}),
                      headers={"Content-Type": "text/plain"}),
            evil.post("api/jobs", data={"yaml": text}),  # a plain form
            evil.post("api/jobs", json={"yaml": text}),  # JSON, but from evil's page
            evil.post(f"api/jobs/{job['id']}/start"),
            evil.post(f"api/jobs/{job['id']}/resume"),
            evil.post(f"api/jobs/{job['id']}/stop"),
            evil.post("api/queue", content=b'{"ids": [1]}', headers={
                "Content-Type": "text/plain"}),
            evil.request("DELETE", f"api/jobs/{job['id']}", json={}),
            evil.post(f"api/jobs/{job['id']}/start", json={},
                      headers={"Origin": "null"}),  # a sandboxed frame
            page.post("api/jobs", content=json.dumps({"yaml": text}),
                      headers={"Content-Type": "text/plain"}),  # no form sends JSON
            page.post("api/jobs", json={"yaml": text}, headers={"Origin": "",
                                                                "Sec-Fetch-Site": "cross-site"}),
        ]
        for r in attempts:
            assert r.status_code == 403, (r.request.method, r.request.url, r.text)
            no_cors(r)
        # Without any Origin, a cookie alone never writes (a tool sends the secret).
        bare = httpx.Client(base_url=served.url, cookies=page.cookies, timeout=60)
        assert bare.post(f"api/jobs/{job['id']}/start", json={}).status_code == 403
        # Cross-site reads: refused, and never a CORS header that would expose them.
        r = evil.get("api/jobs", headers={"Sec-Fetch-Site": "cross-site"})
        assert r.status_code == 403
        r = evil.options("api/jobs", headers={"Access-Control-Request-Method": "POST"})
        no_cors(r)
        # The page itself, as the browser sends it, works.
        r = page.post("api/jobs", json={"yaml": served.config("legit")})
        assert r.status_code == 201, r.text
        no_cors(r)
    with served.tool() as tool:
        names = [j["name"] for j in tool.get("api/jobs").json()]
        assert "forged" not in names and tool.get(f"api/jobs/{job['id']}").json()[
            "state"] == "created"


def test_reordering_the_queue_is_behind_the_guard(served):
    """POST /api/queue/order as each attacker: another site's page (with the user's
    cookie), another user without the secret, a rebinding page's Host."""
    body = json.dumps({"ids": []})
    with served.browser(origin=EVIL) as evil:
        for r in (evil.post("api/queue/order", content=body,
                            headers={"Content-Type": "application/json"}),
                  evil.post("api/queue/order", content=body,
                            headers={"Content-Type": "text/plain"})):
            assert r.status_code == 403, r.text
            no_cors(r)
    for headers in ({}, {"Authorization": "Bearer guessed"}):
        r = httpx.post(served.url + "api/queue/order", content=body, headers={
            "Content-Type": "application/json", **headers})
        assert r.status_code in (401, 403), r.text  # no Origin, no secret: refused
    with served.tool() as tool:
        r = tool.post("api/queue/order", json={"ids": []},
                      headers={"Host": f"evil.example:{served.port}"})
        assert r.status_code == 421
        assert tool.post("api/queue/order", json={"ids": []}).json() == []
    with served.browser() as page:  # the page itself, as the browser sends it
        assert page.post("api/queue/order", json={"ids": []}).status_code == 200


# ---- 4. HTML served as a page ---------------------------------------------------------
def test_files_are_served_only_as_the_trainer_wrote_them_never_as_html(served):
    job = served.create("html_job")
    out = Path(job["out_dir"])
    (out / "samples").mkdir(parents=True)
    script = b"<html><script>fetch('/api/jobs')</script></html>"
    (out / "page.html").write_bytes(script)
    (out / "notes.txt").write_text("the user's notes")
    (out / "samples" / "000000001_0.png").write_bytes(script)  # a sample name, not ours
    png = aitk_png(out / "samples" / "000000002_0.png")
    lora = aitk_lora(out / "html_job.safetensors", 1.0)
    base = f"api/jobs/{job['id']}/files"
    with served.tool() as tool:
        for path in ("page.html", "notes.txt", "samples/000000001_0.png", "samples",
                     "page.html%00.png"):
            r = tool.get(f"{base}/{path}")
            assert r.status_code in (400, 404) and b"<script>" not in r.content, path
        r = tool.get(f"{base}/samples/000000002_0.png")
        assert r.content == png and r.headers["content-type"] == "image/png"
        assert r.headers["content-disposition"].startswith("inline")
        assert r.headers["x-content-type-options"] == "nosniff"
        r = tool.get(f"{base}/html_job.safetensors")
        assert r.content == lora and r.headers["content-type"] == "application/octet-stream"
        assert r.headers["content-disposition"].startswith("attachment")
        assert "sandbox" in r.headers["content-security-policy"]


def test_the_page_has_a_content_security_policy(served):
    r = httpx.get(served.url)
    assert r.status_code == 200
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["x-frame-options"] == "DENY"


# ---- 5. the server's environment ------------------------------------------------------
def test_a_config_never_reads_the_servers_environment(served, monkeypatch):
    """`${HF_TOKEN}` was filled in from the server's environment and echoed in the 422."""
    monkeypatch.setenv("HF_TOKEN", "hf_the_users_real_token")
    data = yaml.safe_load(served.config("leak"))
    proc = data["config"]["process"][0]
    proc["train"]["steps"] = "${HF_TOKEN}"
    proc["trigger_word"] = "${HF_TOKEN}"
    with served.tool() as tool:
        r = tool.post("api/jobs", json={"yaml": yaml.safe_dump(data)})
    assert r.status_code == 422
    assert "hf_the_users_real_token" not in r.text
    assert sorted(e["path"] for e in r.json()["errors"]) == [
        "config.process[0].train.steps", "config.process[0].trigger_word"]
    assert all("${...}" in e["message"] for e in r.json()["errors"])


# ---- 6. two starts at once ------------------------------------------------------------
def test_two_starts_at_the_same_moment_start_one_trainer(served):
    """Both were accepted: the second queued the running job, which then ran twice."""
    job = served.create("twice")
    barrier = threading.Barrier(2)
    codes: list[int] = []

    def start() -> None:
        with served.tool() as tool:
            barrier.wait()
            codes.append(tool.post(f"api/jobs/{job['id']}/start", json={}).status_code)

    threads = [threading.Thread(target=start) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(codes) == [200, 409]
    with served.tool() as tool:
        time.sleep(1.0)  # a few monitor rounds: a second trainer would start here
        detail = tool.get(f"api/jobs/{job['id']}").json()
        assert detail["state"] == "running" and "start" not in detail["actions"]
        started = [e for e in detail["history"] if e["event"].startswith("started")]
        assert len(started) == 1
        assert tool.post(f"api/jobs/{job['id']}/start", json={}).status_code == 409
        tool.post(f"api/jobs/{job['id']}/stop", json={})
        wait_until(lambda: not tool.get(f"api/jobs/{job['id']}").json()["active"])


def test_the_database_allows_one_start(served, tmp_path):
    from aitk_common.jobstates import STARTABLE
    from aitk_server.db import Database

    db = Database(tmp_path / "jobs.sqlite")
    job = db.create("x", "yaml", str(tmp_path))
    won = [db.transition(job.id, STARTABLE, "starting", state="running") for _ in range(2)]
    assert won == [True, False]


# ---- 7. the monitor -------------------------------------------------------------------
def test_the_monitor_survives_the_database_missing_for_a_while(served):
    """One database error ended the monitor: finished jobs stayed `running`."""
    db_path = served.settings.db_path
    away = db_path.with_name("moved away")
    os.replace(db_path, away)
    try:
        time.sleep(3)
        with served.tool() as tool:
            r = tool.get("api/jobs")
        assert r.status_code == 503 and "database" in one_line(r)
        assert not db_path.exists()  # never replaced by an empty one
    finally:
        os.replace(away, db_path)
    # A job whose trainer ended with nobody watching: the monitor alone must see it.
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with sqlite3.connect(db_path) as db:
        job_id = db.execute("INSERT INTO jobs (name, config_yaml, out_dir, state, pid, "
                            "created) VALUES ('orphan', '', '/nowhere', 'running', ?, ?)",
                            (gone.pid, time.time())).lastrowid
    with sqlite3.connect(db_path) as db:
        wait_until(lambda: db.execute("SELECT state FROM jobs WHERE id = ?",
                                      (job_id,)).fetchone()[0] == "failed")


# ---- 9. every input error is a 4xx with one line ---------------------------------------
def test_bad_input_is_a_4xx_with_one_line(served):
    job = served.create("inputs")
    base = f"api/jobs/{job['id']}"
    deep_yaml = "a: " + "[" * 5000 + "]" * 5000
    with served.tool() as tool:
        answers = {
            "NUL in a file path": tool.get(f"{base}/files/a%00b.png"),
            "NUL in a query": tool.get("api/datasets/x/audit?caption_ext=t%00xt"),
            "deeply nested JSON": tool.post("api/jobs", content=b"[" * 200_000,
                                            headers={"Content-Type": "application/json"}),
            "deeply nested YAML": tool.post("api/jobs", json={"yaml": deep_yaml}),
            "a job id too large": tool.get("api/jobs/99999999999999999999999999"),
            "a too large id's files": tool.get("api/jobs/99999999999999999999999/loss"),
            "a too large id queued": tool.post("api/queue", json={"ids": [10**30]}),
            "a non-ASCII digit": tool.get(f"{base}/loss?max_points=%C2%B2"),  # ²
            "Arabic-Indic digits": tool.get(f"{base}/loss?max_points=%D9%A1%D9%A2"),
            "a declared huge body": declared_only(served, "/api/jobs", 10**12),
            "a streamed huge body": tool.post("api/jobs", content=iter([b" " * 2**20] * 3),
                                              headers={"Content-Type": "application/json"}),
        }
    for what, r in answers.items():
        assert 400 <= r.status_code < 500, (what, r.status_code, r.text)
        one_line(r)


# ---- 9. stop right after start -----------------------------------------------------------
def test_a_stop_right_after_the_start_ends_stopped(served):
    """The trainer had no handler yet (SIGTERM killed it): `failed 143`, not `stopped`."""
    job = served.create("quick_stop")
    with served.tool() as tool:
        assert tool.post(f"api/jobs/{job['id']}/start", json={}).json()["state"] == "running"
        assert tool.post(f"api/jobs/{job['id']}/stop", json={}).json()["state"] == "stopping"
        wait_until(lambda: not tool.get(f"api/jobs/{job['id']}").json()["active"])
        detail = tool.get(f"api/jobs/{job['id']}").json()
    assert (detail["state"], detail["error"]) == ("stopped", None), detail
    assert "resume" in detail["actions"]


# ---- 9. dataset links -------------------------------------------------------------------
def test_dataset_routes_never_follow_a_link_out_of_the_datasets_folder(served):
    """The audit returned the text of a caption symlinked to a file outside."""
    outside = served.tmp / "private"
    outside.mkdir()
    (outside / "notes.txt").write_text("my private notes")
    image = next((REPO / "datasets" / "example").glob("*.png"))
    (outside / "elsewhere.png").write_bytes(image.read_bytes())
    cats = served.settings.datasets_dir / "cats"
    cats.mkdir()
    (cats / "a.png").write_bytes(image.read_bytes())
    (cats / "a.txt").symlink_to(outside / "notes.txt")
    (cats / "b.png").symlink_to(outside / "elsewhere.png")
    (served.settings.datasets_dir / "linked").symlink_to(outside)
    with served.tool() as tool:
        audit = tool.get("api/datasets/cats/audit")
        listing = tool.get("api/datasets").json()["datasets"]
        assert tool.get("api/datasets/linked/audit").status_code == 404
    assert "my private notes" not in audit.text
    found = audit.json()
    assert [i["file"] for i in found["images"]] == ["a.png"]
    assert found["images"][0]["caption"] is None and found["missing_captions"] == ["a.png"]
    assert [u["file"] for u in found["unreadable"]] == ["b.png"]
    assert [d["name"] for d in listing] == ["cats"]


def declared_only(served: Served, path: str, length: int) -> httpx.Response:
    """A request that declares a body of `length` bytes and sends none of it (the answer
    must come before the server waits for it)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=60)
    try:
        conn.putrequest("POST", path)
        for name, value in (("Authorization", f"Bearer {SECRET}"), ("Content-Length",
                            str(length)), ("Content-Type", "application/json")):
            conn.putheader(name, value)
        conn.endheaders()
        answer = conn.getresponse()
        return httpx.Response(answer.status, content=answer.read(),
                              headers=answer.getheaders())
    finally:
        conn.close()


def wait_until(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "waited too long"
        time.sleep(0.1)

