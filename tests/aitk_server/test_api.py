"""Every API route that needs no running trainer: configs and their problems, the
token, file routes that must not leave their folder, datasets and uploads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from starlette.testclient import TestClient

from aitk_server.app import create_app
from tests.aitk_server.conftest import REPO, fake_outputs, tool_client

# Each job it makes runs the trainer's own `run.py --check` in a child process: the
# trainer-process tier (docs/testing.md).
pytestmark = pytest.mark.slow

UPLOAD = {"content-type": "application/octet-stream"}


def create(client: TestClient, text: str) -> dict:
    r = client.post("/api/jobs", json={"yaml": text})
    assert r.status_code == 201, r.text
    return r.json()


def test_health_and_examples(client, settings):
    (settings.examples_dir / "tiny.yaml").write_text((REPO / "config" / "examples" /
                                                      "train_lora_example_cpu.yaml").read_text())
    assert client.get("/api/health").json()["token_required"] is False
    assert list(client.get("/api/examples").json()) == ["tiny"]


def test_create_from_an_example_with_a_new_name(client, settings):
    example = (REPO / "config" / "examples" / "train_lora_example_cpu.yaml").read_text()
    assert "training_folder: output\n" in example
    (settings.examples_dir / "tiny.yaml").write_text(example.replace(
        "training_folder: output\n", f"training_folder: {settings.outputs_dir}\n"))
    r = client.post("/api/jobs", json={"example": "tiny", "name": "mine"})
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["name"] == "mine" and job["state"] == "created"
    assert job["actions"] == ["start", "queue", "edit", "delete", "delete_outputs", "copy"]
    assert job["out_dir"] == str(settings.outputs_dir / "mine")
    assert yaml.safe_load(job["config_yaml"])["config"]["name"] == "mine"
    assert "# A LoRA on the tiny" in job["config_yaml"]  # the example's comments kept
    assert client.post("/api/jobs", json={"example": "nope"}).status_code == 404


def test_list_get_edit_and_delete(client, job_yaml):
    job = create(client, job_yaml("one"))
    assert [j["name"] for j in client.get("/api/jobs").json()] == ["one"]
    detail = client.get(f"/api/jobs/{job['id']}").json()
    assert detail["history"][0]["event"] == "created"
    r = client.put(f"/api/jobs/{job['id']}/config", json={"yaml": job_yaml("renamed")})
    assert r.status_code == 200 and r.json()["name"] == "renamed"
    assert client.request("DELETE", f"/api/jobs/{job['id']}", json={}).json() == {
        "deleted": job["id"]}
    assert client.get(f"/api/jobs/{job['id']}").status_code == 404
    assert client.get("/api/jobs/999/loss").status_code == 404


def test_invalid_yaml_is_one_problem_without_a_field(client):
    r = client.post("/api/jobs", json={"yaml": "job: [unclosed"})
    assert r.status_code == 422
    [problem] = r.json()["errors"]
    assert problem["path"] == "" and problem["message"].startswith("not valid YAML")


def test_schema_problems_come_back_at_their_fields(client, job_yaml):
    data = yaml.safe_load(job_yaml("bad"))
    proc = data["config"]["process"][0]
    proc["train"]["steps"] = 0
    proc["train"]["lrr"] = 1
    proc["datasets"][0]["folder_path"] = "/nowhere/at/all"
    r = client.post("/api/jobs", json={"yaml": yaml.safe_dump(data)})
    assert r.status_code == 422
    paths = {e["path"]: e["message"] for e in r.json()["errors"]}
    assert "did you mean 'lr'" in paths["config.process[0].train.lrr"]
    assert "config.process[0].train.steps" in paths
    r = client.post("/api/jobs", json={"yaml": job_yaml("bad").replace(
        str(REPO / "datasets" / "example"), "/nowhere/at/all")})
    assert r.json()["errors"] == [{"path": "config.process[0].datasets[0].folder_path",
                                   "message": "dataset folder /nowhere/at/all does not exist"}]


def test_a_file_job_writing_outside_the_outputs_root_is_one_problem_at_its_field(client):
    """File jobs are made here too (test_file_jobs.py); one that would write outside the
    outputs root is refused at that key, in one line."""
    text = yaml.safe_dump({"job": "mod", "config": {"name": "m", "process": [{
        "type": "rescale_lora", "input_path": "/in.safetensors",
        "output_path": "/out.safetensors", "current_weight": 2.0, "target_weight": 1.0}]}})
    r = client.post("/api/jobs", json={"yaml": text})
    assert r.status_code == 422
    [problem] = r.json()["errors"]
    assert problem["path"] == "config.process[0].output_path", problem
    assert "\n" not in problem["message"]


def test_yaml_aliases_and_oversized_configs_are_refused(client):
    bomb = "a: &a [x, x]\nb: &b [*a, *a]\nc: [*b, *b]\n"
    assert "aliases" in client.post("/api/jobs", json={"yaml": bomb}).json()["errors"][0][
        "message"]
    r = client.post("/api/jobs", content=b"{" + b" " * (2 * 1024 * 1024) + b"}",
                    headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_two_jobs_cannot_share_an_output_folder(client, job_yaml):
    create(client, job_yaml("same"))
    r = client.post("/api/jobs", json={"yaml": job_yaml("same")})
    assert r.status_code == 422 and r.json()["errors"][0]["path"] == "config.name"


@pytest.fixture
def listening(settings):
    """The app as served with --listen: the token works on every API route too."""
    from dataclasses import replace

    with TestClient(create_app(replace(settings, token="s3cret")),
                    base_url=f"http://127.0.0.1:{settings.port}") as c:
        yield c


def test_beyond_loopback_every_api_route_needs_the_token(listening, job_yaml):
    writes = {"content-type": "application/json", "origin": str(listening.base_url)}
    for method, path in [("GET", "/api/jobs"), ("GET", "/api/health"),
                         ("POST", "/api/jobs"), ("GET", "/api/events"),
                         ("GET", "/api/jobs/1/files/x"), ("PUT", "/api/datasets/d/files/a.txt"),
                         ("GET", "/api/datasets")]:
        r = listening.request(method, path, headers=writes)
        assert r.status_code == 401 and r.json()["sign_in"] == "token", path
        assert listening.request(method, path, headers={**writes, "Authorization":
                                                        "Bearer wrong"}).status_code == 401
    assert listening.get("/api/jobs", headers={"Authorization": "Bearer s3cret"}).json() == []
    assert listening.get("/api/jobs?token=s3cret").status_code == 401  # never in a URL
    assert listening.get("/").status_code == 503  # the page itself holds no data


def test_with_listen_a_browser_signs_in_once_with_the_token(listening):
    """The page's token box (another machine on the LAN): the token buys the same
    session cookie a one-time link does; a wrong one buys nothing."""
    page = {"origin": str(listening.base_url)}
    assert listening.post("/api/session", json={"token": "wrong"}, headers=page
                          ).status_code == 401
    assert listening.get("/api/jobs").status_code == 401
    r = listening.post("/api/session", json={"token": "s3cret"}, headers=page)
    assert r.status_code == 200 and "httponly" in r.headers["set-cookie"].lower()
    assert listening.get("/api/jobs").json() == []  # the client keeps the cookie
    assert listening.post("/api/session", json={"token": "s3cret"}, headers={
        "origin": "http://evil.example"}).status_code == 403


def test_the_token_is_made_once_owner_only_or_taken_from_the_environment(tmp_path):
    from aitk_server import auth

    token, created = auth.load_or_create(tmp_path / "t" / "token", env={})
    assert created and len(token) >= 32
    assert (tmp_path / "t" / "token").stat().st_mode & 0o777 == 0o600
    assert auth.load_or_create(tmp_path / "t" / "token", env={}) == (token, False)
    assert auth.load_or_create(tmp_path / "t" / "token", env={auth.ENV_VAR: "mine"}) == (
        "mine", False)
    assert auth.is_loopback("127.0.0.1") and auth.is_loopback("::1")
    assert not auth.is_loopback("0.0.0.0") and not auth.is_loopback("192.168.1.5")


def test_outputs_loss_samples_loras_and_files(client, job_yaml):
    job = create(client, job_yaml("out"))
    written = fake_outputs(Path(job["out_dir"]), "out")
    base = f"/api/jobs/{job['id']}"
    loss = client.get(f"{base}/loss").json()
    assert loss[0] == [1, 1.0] and loss[-1] == [10, 0.1] and len(loss) == 10
    assert len(client.get(f"{base}/loss?max_points=4").json()) == 4
    assert client.get(f"{base}/samples").json() == [
        {"step": 0, "files": ["samples/000000000_0.png"]},
        {"step": 2, "files": ["samples/000000002_0.png"]}]
    assert [(f["file"], f["final"]) for f in client.get(f"{base}/loras").json()] == [
        ("out.safetensors", True), ("out_000000002.safetensors", False)]
    r = client.get(f"{base}/files/out.safetensors?download=1")
    assert r.content == written["out.safetensors"]
    assert "attachment" in r.headers["content-disposition"]
    assert (client.get(f"{base}/files/samples/000000002_0.png").content
            == written["samples/000000002_0.png"])
    assert client.get(f"{base}/log").json() == {"log": ""}


def test_file_routes_cannot_leave_the_output_folder(client, job_yaml, tmp_path):
    job = create(client, job_yaml("safe"))
    out = Path(job["out_dir"])
    fake_outputs(out, "safe")
    secret = tmp_path / "secret.txt"
    secret.write_text("private")
    (out / "link.txt").symlink_to(secret)
    (out / "linkdir").symlink_to(tmp_path)
    base = f"/api/jobs/{job['id']}/files"
    for attempt in ["../../secret.txt", "..%2F..%2Fsecret.txt", "%2E%2E/%2E%2E/secret.txt",
                    "link.txt", "linkdir/secret.txt", str(secret), "samples/../../secret.txt",
                    "..\\..\\secret.txt"]:
        r = client.get(f"{base}/{attempt}")
        assert r.status_code == 404 and b"private" not in r.content, attempt


def test_deleting_outputs_needs_the_name_as_confirmation(client, job_yaml):
    job = create(client, job_yaml("gone"))
    out = Path(job["out_dir"])
    fake_outputs(out, "gone")
    url = f"/api/jobs/{job['id']}/outputs"
    r = client.request("DELETE", url, json={})
    assert r.status_code == 400 and "confirm" in r.json()["error"] and out.exists()
    assert client.request("DELETE", url, json={"confirm": "other"}).status_code == 400
    assert client.request("DELETE", url, json={"confirm": "gone"}).status_code == 200
    assert not out.exists()


def test_deleting_outputs_removes_only_what_the_trainer_wrote(client, job_yaml):
    """`training_folder` may point anywhere: a user's own files beside the outputs stay,
    and so does a user's file at one of the trainer's names (issue 14: only files the
    trainer recognises as its own are removed)."""
    job = create(client, job_yaml("mixed"))
    out = Path(job["out_dir"])
    fake_outputs(out, "mixed")
    (out / "notes.txt").write_text("mine")
    (out / "mixed_final_v2.safetensors").write_bytes(b"mine too")
    (out / "mixed_000000009.safetensors").write_bytes(b"a LoRA-like name, not aitk's")
    (out / "config.yaml").write_text("# my own notes about this run\n")
    (out / "samples" / "000000004_0.png").write_bytes(b"the user's picture")
    r = client.request("DELETE", f"/api/jobs/{job['id']}/outputs", json={"confirm": "mixed"})
    assert sorted(r.json()["removed"]) == [
        "loss_log.jsonl", "mixed.safetensors", "mixed_000000002.safetensors",
        "samples/000000000_0.png", "samples/000000002_0.png"]
    assert sorted(p.name for p in out.iterdir()) == [
        "config.yaml", "mixed_000000009.safetensors", "mixed_final_v2.safetensors",
        "notes.txt", "samples"]
    assert [p.name for p in (out / "samples").iterdir()] == ["000000004_0.png"]
    assert (out / "config.yaml").read_text() == "# my own notes about this run\n"


def test_queue_needs_known_job_ids(client):
    assert client.post("/api/queue", json={"ids": "x"}).status_code == 400
    assert client.post("/api/queue", json={"ids": [42]}).status_code == 404


def test_datasets_listing_audit_and_upload(client, settings):
    png = (REPO / "datasets" / "example").glob("*.png")
    image = next(iter(png)).read_bytes()
    r = client.put("/api/datasets/cats/files/a.png", content=image, headers=UPLOAD)
    assert r.status_code == 201 and r.json()["size"] == len(image)
    client.put("/api/datasets/cats/files/b.png", content=b"not an image", headers=UPLOAD)
    client.put("/api/datasets/cats/files/b.txt", content=b"a cat", headers=UPLOAD)
    assert client.get("/api/datasets").json()["datasets"] == [{"name": "cats", "images": 2}]
    audit = client.get("/api/datasets/cats/audit").json()
    assert [i["file"] for i in audit["images"]] == ["a.png"]
    assert audit["missing_captions"] == ["a.png"]
    assert [u["file"] for u in audit["unreadable"]] == ["b.png"]
    assert client.get("/api/datasets/dogs/audit").status_code == 404
    assert client.get("/api/datasets/..%2F..%2Fetc/audit").status_code in (400, 404)


def test_uploads_are_capped_and_confined(settings, tmp_path):
    from dataclasses import replace

    with tool_client(create_app(replace(settings, max_upload_bytes=1024)), settings) as c:
        def put(path: str, data: bytes) -> int:
            return c.put(path, content=data, headers=UPLOAD).status_code

        assert put("/api/datasets/d/files/big.png", b"x" * 2048) == 413
        assert not any((settings.datasets_dir / "d").glob("*"))  # nothing half-written
        assert put("/api/datasets/d/files/run.sh", b"x") == 400
        assert put("/api/datasets/d/files/.hidden.png", b"x") == 400
        assert put("/api/datasets/..%2Fescape/files/a.png", b"x") in (400, 404)
        outside = tmp_path / "outside"
        outside.mkdir()
        os.symlink(outside, settings.datasets_dir / "sneaky")
        assert put("/api/datasets/sneaky/files/a.png", b"x") == 400
        assert not (outside / "a.png").exists()
        assert c.put("/api/datasets/d/files/a.png", content=b"x", headers={
            "content-type": "application/json"}).status_code == 415
