"""The sync's tools step against a loopback mirror: a tool the state says is there but the
user deleted (`rm -rf .node`) is noticed by `sync`, `check` and `doctor` alike, and the
next sync provisions it again (issue 21)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from manager.envstatus import quick_status
from manager.paths import Paths
from manager.tools.lifecycle import current_platform
from manager.tools.pins import NODE
from tests.manager.sync.conftest import Checkout, make_spec

pytestmark = pytest.mark.skipif(os.name == "nt", reason="stand-in binaries are sh scripts")


def _node_archive(top: str) -> bytes:
    """A node release as the vendor lays it out, with a stand-in program."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tf:
        program = f"#!/bin/sh\necho v{NODE.version}\n".encode()
        info = tarfile.TarInfo(f"{top}/bin/node")
        info.mode, info.size = 0o755, len(program)
        tf.addfile(info, io.BytesIO(program))
    return buf.getvalue()


def _with_a_node_mirror(checkout: Checkout, tmp_dir: Path) -> None:
    """Serve the pinned node from the world's loopback server; put an old node first on
    PATH so the system one (if any) is passed over; no other tool is downloaded."""
    art = NODE.artefact(current_platform())
    if art is None or not art.filename.endswith(".tar.xz"):
        pytest.skip("no tar.xz node pin for this platform")
    mirror = checkout.world.index.root / f"node-mirror-{tmp_dir.name}"
    data = _node_archive(art.filename[: -len(".tar.xz")])
    (mirror / art.path).parent.mkdir(parents=True, exist_ok=True)
    (mirror / art.path).write_bytes(data)
    (mirror / NODE.checksum_list).write_text(
        f"{hashlib.sha256(data).hexdigest()}  {art.filename}\n")
    old = tmp_dir / "old-node"
    old.mkdir()
    (old / "node").write_text("#!/bin/sh\necho v1.0.0\n")
    (old / "node").chmod(0o755)
    url = f"{checkout.world.index.url}/{mirror.name}"
    nowhere = f"{checkout.world.index.url}/no-such-mirror"
    checkout.env.update(PATH=f"{old}{os.pathsep}{checkout.env['PATH']}", AITK_NODE_MIRROR=url,
                        AITK_FFMPEG_MIRROR=nowhere, AITK_FFMPEG_SHARED_MIRROR=nowhere,
                        AITK_UV_MIRROR=nowhere, AITK_MINGIT_MIRROR=nowhere,
                        NO_PROXY="127.0.0.1")
    checkout.env.pop("AITK_SKIP_TOOLS")


def _sync(checkout: Checkout, *args: str) -> dict:
    done = checkout.manager("sync", "--json", *args)
    assert done.returncode == 0, done.stderr + done.stdout
    return json.loads(done.stdout)["data"]


def test_a_deleted_local_tool_is_noticed_and_provisioned_again(
        uv_checkout: Checkout, tmp_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    checkout = uv_checkout
    checkout.write_spec(make_spec(checkout.world, companions=(), accelerators=()))
    _with_a_node_mirror(checkout, tmp_dir)
    node = checkout.root / ".node" / "bin" / "node"

    _sync(checkout)
    assert checkout.state()["tools"]["node"]["status"] == "ok" and node.exists()
    assert _sync(checkout)["plan"] == []

    shutil.rmtree(checkout.root / ".node")

    for key, value in checkout.env.items():  # `check` and `doctor` ask quick_status
        monkeypatch.setenv(key, value)
    status = quick_status(Paths(checkout.root))
    assert not status.in_sync
    assert any("node provisioned before and gone now" in r for r in status.reasons)
    again = _sync(checkout)
    assert [s["kind"] for s in again["plan"]] == ["tools"]
    assert node.exists() and checkout.state()["tools"]["node"]["status"] == "ok"
    assert _sync(checkout)["plan"] == []
