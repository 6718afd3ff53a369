"""Installing tools through the one downloader from a loopback mirror: verified copies
are published atomically with a marker; every failure leaves the previous copy and the
checkout as they were."""

from __future__ import annotations

import dataclasses
import os

import pytest

from manager import archive, download
from manager.tools.ffmpeg import Ffmpeg
from manager.tools.lifecycle import Context, Settings, ToolUnavailable
from manager.tools.node import Node, parse_shasums
from manager.tools.pins import FFMPEG_SHARED, LINUX_X64, NODE, UV, Artefact
from manager.tools.uv import Uv
from tests.manager.tools.builders import (
    Entry,
    exe,
    make_tar,
    make_zip,
    outside_staging,
    sha,
    tree,
)

PLAT = LINUX_X64
pytestmark = pytest.mark.skipif(os.name == "nt", reason="stand-in binaries are sh scripts")


def node_archive(version: str = "22.12.0", extra: list[Entry] | None = None,
                 runs: bool = True) -> bytes:
    top = f"node-v{version}-linux-x64"
    node = exe(f"{top}/bin/node", f"v{version}") if runs else Entry(
        f"{top}/bin/node", b"#!/bin/sh\nexit 3\n", mode=0o755)
    entries = [
        Entry(top, kind="dir", mode=0o755), node,
        Entry(f"{top}/lib/node_modules/npm/bin/npm-cli.js", b"// npm"),
        Entry(f"{top}/bin/npm", kind="symlink", target="../lib/node_modules/npm/bin/npm-cli.js"),
    ]
    return make_tar(entries + (extra or []), "xz")


def serve_node(server, data: bytes, behaviour: str = "ok", listed: bytes | None = None) -> None:
    art = NODE.artefact(PLAT)
    server.add(f"dist/{art.path}", data, behaviour)
    digest = sha(listed if listed is not None else data)
    sums = f"{'0' * 64}  node-v22.12.0-win-x64.zip\n{digest}  {art.filename}\n"
    server.add(f"dist/{NODE.checksum_list}", sums.encode())


def ctx_for(server, client, fast_retry, quiet, **settings) -> Context:
    mirrors = {"node": server.url("dist"), "ffmpeg": server.url("ff"),
               "ffmpeg-shared": server.url("ff"), "uv": server.url("uv")}
    return Context(Settings(mirrors, **settings), client=client, retry=fast_retry,
                   reporter=quiet)


def previous_node(checkout) -> None:
    """An older, once-trusted local copy (marker for 20.0.0)."""
    root = checkout.node_dir
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "node").write_text("#!/bin/sh\necho v20.0.0\n")
    (root / "bin" / "node").chmod(0o755)
    archive.write_marker(root, archive.Marker("node", "20.0.0", "node-v20.0.0-linux-x64.tar.xz",
                                              "http://old", "cd" * 32, True))


def staging_is_clean(checkout) -> bool:
    root = archive.staging_root(checkout.root)
    leftovers = [p.relative_to(root).as_posix() for p in root.rglob("*")] if root.exists() else []
    return all(p == "downloads" or p.endswith((".part", ".part.json")) for p in leftovers)


def test_node_installs_verified_against_the_vendor_list(server, client, fast_retry, quiet,
                                                        checkout):
    serve_node(server, node_archive())
    found = Node().install(checkout, PLAT, ctx_for(server, client, fast_retry, quiet))
    assert (found.used, found.version, found.ok, found.verified) == ("local", "22.12.0", True,
                                                                     True)
    marker = archive.read_marker(checkout.node_dir)
    assert marker.tool == "node" and marker.version == "22.12.0" and marker.verified
    assert marker.source == server.url(f"dist/{NODE.artefact(PLAT).path}")
    assert os.path.realpath(checkout.node_dir / "bin/npm").endswith("npm-cli.js")
    assert staging_is_clean(checkout)
    assert not any(archive.staging_root(checkout.root).rglob("*.part"))


def test_older_local_copy_is_upgraded(server, client, fast_retry, quiet, checkout):
    previous_node(checkout)
    tool = Node(which=lambda *a, **k: None)  # no system node
    assert not tool.resolve(checkout, PLAT).ok
    serve_node(server, node_archive())
    tool.install(checkout, PLAT, ctx_for(server, client, fast_retry, quiet))
    assert tool.resolve(checkout, PLAT).version == "22.12.0"
    assert archive.read_marker(checkout.node_dir).version == "22.12.0"


FAILURES = {
    "wrong checksum": dict(listed=b"other bytes"),
    "truncated body": dict(behaviour="truncate"),
    "stalled server": dict(behaviour="stall"),
    "dotdot entry": dict(extra=[Entry("node-v22.12.0-linux-x64/../../evil", b"x")]),
    "absolute path": dict(extra=[Entry("/tmp/aitk-node-evil", b"x")]),
    "escaping symlink": dict(extra=[Entry("node-v22.12.0-linux-x64/bin/esc", kind="symlink",
                                          target="../../../outside")]),
    "binary does not run": dict(runs=False),
}


@pytest.mark.parametrize("case", sorted(FAILURES))
def test_failures_leave_previous_copy_and_checkout_untouched(server, client, fast_retry, quiet,
                                                             checkout, case):
    spec = FAILURES[case]
    previous_node(checkout)
    before = outside_staging(checkout.root)
    data = node_archive(extra=spec.get("extra"), runs=spec.get("runs", True))
    serve_node(server, data, spec.get("behaviour", "ok"), spec.get("listed"))
    with pytest.raises((download.DownloadError, archive.UnsafeArchive, ToolUnavailable)):
        Node().install(checkout, PLAT, ctx_for(server, client, fast_retry, quiet))
    assert outside_staging(checkout.root) == before
    assert staging_is_clean(checkout)
    assert not os.path.exists("/tmp/aitk-node-evil")


def test_404_and_missing_checksum_entry_leave_nothing(server, client, fast_retry, quiet,
                                                      checkout):
    before = outside_staging(checkout.root)
    server.add(f"dist/{NODE.checksum_list}", b"")  # list without our file
    with pytest.raises(ToolUnavailable, match="not listed"):
        Node().install(checkout, PLAT, ctx_for(server, client, fast_retry, quiet))
    serve_node(server, node_archive())
    del server.routes[f"/dist/{NODE.artefact(PLAT).path}"]
    with pytest.raises(download.DownloadError, match="404"):
        Node().install(checkout, PLAT, ctx_for(server, client, fast_retry, quiet))
    assert outside_staging(checkout.root) == before


def ffmpeg_archive() -> bytes:
    top = FFMPEG_SHARED.artefact(PLAT).filename.removesuffix(".tar.xz")
    return make_tar([
        exe(f"{top}/bin/ffmpeg", "ffmpeg version n7.1-62-gb168ed9b14 Copyright (c) 2000-2024"),
        Entry(f"{top}/lib/libavutil.so.59", b"\x7fELF"),
        Entry(f"{top}/lib/libavutil.so", kind="symlink", target="libavutil.so.59"),
    ], "xz")


def test_ffmpeg_without_checksum_is_refused_unless_opted_in(server, client, fast_retry, quiet,
                                                            checkout):
    server.add(f"ff/{FFMPEG_SHARED.artefact(PLAT).path}", ffmpeg_archive())
    with pytest.raises(ToolUnavailable, match="unverified") as info:
        Ffmpeg(FFMPEG_SHARED).install(checkout, PLAT, ctx_for(server, client, fast_retry, quiet))
    assert "AITK_ALLOW_UNVERIFIED=ffmpeg" in info.value.hint
    assert server.requests == [] and not checkout.ffmpeg_dir.exists()

    ctx = ctx_for(server, client, fast_retry, quiet, allow_unverified=frozenset({"ffmpeg"}))
    found = Ffmpeg(FFMPEG_SHARED).install(checkout, PLAT, ctx)
    assert (found.version, found.verified) == ("7.1", False)
    assert (checkout.ffmpeg_dir / "lib" / "libavutil.so.59").exists()


def uv_wheel(version_line: str = "uv 0.13.9") -> bytes:
    return make_zip([
        Entry("uv/__init__.py", b""),
        exe("uv-0.13.9.data/scripts/uv", version_line),
        exe("uv-0.13.9.data/scripts/uvx", "uvx 0.13.9"),
    ])


def test_uv_from_a_wheel_keeps_managed_pythons(server, client, fast_retry, quiet, checkout):
    wheel = uv_wheel()
    pin = dataclasses.replace(UV, artefacts={PLAT: Artefact("x/uv-test.whl", "wheel",
                                                            sha(wheel))})
    server.add("uv/x/uv-test.whl", wheel)
    keep = checkout.uv_dir / "python" / "cpython-3.11" / "keep"
    keep.parent.mkdir(parents=True)
    keep.write_text("a managed python")
    found = Uv(pin).install(checkout, PLAT, ctx_for(server, client, fast_retry, quiet))
    assert found.path == str(checkout.uv_dir / "uv") and found.version == "0.13.9"
    assert os.access(checkout.uv_dir / "uvx", os.X_OK)
    assert keep.read_text() == "a managed python"
    assert archive.read_marker(checkout.uv_dir).sha256 == sha(wheel)


def test_real_uv_pin_rejects_other_bytes_from_a_mirror(server, client, fast_retry, quiet,
                                                       checkout):
    server.add(f"uv/{UV.artefact(PLAT).path}", uv_wheel())
    with pytest.raises(download.ChecksumMismatch):
        Uv().install(checkout, PLAT, ctx_for(server, client, fast_retry, quiet))
    assert tree(checkout.uv_dir) == {} and staging_is_clean(checkout)


def test_parse_shasums():
    text = f"{'a' * 64}  node.tar.xz\n{'b' * 64} *node.zip\nnot a line\n{'z' * 64}  bad\n"
    assert parse_shasums(text) == {"node.tar.xz": "a" * 64, "node.zip": "b" * 64}
