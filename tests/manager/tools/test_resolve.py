"""Which copy is used: the system's when good enough, else a trusted local one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from manager import archive
from manager.tools.ffmpeg import Ffmpeg
from manager.tools.lifecycle import meets, parse_version
from manager.tools.node import Node
from manager.tools.pins import FFMPEG, FFMPEG_SHARED, LINUX_X64, NODE

PLAT = LINUX_X64
pytestmark = pytest.mark.skipif(os.name == "nt", reason="stand-in binaries are sh scripts")


def fake(folder: Path, name: str, output: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\necho '{output}'\n")
    path.chmod(0o755)
    return path


def trusted_node(checkout) -> None:
    art = NODE.artefact(PLAT)
    fake(checkout.node_dir / "bin", "node", "v22.12.0")
    archive.write_marker(checkout.node_dir, archive.Marker(
        "node", NODE.version, art.filename, "http://x", "ab" * 32, True))


def test_good_system_node_is_preferred(checkout, tmp_path, monkeypatch):
    trusted_node(checkout)
    fake(tmp_path / "bin", "node", "v22.1.0")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    found = Node().resolve(checkout, PLAT)
    assert (found.used, found.version, found.ok) == ("system", "22.1.0", True)


def test_too_old_system_node_is_ignored(checkout, tmp_path, monkeypatch):
    fake(tmp_path / "bin", "node", "v18.19.0")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    found = Node().resolve(checkout, PLAT)
    assert found.used is None and not found.ok
    assert "18.19.0 is older than 20.0.0" in found.detail
    trusted_node(checkout)
    found = Node().resolve(checkout, PLAT)
    assert (found.used, found.version) == ("local", "22.12.0")


def test_own_folders_on_path_do_not_count_as_system(checkout, monkeypatch):
    trusted_node(checkout)
    monkeypatch.setenv("PATH", str(checkout.node_dir / "bin"))
    assert Node().system(checkout, PLAT) is None
    assert Node().resolve(checkout, PLAT).used == "local"


def test_local_copy_without_marker_is_not_trusted(checkout, monkeypatch):
    monkeypatch.setenv("PATH", "")
    fake(checkout.node_dir / "bin", "node", "v22.12.0")
    found = Node().local(checkout, PLAT)
    assert found is not None and not found.ok and "not the pinned" in found.detail
    assert not Node().resolve(checkout, PLAT).ok


def test_system_ffmpeg_needs_shared_libraries(checkout, tmp_path, monkeypatch):
    fake(tmp_path / "bin", "ffmpeg", "ffmpeg version 7.0.2-3 Copyright (c) 2000-2024")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    without = Ffmpeg(FFMPEG_SHARED, find_library=lambda name: None).resolve(checkout, PLAT)
    assert not without.ok and "libavutil" in without.detail
    assert "AITK_ALLOW_UNVERIFIED=ffmpeg" in without.detail
    shared = Ffmpeg(FFMPEG_SHARED, find_library=lambda name: f"lib{name}.so.61")
    found = shared.resolve(checkout, PLAT)
    assert (found.used, found.version, found.ok) == ("system", "7.0.2", True)


def test_old_system_ffmpeg_is_ignored(checkout, tmp_path, monkeypatch):
    fake(tmp_path / "bin", "ffmpeg", "ffmpeg version 5.1.6-0+deb12u1 Copyright (c) 2000-2024")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    found = Ffmpeg(find_library=lambda name: "x").resolve(checkout, PLAT)
    assert not found.ok and f"older than {FFMPEG.minimum}" in found.detail


@pytest.mark.parametrize(("text", "version"), [
    ("v20.20.2", "20.20.2"), ("uv 0.13.9 (abc 2025-01-01)", "0.13.9"),
    ("git version 2.39.5", "2.39.5"), ("git version 2.47.1.windows.2", "2.47.1"),
    ("ffmpeg version n7.1-62-gb168ed9b14", "7.1"), ("no digits", None),
])
def test_parse_version(text, version):
    assert parse_version(text) == version


def test_meets():
    assert meets("20.0.0", "20.0.0") and meets("22.1", "20.0.0")
    assert not meets("19.9.9", "20.0.0") and not meets(None, "1.0")
