"""FFmpeg: the `ffmpeg` program by default, FFmpeg's shared libraries on request.

Two pins fill `.ffmpeg/` (bin/ffmpeg, and lib/ for a shared build):
- FFMPEG (default): the static program from imageio-ffmpeg's PyPI wheel, verified against
  the digest the index publishes. It has no libavcodec & co., so torchcodec (which loads
  them) cannot use it.
- FFMPEG_SHARED: the vendor's shared build (bin/, lib/), which torchcodec can load. It has
  no published digest, so it is used only when the user opts in with
  AITK_ALLOW_UNVERIFIED=ffmpeg (on a platform that has one).

A system FFmpeg new enough is used as it is; when the shared build is wanted, only if
the dynamic loader also finds its shared libraries.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from manager import archive
from manager.paths import Paths
from manager.tools.lifecycle import Found, Settings, Tool, ToolUnavailable, parse_version
from manager.tools.pins import FFMPEG, FFMPEG_SHARED, PINS, Platform, ToolPin

SHARED_LIBS = ("avutil", "avcodec", "avformat")
WHEEL_BINARIES = "imageio_ffmpeg/binaries"


def select_pin(allow_unverified: frozenset[str], plat: Platform) -> ToolPin:
    """The shared build when the user opted in and one is pinned here, else the wheel."""
    if "ffmpeg" in allow_unverified and FFMPEG_SHARED.artefact(plat) is not None:
        return FFMPEG_SHARED
    return FFMPEG


def _find_library(name: str) -> str | None:
    # ctypes.util starts ldconfig/gcc (it imports subprocess): only when a system FFmpeg
    # is checked for its shared libraries, never to read the local copy's marker.
    import ctypes.util

    return ctypes.util.find_library(name)


class Ffmpeg(Tool):
    exe_name = "ffmpeg"
    version_flag = "-version"

    def __init__(self, pin: ToolPin = FFMPEG, *,
                 find_library: Callable[[str], str | None] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(pin, **kwargs)
        self.find_library = find_library or _find_library

    @classmethod
    def from_env(cls, env: Mapping[str, str], plat: Platform, **kwargs: Any) -> Ffmpeg:
        return cls(select_pin(Settings.from_env(env, PINS).allow_unverified, plat), **kwargs)

    @property
    def name(self) -> str:
        return "ffmpeg"  # whichever pin fills .ffmpeg/

    @property
    def wants_shared(self) -> bool:
        return self.pin.tool == FFMPEG_SHARED.tool

    def target(self, paths: Paths) -> Path:
        return paths.ffmpeg_dir

    def local_exe(self, root: Path, plat: Platform) -> Path:
        return root / "bin" / self.exe_file(plat)

    def _lib_dir(self, root: Path, plat: Platform) -> Path:
        # Windows finds DLLs on PATH, and the shared build keeps them beside the programs.
        return root / ("bin" if plat[0] == "windows" else "lib")

    def has_shared_libs(self, root: Path, plat: Platform) -> bool:
        """A shared build has lib/ (Windows: DLLs in bin/); the static program has none."""
        folder = self._lib_dir(root, plat)
        if not folder.is_dir():
            return False
        return any(folder.glob("*.dll") if plat[0] == "windows" else folder.iterdir())

    def lib_dirs(self, root: Path, plat: Platform) -> list[Path]:
        return [self._lib_dir(root, plat)] if self.has_shared_libs(root, plat) else []

    def trusts(self, marker: archive.Marker | None, plat: Platform) -> bool:
        # A shared build the user installed with the opt-in stays trusted without it:
        # it does all the static program does, and more.
        if super().trusts(marker, plat):
            return True
        art = FFMPEG_SHARED.artefact(plat)
        return not self.wants_shared and art is not None and archive.marker_matches(
            marker, self.name, FFMPEG_SHARED.version, art.filename, art.sha256)

    def version_of(self, exe: Path) -> str | None:
        # A staged or local shared build finds its libraries through lib/ beside bin/.
        lib = str(exe.parent.parent / "lib")
        extra = {"LD_LIBRARY_PATH": lib, "DYLD_LIBRARY_PATH": lib}
        done = self.runner([str(exe), self.version_flag], timeout=30, extra_env=extra)
        if not done.ok:
            return None
        first = (done.stdout or done.stderr).splitlines()[:1]
        return parse_version(first[0].split("Copyright")[0]) if first else None

    def missing_system_libs(self) -> list[str]:
        return [f"lib{name}" for name in SHARED_LIBS if not self.find_library(name)]

    def system_problem(self, exe: Path, plat: Platform) -> str | None:
        missing = self.missing_system_libs() if self.wants_shared else []
        if missing:
            return (f"system ffmpeg has no shared libraries on the loader path "
                    f"({', '.join(missing)})")
        return None

    def shared_libraries(self, found: Found, paths: Paths, plat: Platform) -> bool:
        if not found.ok:
            return False
        if found.used == "local":
            return self.has_shared_libs(self.target(paths), plat)
        return not self.missing_system_libs()

    def serves_packages(self, found: Found, paths: Paths, plat: Platform) -> bool:
        return self.shared_libraries(found, paths, plat)

    def report_extra(self, found: Found, paths: Paths, plat: Platform) -> dict[str, object]:
        return {"shared_libraries": self.shared_libraries(found, paths, plat)}

    def place(self, unpacked: Path, paths: Paths, plat: Platform,
              marker: archive.Marker) -> None:
        art = self.pin.artefact(plat)
        if art is None or art.kind != "wheel":
            super().place(unpacked, paths, plat, marker)
            return
        # The wheel holds one program, imageio_ffmpeg/binaries/ffmpeg-<os>-<arch>-v<ver>.
        found = sorted(p for p in (unpacked / WHEEL_BINARIES).glob("ffmpeg-*") if p.is_file())
        if len(found) != 1:
            raise ToolUnavailable(f"ffmpeg: the wheel has no single {WHEEL_BINARIES}/ffmpeg-*")
        root = unpacked.parent / "ffmpeg"
        exe = self.local_exe(root, plat)
        exe.parent.mkdir(parents=True)
        shutil.move(found[0], exe)
        if os.name != "nt":
            exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        self.check_runs(exe)
        archive.write_marker(root, marker)
        archive.publish(root, self.target(paths))
