"""FFmpeg from imageio-ffmpeg's PyPI wheel: a wheel built here (a stand-in ffmpeg script)
served on loopback is verified against the pinned index digest, installed as
.ffmpeg/bin/ffmpeg, reported local and verified, and found by children on PATH; other
bytes are refused with nothing installed. The unverified shared build stays opt-in."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess

import pytest

import manager.tools as tools
from manager import archive, download
from manager.commands import tools as tools_command
from manager.health.check import Status
from manager.health.tooling import judge_tool
from manager.tools import ffmpeg as ffmpeg_mod
from manager.tools.ffmpeg import Ffmpeg, select_pin
from manager.tools.lifecycle import Context, Settings, current_platform
from manager.tools.pins import (
    FFMPEG,
    FFMPEG_SHARED,
    LINUX_X64,
    MACOS_ARM64,
    PLATFORMS,
    Artefact,
)
from tests.manager.tools.builders import Entry, exe, make_zip, outside_staging, sha, tree

pytestmark = pytest.mark.skipif(os.name == "nt", reason="stand-in binaries are sh scripts")

VERSION_LINE = "ffmpeg version n9.0.2-17-g2a571b6068-20260930 Copyright (c) 2000-2026"


def ffmpeg_wheel(binaries: tuple[str, ...] = ("ffmpeg-linux-x86_64-v9.0.2",)) -> bytes:
    """The layout of imageio-ffmpeg's wheels, with a script for the program."""
    return make_zip([
        Entry("imageio_ffmpeg/__init__.py", b""),
        Entry("imageio_ffmpeg/binaries/README.md", b"Exes are dropped here\n"),
        Entry("imageio_ffmpeg/binaries/__init__.py", b""),
        *(exe(f"imageio_ffmpeg/binaries/{name}", VERSION_LINE) for name in binaries),
        Entry("imageio_ffmpeg-0.8.1.dist-info/WHEEL", b"Wheel-Version: 1.0\n"),
    ])


def wheel_pin(wheel: bytes, plat=LINUX_X64):
    return dataclasses.replace(FFMPEG, artefacts={plat: Artefact(
        "ab/cd/imageio_ffmpeg-0.8.1-py3-none-test.whl", "wheel", sha(wheel), len(wheel))})


def ctx_for(server, client, fast_retry, quiet) -> Context:
    return Context(Settings({"ffmpeg": server.url("pypi")}), client=client, retry=fast_retry,
                   reporter=quiet)


def test_wheel_program_is_installed_verified_and_reported(server, client, fast_retry, quiet,
                                                          checkout, monkeypatch):
    plat = current_platform()
    wheel = ffmpeg_wheel()
    pin = wheel_pin(wheel, plat)
    server.add(f"pypi/{pin.artefact(plat).path}", wheel)
    found = Ffmpeg(pin).install(checkout, plat, ctx_for(server, client, fast_retry, quiet))
    exe_path = checkout.ffmpeg_dir / "bin" / "ffmpeg"
    assert (found.used, found.path, found.version, found.verified) == (
        "local", str(exe_path), "9.0.2", True)
    assert os.access(exe_path, os.X_OK)
    # Only the program and the marker: no lib/, so no library path for children.
    assert sorted(tree(checkout.ffmpeg_dir)) == [archive.MARKER_NAME, "bin", "bin/ffmpeg"]
    assert archive.read_marker(checkout.ffmpeg_dir).sha256 == sha(wheel)

    # What `tools --json` and doctor say, with this pin as the one in force.
    monkeypatch.setattr(ffmpeg_mod, "FFMPEG", pin)
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("AITK_ALLOW_UNVERIFIED", raising=False)
    row = next(r for r in tools.report_tools(checkout) if r["tool"] == "ffmpeg")
    assert (row["used"], row["ok"], row["verified"], row["version"]) == (
        "local", True, True, "9.0.2")
    assert row["shared_libraries"] is False and row["checksum"].startswith("PyPI")
    json.dumps(row)  # the --json document carries it as it is
    line = judge_tool("ffmpeg", row)
    assert line.status is Status.OK and "no shared libraries" in line.detail
    # torchcodec needs the libraries: the static program does not make it available.
    assert not tools.available(checkout, "ffmpeg")

    # Children find it first on PATH, and get no library path for it.
    env = tools.child_env(checkout)
    assert env["PATH"].split(os.pathsep)[0] == str(checkout.ffmpeg_dir / "bin")
    assert "AITK_FFMPEG_LIB_DIR" not in env and "LD_LIBRARY_PATH" not in env
    shown = subprocess.run(["/bin/sh", "-c", "command -v ffmpeg && ffmpeg -version"],
                           env={**os.environ, **env}, capture_output=True, text=True)
    assert shown.stdout.splitlines() == [str(exe_path), VERSION_LINE]


def test_other_bytes_than_the_index_digest_are_refused(server, client, fast_retry, quiet,
                                                       checkout):
    wheel = ffmpeg_wheel()
    pin = wheel_pin(wheel)
    other = ffmpeg_wheel(("ffmpeg-linux-x86_64-v6.6.6",))
    server.add(f"pypi/{pin.artefact(LINUX_X64).path}", other)
    before = outside_staging(checkout.root)
    with pytest.raises(download.DownloadError, match="SHA-256 mismatch"):
        Ffmpeg(pin).install(checkout, LINUX_X64, ctx_for(server, client, fast_retry, quiet))
    assert outside_staging(checkout.root) == before and not checkout.ffmpeg_dir.exists()


def test_wheel_without_a_single_program_is_refused(server, client, fast_retry, quiet,
                                                   checkout):
    for binaries in ((), ("ffmpeg-a-v1", "ffmpeg-b-v1")):
        wheel = ffmpeg_wheel(binaries)
        pin = wheel_pin(wheel)
        server.add(f"pypi/{pin.artefact(LINUX_X64).path}", wheel)
        with pytest.raises(tools.ToolUnavailable, match="no single"):
            Ffmpeg(pin).install(checkout, LINUX_X64, ctx_for(server, client, fast_retry, quiet))
        assert not checkout.ffmpeg_dir.exists()


def test_cli_refuses_a_mirror_serving_other_bytes_under_the_real_pin(server, checkout,
                                                                     tmp_path, tools_cli):
    """`tools --provision` with AITK_FFMPEG_MIRROR: the real pinned digest is checked."""
    plat = current_platform()
    art = FFMPEG.artefact(plat)
    if art is None:
        pytest.skip("no FFmpeg wheel pinned for this platform")
    server.add(f"ff/{art.path}", ffmpeg_wheel())
    done = tools_cli(checkout, str(tmp_path / "empty"), "--provision", "--json",
                   extra={"AITK_FFMPEG_MIRROR": server.url("ff"),
                          "AITK_UV_MIRROR": server.url("uv"),
                          "AITK_NODE_MIRROR": server.url("node")})
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    outcome = doc["data"]["provisioned"]["ffmpeg"]
    assert outcome["status"] == "failed" and "SHA-256 mismatch" in outcome["detail"]
    assert len(server.hits(f"ff/{art.path}")) == 1
    assert not checkout.ffmpeg_dir.exists()
    row = next(r for r in doc["data"]["tools"] if r["tool"] == "ffmpeg")
    assert (row["used"], row["ok"]) == (None, False)


def test_every_platform_gets_the_wheel_and_its_index_digest():
    for plat in PLATFORMS:
        art = FFMPEG.artefact(plat)
        assert art is not None and art.kind == "wheel" and art.size
        assert art.filename.startswith("imageio_ffmpeg-0.8.1-py3-none-")
        assert art.sha256 and len(art.sha256) == 64
    assert FFMPEG.mirror_env == "AITK_FFMPEG_MIRROR"
    assert Ffmpeg().refusal(LINUX_X64, Settings()) is None  # verifiable: never opt-in


def test_shared_build_only_with_the_opt_in_where_one_is_pinned():
    assert select_pin(frozenset(), LINUX_X64) is FFMPEG
    assert select_pin(frozenset({"ffmpeg"}), LINUX_X64) is FFMPEG_SHARED
    assert select_pin(frozenset({"ffmpeg"}), MACOS_ARM64) is FFMPEG  # none pinned there
    chosen = Ffmpeg.from_env({"AITK_ALLOW_UNVERIFIED": "git, FFmpeg"}, LINUX_X64)
    assert chosen.pin is FFMPEG_SHARED and chosen.name == "ffmpeg"


def test_system_program_is_enough_unless_the_shared_build_is_wanted(checkout, tmp_path,
                                                                    monkeypatch):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "ffmpeg").write_text(f"#!/bin/sh\necho '{VERSION_LINE}'\n")
    (tmp_path / "bin" / "ffmpeg").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    static = Ffmpeg(find_library=lambda name: None)
    found = static.resolve(checkout, LINUX_X64)
    assert (found.used, found.ok) == ("system", True)
    assert static.report_extra(found, checkout, LINUX_X64) == {"shared_libraries": False}
    assert not static.serves_packages(found, checkout, LINUX_X64)
    wanted = Ffmpeg(FFMPEG_SHARED, find_library=lambda name: None).resolve(checkout, LINUX_X64)
    assert not wanted.ok and "libavcodec" in wanted.detail


def test_a_shared_build_installed_with_the_opt_in_stays_trusted_without_it(checkout,
                                                                           monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    art = FFMPEG_SHARED.artefact(LINUX_X64)
    bin_dir = checkout.ffmpeg_dir / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "ffmpeg").write_text("#!/bin/sh\necho 'ffmpeg version n7.1 Copyright'\n")
    (bin_dir / "ffmpeg").chmod(0o755)
    (checkout.ffmpeg_dir / "lib").mkdir()
    (checkout.ffmpeg_dir / "lib" / "libavcodec.so.61").write_bytes(b"\x7fELF")
    archive.write_marker(checkout.ffmpeg_dir, archive.Marker(
        "ffmpeg", FFMPEG_SHARED.version, art.filename, "http://x", "ab" * 32, False))
    tool = Ffmpeg(find_library=lambda name: None)
    found = tool.resolve(checkout, LINUX_X64)
    assert (found.used, found.version, found.ok, found.verified) == ("local", "7.1", True, False)
    assert tool.serves_packages(found, checkout, LINUX_X64)
    assert tool.lib_dirs(checkout.ffmpeg_dir, LINUX_X64) == [checkout.ffmpeg_dir / "lib"]
    # A marker for something else is still not trusted.
    archive.write_marker(checkout.ffmpeg_dir, archive.Marker(
        "ffmpeg", "7.0", art.filename, "http://x", "ab" * 32, False))
    assert not tool.resolve(checkout, LINUX_X64).ok


def test_tools_table_says_what_a_static_program_cannot_do():
    from io import StringIO

    from rich.console import Console

    console = Console(file=StringIO(), width=400)
    tools_command.render(console, {"platform": "linux-x86_64", "tools": [{
        "tool": "ffmpeg", "used": "local", "version": "9.0.2", "minimum": "6.0", "ok": True,
        "verified": True, "path": "/c/.ffmpeg/bin/ffmpeg", "detail": "",
        "shared_libraries": False}]})
    text = console.file.getvalue()
    assert "program only" in text and "AITK_ALLOW_UNVERIFIED=ffmpeg" in text


def test_a_recorded_ffmpeg_skip_is_unblocked_by_the_verifiable_wheel():
    """A checkout whose last tools step skipped FFmpeg (the old unverified pin) gets it on
    the next sync: it is no longer refused, with or without the opt-in."""
    from manager.envstatus import _tools_unblocked

    assert _tools_unblocked({"ffmpeg"}) == {"ffmpeg"}
    assert not tools.refused("ffmpeg", {})
    assert _tools_unblocked(set()) == frozenset()
    if current_platform()[0] != "windows":  # git is never provisioned here: stays blocked
        assert _tools_unblocked({"git"}) == frozenset()
