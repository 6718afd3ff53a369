"""The driver (one tool failing never stops the others), the environment for children,
and `manager tools --json` end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import manager.tools as tools
from manager import archive
from manager.tools.ffmpeg import Ffmpeg
from manager.tools.lifecycle import Context, Settings
from manager.tools.mingit import MinGit
from manager.tools.node import Node
from manager.tools.pins import FFMPEG_SHARED, LINUX_X64, MACOS_ARM64, UV, WINDOWS_X64
from manager.tools.uv import Uv
from tests.manager.tools.builders import make_zip, sha

PLAT = LINUX_X64
pytestmark = pytest.mark.skipif(os.name == "nt", reason="stand-in binaries are sh scripts")


def fake(folder: Path, name: str, output: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(f"#!/bin/sh\necho '{output}'\n")
    (folder / name).chmod(0o755)


def test_one_failing_tool_does_not_stop_the_others(server, client, fast_retry, quiet, checkout,
                                                   tmp_path, monkeypatch):
    fake(tmp_path / "bin", "node", "v22.1.0")
    fake(tmp_path / "bin", "git", "git version 2.40.1")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    ctx = Context(Settings({"uv": server.url("uv")}), client=client, retry=fast_retry,
                  reporter=quiet)
    notes: list[str] = []
    # uv's wheel is not on the mirror (404), ffmpeg has no checksum and no opt-in.
    ffmpeg = Ffmpeg(FFMPEG_SHARED, find_library=lambda n: None)  # the opt-in build
    out = tools.provision([Uv(), Node(), ffmpeg, MinGit()], checkout, PLAT, ctx, notes.append)
    assert {k: v["status"] for k, v in out.items()} == {
        "uv": "failed", "node": "system", "ffmpeg": "skipped", "git": "system"}
    assert "404" in out["uv"]["detail"] and out["node"]["version"] == "22.1.0"
    assert any(n.startswith("warning: uv could not be provisioned") for n in notes)
    assert any(n.startswith("warning: ffmpeg skipped") for n in notes)


def test_git_is_never_provisioned_outside_windows(checkout, monkeypatch, quiet):
    monkeypatch.setenv("PATH", "")
    out = tools.provision([MinGit()], checkout, PLAT, Context(Settings(), reporter=quiet),
                          lambda _m: None)
    assert out["git"]["status"] == "skipped"
    assert "package manager" in out["git"]["detail"]


@pytest.mark.parametrize(("plat", "lib_var", "sep"), [
    (LINUX_X64, "LD_LIBRARY_PATH", ":"), (MACOS_ARM64, "DYLD_LIBRARY_PATH", ":"),
])
def test_compose_env_posix(plat, lib_var, sep):
    base = {"PATH": "/usr/bin", lib_var: "/opt/lib"}
    env = tools.compose_env(plat, [Path("/c/.node/bin")], [Path("/c/.ffmpeg/lib")], base,
                            Path("/c/.uv/python"))
    assert env["PATH"] == sep.join(["/c/.node/bin", "/usr/bin"])
    assert env[lib_var] == sep.join(["/c/.ffmpeg/lib", "/opt/lib"])
    assert env["AITK_FFMPEG_LIB_DIR"] == "/c/.ffmpeg/lib"
    assert env["UV_PYTHON_INSTALL_DIR"] == "/c/.uv/python"


def test_compose_env_windows_puts_dlls_on_path():
    env = tools.compose_env(WINDOWS_X64, [Path("C:/c/.mingit/cmd")], [Path("C:/c/.ffmpeg/bin")],
                            {"PATH": "C:/Windows"}, Path("C:/c/.uv/python"))
    assert env["PATH"].split(";") == [str(Path("C:/c/.mingit/cmd")),
                                      str(Path("C:/c/.ffmpeg/bin")), "C:/Windows"]
    assert "LD_LIBRARY_PATH" not in env


def test_child_env_points_children_at_local_ffmpeg(checkout, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    plat = tools.current_platform()
    art = FFMPEG_SHARED.artefact(plat)
    if art is None:
        pytest.skip("no shared FFmpeg build is pinned for this platform")
    fake(checkout.ffmpeg_dir / "bin", "ffmpeg", "ffmpeg version n7.1 Copyright")
    (checkout.ffmpeg_dir / "lib").mkdir()
    (checkout.ffmpeg_dir / "lib" / "libavutil.so.59").write_bytes(b"\x7fELF")
    archive.write_marker(checkout.ffmpeg_dir, archive.Marker(
        "ffmpeg", FFMPEG_SHARED.version, art.filename, "http://x", "ab" * 32, False))
    env = tools.child_env(checkout)
    lib = str(checkout.ffmpeg_dir / "lib")
    assert env["PATH"].split(os.pathsep)[0] == str(checkout.ffmpeg_dir / "bin")
    # A child started with this environment sees the library path from its start.
    code = "import os; print(os.environ['LD_LIBRARY_PATH'])"
    shown = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env},
                           capture_output=True, text=True, check=True)
    assert shown.stdout.split(":")[0].strip() == lib


def test_tools_json_reports_system_and_missing(checkout, tmp_path, tools_cli):
    fake(tmp_path / "bin", "node", "v22.1.0")
    fake(tmp_path / "bin", "git", "git version 2.40.1")
    done = tools_cli(checkout, str(tmp_path / "bin"), "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["command"] == "tools" and doc["ok"]
    rows = {r["tool"]: r for r in doc["data"]["tools"]}
    assert set(rows) == {"uv", "node", "ffmpeg", "git"}
    assert (rows["node"]["used"], rows["node"]["version"], rows["node"]["ok"]) == (
        "system", "22.1.0", True)
    assert rows["git"]["used"] == "system" and rows["git"]["minimum"] == "2.25.0"
    assert rows["uv"]["used"] is None and not rows["uv"]["ok"]
    assert rows["uv"]["local_dir"] == str(checkout.uv_dir)


def test_tools_provision_uses_the_mirror_and_verifies(server, checkout, tmp_path, tools_cli):
    fake(tmp_path / "bin", "node", "v22.1.0")
    fake(tmp_path / "bin", "git", "git version 2.40.1")
    plat = tools.current_platform()
    if UV.artefact(plat) is None:
        pytest.skip("no uv pin for this platform")
    # The mirror serves other bytes under the real pinned path: refused, nothing installed.
    server.add(f"uv/{UV.artefact(plat).path}", make_zip([]))
    done = tools_cli(checkout, str(tmp_path / "bin"), "--provision", "--json",
                   extra={"AITK_UV_MIRROR": server.url("uv"),
                          "AITK_FFMPEG_MIRROR": server.url("ff")})
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["data"]["provisioned"]["uv"]["status"] == "failed"
    assert "SHA-256 mismatch" in doc["data"]["provisioned"]["uv"]["detail"]
    # FFmpeg's wheel is not on its mirror (404): a failure of its own, nothing else.
    assert doc["data"]["provisioned"]["ffmpeg"]["status"] in ("failed", "system")
    assert len(server.hits(f"uv/{UV.artefact(plat).path}")) == 1
    assert not checkout.uv_dir.exists()
    assert any("warning: uv" in m for m in doc["messages"])
    assert sha(b"") not in done.stdout  # nothing fake is reported as a digest


def _loaded_library(*names: str) -> str | None:
    """The file of a shared library this process has mapped (a real .so to copy)."""
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "/" in line}
    for name in names:
        for path in sorted(paths):
            if Path(path).name.startswith(name):
                return path
    return None


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")
def test_venv_python_child_loads_libraries_from_local_ffmpeg(checkout, monkeypatch):
    """The way that works: the library path is set when the interpreter starts."""
    import ctypes  # noqa: F401  (maps libffi into this process)

    lib = _loaded_library("libffi.so", "libm.so")
    if lib is None:
        pytest.skip("no shared library to copy")
    monkeypatch.setenv("PATH", "/nonexistent")
    art = FFMPEG_SHARED.artefact(tools.current_platform())
    if art is None:
        pytest.skip("no shared FFmpeg build is pinned for this platform")
    fake(checkout.ffmpeg_dir / "bin", "ffmpeg", "ffmpeg version n7.1 Copyright")
    (checkout.ffmpeg_dir / "lib").mkdir()
    (checkout.ffmpeg_dir / "lib" / "libaitkprobe.so").write_bytes(Path(lib).read_bytes())
    archive.write_marker(checkout.ffmpeg_dir, archive.Marker(
        "ffmpeg", FFMPEG_SHARED.version, art.filename, "http://x", "ab" * 32, False))
    code = "import ctypes; ctypes.CDLL('libaitkprobe.so'); print('loaded')"
    base = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    without = subprocess.run([sys.executable, "-c", code], env=base, capture_output=True,
                             text=True)
    assert without.returncode != 0  # not found by the loader on its own
    late = "import os, ctypes; os.environ['LD_LIBRARY_PATH'] = %r; ctypes.CDLL('libaitkprobe.so')"
    too_late = subprocess.run(
        [sys.executable, "-c", late % str(checkout.ffmpeg_dir / "lib")], env=base,
        capture_output=True, text=True)
    assert too_late.returncode != 0  # setting it inside a running interpreter does not help
    env = {**base, **tools.child_env(checkout)}
    with_env = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True)
    assert with_env.stdout.strip() == "loaded", with_env.stderr


def test_find_ensure_and_require_uv(server, checkout, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("AITK_UV_MIRROR", server.url("uv"))  # serves nothing: 404
    assert tools.find_uv(checkout) is None
    assert tools.ensure_uv(checkout) is None  # a warning, never an exception
    with pytest.raises(tools.ToolUnavailable) as info:
        tools.require("uv", checkout)
    assert "tools --provision" in info.value.hint
    fake(tmp_path / "bin", "uv", "uv 0.9.2 (abc 2025-01-01)")
    assert tools.find_uv(checkout) == tmp_path / "bin" / "uv"
    assert tools.ensure_uv(checkout) == tmp_path / "bin" / "uv"
    assert tools.require("uv", checkout) == tmp_path / "bin" / "uv"
