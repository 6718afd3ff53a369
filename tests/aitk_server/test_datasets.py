"""The dataset manager's routes (aitk_server/routes/datasets.py): create, upload,
thumbnails, captions written atomically, rename and delete into a restorable trash,
the trainer's audit per file, a zip; every path confined to the datasets folder, and
every route behind the guard (no secret, a forged Host, another origin)."""

from __future__ import annotations

import io
import os
import zipfile

import pytest
from PIL import Image
from starlette.testclient import TestClient

from aitk_server.app import create_app
from tests.aitk_server.conftest import tool_client

UPLOAD = {"content-type": "application/octet-stream"}


def png(side: int = 64, colour: tuple[int, int, int] = (200, 10, 10)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (side, side), colour).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture
def cats(client: TestClient) -> TestClient:
    assert client.post("/api/datasets", json={"name": "cats"}).status_code == 201
    for name, data in (("a.png", png()), ("b.png", png(48, (0, 0, 200))),
                       ("a.txt", b"a red cat")):
        assert client.put(f"/api/datasets/cats/files/{name}", content=data,
                          headers=UPLOAD).status_code == 201
    return client


def test_create_refuses_a_taken_or_unsafe_name(client, settings):
    assert client.post("/api/datasets", json={"name": "cats"}).status_code == 201
    assert client.post("/api/datasets", json={"name": "cats"}).status_code == 409
    for bad in ("../up", ".hidden", "a/b", ""):
        assert client.post("/api/datasets", json={"name": bad}).status_code == 400, bad
    assert sorted(p.name for p in settings.datasets_dir.iterdir()) == ["cats"]


def test_thumbnails_full_files_and_the_audit_per_file(cats):
    thumb = cats.get("/api/datasets/cats/thumbs/a.png")
    assert thumb.status_code == 200 and thumb.headers["content-type"] == "image/jpeg"
    assert Image.open(io.BytesIO(thumb.content)).size == (64, 64)
    full = cats.get("/api/datasets/cats/files/a.png")
    assert full.headers["content-type"] == "image/png"
    assert full.headers["content-disposition"].startswith("inline")
    caption = cats.get("/api/datasets/cats/files/a.txt")
    assert caption.headers["content-disposition"].startswith("attachment")
    audit = cats.get("/api/datasets/cats/audit").json()
    assert audit["missing_captions"] == ["b.png"]
    codes = {f["code"] for f in audit["findings"].get("b.png", [])}
    assert "missing_caption" in codes, audit["findings"]


def test_a_caption_is_written_atomically_and_read_back(cats, settings):
    answer = cats.put("/api/datasets/cats/captions/b.png", json={"text": "a blue cat"})
    assert answer.status_code == 200, answer.text
    assert (settings.datasets_dir / "cats" / "b.txt").read_text() == "a blue cat"
    assert not [p for p in (settings.datasets_dir / "cats").iterdir()
                if p.name.startswith(".")]  # no temp file left behind
    audit = cats.get("/api/datasets/cats/audit").json()
    assert audit["missing_captions"] == []
    assert cats.put("/api/datasets/cats/captions/zzz.png",
                    json={"text": "x"}).status_code == 404


def test_rename_moves_the_caption_too_and_never_replaces(cats, settings):
    folder = settings.datasets_dir / "cats"
    assert cats.post("/api/datasets/cats/files/a.png/rename",
                     json={"to": "b"}).status_code == 409
    answer = cats.post("/api/datasets/cats/files/a.png/rename", json={"to": "red"})
    assert answer.json() == {"file": "red.png"}
    assert sorted(p.name for p in folder.iterdir()) == ["b.png", "red.png", "red.txt"]
    for bad in ("../x", "x.sh/y", ".x"):
        assert cats.post("/api/datasets/cats/files/red.png/rename",
                         json={"to": bad}).status_code == 400, bad


def test_delete_goes_to_a_trash_that_restores(cats, settings):
    folder = settings.datasets_dir / "cats"
    entry = cats.delete("/api/datasets/cats/files/a.png",
                        headers={"content-type": "application/json"}).json()["trash"]
    assert sorted(p.name for p in folder.iterdir()) == ["b.png"]
    assert cats.get("/api/datasets").json()["datasets"] == [{"name": "cats", "images": 1}]
    assert cats.get("/api/datasets/cats/trash").json() == [
        {"entry": entry, "files": ["a.png", "a.txt"]}]
    restored = cats.post(f"/api/datasets/cats/trash/{entry}/restore", json={})
    assert restored.json() == {"restored": ["a.png", "a.txt"]}
    assert sorted(p.name for p in folder.iterdir()) == ["a.png", "a.txt", "b.png"]
    assert cats.get("/api/datasets/cats/trash").json() == []
    assert cats.post("/api/datasets/cats/trash/..%2F..%2Fx/restore",
                     json={}).status_code in (400, 404)


def test_the_zip_holds_the_datasets_files_and_nothing_linked_from_outside(
        cats, settings, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("not yours")
    os.symlink(secret, settings.datasets_dir / "cats" / "leak.txt")
    answer = cats.get("/api/datasets/cats/zip")
    assert answer.status_code == 200
    assert answer.headers["content-disposition"].startswith("attachment")
    names = zipfile.ZipFile(io.BytesIO(answer.content)).namelist()
    assert names == ["cats/a.png", "cats/a.txt", "cats/b.png"]
    assert not list((settings.data_dir / "zips").iterdir())  # the temp zip is gone


def test_no_route_follows_a_link_out_of_the_datasets_folder(cats, settings, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.png").write_bytes(png())
    (outside / "x.txt").write_text("outside text")
    folder = settings.datasets_dir / "cats"
    os.symlink(outside / "x.png", folder / "x.png")
    os.symlink(outside / "x.txt", folder / "b.txt")  # b.png's caption, pointing out
    os.symlink(outside, settings.datasets_dir / "linked")
    assert cats.get("/api/datasets/cats/files/x.png").status_code == 404
    assert cats.get("/api/datasets/cats/thumbs/x.png").status_code == 404
    assert cats.delete("/api/datasets/cats/files/x.png", headers={
        "content-type": "application/json"}).status_code == 404
    assert cats.put("/api/datasets/cats/captions/b.png",
                    json={"text": "overwrite"}).status_code == 400
    assert (outside / "x.txt").read_text() == "outside text"
    assert "outside text" not in cats.get("/api/datasets/cats/audit").text
    assert cats.get("/api/datasets/linked/audit").status_code == 404
    assert cats.get("/api/datasets/linked/zip").status_code == 404
    for path in ("/api/datasets/..%2F..%2Fetc/files/passwd",
                 "/api/datasets/cats/files/..%2F..%2Fsecret.txt",
                 "/api/datasets/cats/thumbs/..%2Fa.png"):
        assert cats.get(path).status_code in (400, 404), path


def test_bodies_too_large_or_malformed_are_one_line(settings):
    from dataclasses import replace

    with tool_client(create_app(replace(settings, max_upload_bytes=1024)), settings) as c:
        c.post("/api/datasets", json={"name": "d"})
        big = c.put("/api/datasets/d/files/big.png", content=b"x" * 4096, headers=UPLOAD)
        assert big.status_code == 413 and "error" in big.json()
        assert not list((settings.datasets_dir / "d").iterdir())
        bad = c.put("/api/datasets/d/captions/a.png", content=b"{nope",
                    headers={"content-type": "application/json"})
        assert bad.status_code == 400
        deep = c.post("/api/datasets", content=b"[" * 100_000,
                      headers={"content-type": "application/json"})
        assert deep.status_code == 400
        huge = c.put("/api/datasets/d/captions/a.png", json={"text": "x" * 100_000})
        assert huge.status_code in (400, 404)


ROUTES = [("GET", "/api/datasets"), ("POST", "/api/datasets"),
          ("GET", "/api/datasets/cats/audit"), ("PUT", "/api/datasets/cats/files/c.png"),
          ("GET", "/api/datasets/cats/files/a.png"),
          ("DELETE", "/api/datasets/cats/files/a.png"),
          ("POST", "/api/datasets/cats/files/a.png/rename"),
          ("PUT", "/api/datasets/cats/captions/a.png"),
          ("GET", "/api/datasets/cats/thumbs/a.png"), ("GET", "/api/datasets/cats/trash"),
          ("POST", "/api/datasets/cats/trash/x/restore"), ("GET", "/api/datasets/cats/zip"),
          ("GET", "/api/datasets/cats/pairs")]


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_every_dataset_route_is_behind_the_guard(cats, settings, method, path):
    folder = settings.datasets_dir / "cats"
    before = sorted((p.name, p.read_bytes()) for p in folder.iterdir())
    base = f"http://127.0.0.1:{settings.port}"
    body = {"content": b'{"name": "x", "to": "y", "text": "z"}',
            "headers": {"content-type": "application/json"}} if method != "GET" else {}
    app = cats.app
    # A browser on the server's own page, without the session cookie.
    with TestClient(app, base_url=base, headers={"Origin": base}) as anonymous:
        assert anonymous.request(method, path, **body).status_code == 401
    with TestClient(app, base_url=f"http://evil.example:{settings.port}",
                    headers={"Authorization": f"Bearer {settings.secret}"}) as rebound:
        assert rebound.request(method, path, **body).status_code == 421
    if method != "GET":
        with TestClient(app, base_url=base, headers={"Origin": "http://evil.example"}
                        ) as forged:
            assert forged.request(method, path, **body).status_code == 403
    assert sorted((p.name, p.read_bytes()) for p in folder.iterdir()) == before
    assert sorted(p.name for p in settings.datasets_dir.iterdir()) == ["cats"]


def test_a_video_and_its_caption_upload_and_show_inline(client, settings):
    client.post("/api/datasets", json={"name": "clips"})
    assert client.put("/api/datasets/clips/files/c.mp4", content=b"\0\0\0 ftypisom",
                      headers=UPLOAD).status_code == 201
    shown = client.get("/api/datasets/clips/files/c.mp4")
    assert shown.headers["content-type"] == "video/mp4"
    assert client.put("/api/datasets/clips/captions/c.mp4",
                      json={"text": "a clip"}).status_code == 200
    assert (settings.datasets_dir / "clips" / "c.txt").read_text() == "a clip"
    audit = client.get("/api/datasets/clips/audit").json()
    assert audit["videos"] == [{"file": "c.mp4", "caption": "a clip"}]
    assert audit["ignored"] == []


# ---- control folders (edit models) ------------------------------------------------------
def test_pairing_by_stem_flags_what_the_trainer_would_skip():
    from aitk_server.datasets import pair_by_stem

    found = pair_by_stem(["b.png", "a.png", "c.jpg"],
                         {"ctl": ["a.jpg", "a.png", "b.webp", "z.png"], "depth": ["a.png"]})
    assert found["pairs"] == [{"target": "a.png", "controls": ["a.jpg", "a.png"]},
                              {"target": "b.png", "controls": ["b.webp", None]},
                              {"target": "c.jpg", "controls": [None, None]}]
    assert found["missing_control"] == ["b.png", "c.jpg"]
    assert found["unpaired"] == {"ctl": ["z.png"], "depth": []}
    assert found["shadowed"] == {"ctl": ["a.png"], "depth": []}  # a.jpg is first by name
    assert pair_by_stem(["a.png"], {})["pairs"] == [{"target": "a.png", "controls": []}]


def test_the_trainer_pairs_the_same_file_of_one_stem(tmp_path):
    """The page's pairing and the trainer's are one rule (aitk.data.folders.stem_index)."""
    from aitk.data.controls import index_folder
    from aitk_server.datasets import pair_by_stem

    for name in ("a.png", "a.jpg", "b.webp", "notes.txt"):
        (tmp_path / name).write_bytes(png())
    trainer = {stem: p.name for stem, p in index_folder(tmp_path).items()}
    page = pair_by_stem(["a.png", "b.png"], {"c": ["a.jpg", "a.png", "b.webp"]})
    assert trainer == {p["target"][:1]: p["controls"][0] for p in page["pairs"]}


def test_a_dataset_is_shown_paired_with_its_control_dataset(cats, settings):
    """cats_control is cats' control folder by convention; another can be named."""
    assert cats.get("/api/datasets/cats/pairs").json()["controls"] == []
    cats.post("/api/datasets", json={"name": "cats_control"})
    cats.post("/api/datasets", json={"name": "edges"})
    for name in ("a.jpg", "z.png", "notes.txt"):
        assert cats.put(f"/api/datasets/cats_control/files/{name}", content=png(),
                        headers=UPLOAD).status_code == 201
    found = cats.get("/api/datasets/cats/pairs").json()
    assert found["controls"] == ["cats_control"]
    assert found["pairs"] == [{"target": "a.png", "controls": ["a.jpg"]},
                              {"target": "b.png", "controls": [None]}]
    assert found["missing_control"] == ["b.png"]
    assert found["unpaired"] == {"cats_control": ["z.png"]}
    assert found["candidates"] == ["cats_control", "edges"]
    two = cats.get("/api/datasets/cats/pairs?control=edges&control=cats_control").json()
    assert two["pairs"][0] == {"target": "a.png", "controls": [None, "a.jpg"]}
    assert two["missing_control"] == ["a.png", "b.png"]


def test_a_control_folder_never_leaves_the_datasets_folder(cats, settings, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "a.png").write_bytes(png())
    os.symlink(outside, settings.datasets_dir / "cats_control")  # the default's name
    os.symlink(outside, settings.datasets_dir / "linked")
    cats.post("/api/datasets", json={"name": "ok"})
    os.symlink(outside / "a.png", settings.datasets_dir / "ok" / "a.png")  # a file out
    answers = {
        "a link out by default": cats.get("/api/datasets/cats/pairs"),
        "a link out named": cats.get("/api/datasets/cats/pairs?control=linked"),
        "up and out": cats.get("/api/datasets/cats/pairs?control=..%2Foutside"),
        "absolute": cats.get(f"/api/datasets/cats/pairs?control={outside}"),
        "itself": cats.get("/api/datasets/cats/pairs?control=cats"),
        "twice": cats.get("/api/datasets/cats/pairs?control=ok&control=ok"),
        "too many": cats.get("/api/datasets/cats/pairs?" + "&".join(
            f"control={n}" for n in ("ok", "a", "b", "c", "d"))),
        "none such": cats.get("/api/datasets/cats/pairs?control=nosuch"),
        "empty": cats.get("/api/datasets/cats/pairs?control="),
    }
    for what, r in answers.items():
        if what == "a link out by default":
            assert r.status_code == 200 and r.json()["controls"] == [], r.text
            continue
        assert r.status_code in (400, 404), (what, r.text)
        assert "\n" not in r.json()["error"] and str(outside) not in r.json()["error"], what
    assert "outside" in answers["a link out named"].json()["error"]
    found = cats.get("/api/datasets/cats/pairs?control=ok").json()
    assert found["links_out"] == ["ok/a.png"] and found["unpaired"] == {"ok": []}
    assert found["pairs"][0] == {"target": "a.png", "controls": [None]}
