"""FFmpeg with shared libraries (video decoding loads libavcodec & co. at run time).

A system FFmpeg is used only when it is new enough and the dynamic loader finds its
shared libraries; otherwise the pinned shared build goes to `.ffmpeg/` (bin/, lib/).
"""

from __future__ import annotations

import ctypes.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

from manager.paths import Paths
from manager.tools.lifecycle import Tool, parse_version
from manager.tools.pins import FFMPEG, Platform, ToolPin

SHARED_LIBS = ("avutil", "avcodec", "avformat")


class Ffmpeg(Tool):
    exe_name = "ffmpeg"
    version_flag = "-version"

    def __init__(self, pin: ToolPin = FFMPEG, *,
                 find_library: Callable[[str], str | None] = ctypes.util.find_library,
                 **kwargs: Any) -> None:
        super().__init__(pin, **kwargs)
        self.find_library = find_library

    def target(self, paths: Paths) -> Path:
        return paths.ffmpeg_dir

    def local_exe(self, root: Path, plat: Platform) -> Path:
        return root / "bin" / self.exe_file(plat)

    def lib_dirs(self, root: Path, plat: Platform) -> list[Path]:
        # Windows finds DLLs on PATH, and the build keeps them beside the programs.
        return [root / ("bin" if plat[0] == "windows" else "lib")]

    def version_of(self, exe: Path) -> str | None:
        # A staged or local build finds its libraries through lib/ beside bin/.
        lib = str(exe.parent.parent / "lib")
        extra = {"LD_LIBRARY_PATH": lib, "DYLD_LIBRARY_PATH": lib}
        done = self.runner([str(exe), self.version_flag], timeout=30, extra_env=extra)
        if not done.ok:
            return None
        first = (done.stdout or done.stderr).splitlines()[:1]
        return parse_version(first[0].split("Copyright")[0]) if first else None

    def system_problem(self, exe: Path, plat: Platform) -> str | None:
        missing = [name for name in SHARED_LIBS if not self.find_library(name)]
        if missing:
            libs = ", ".join(f"lib{name}" for name in missing)
            return f"system ffmpeg has no shared libraries on the loader path ({libs})"
        return None
