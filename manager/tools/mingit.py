"""git: the system's everywhere; on Windows without one, MinGit in `.mingit/`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from manager.paths import Paths
from manager.tools.lifecycle import Tool
from manager.tools.pins import MINGIT, Platform, ToolPin


class MinGit(Tool):
    exe_name = "git"

    def __init__(self, pin: ToolPin = MINGIT, **kwargs: Any) -> None:
        super().__init__(pin, **kwargs)

    def target(self, paths: Paths) -> Path:
        return paths.mingit_dir

    def local_exe(self, root: Path, plat: Platform) -> Path:
        return root / "cmd" / self.exe_file(plat)
