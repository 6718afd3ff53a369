"""uv: the system's when new enough, else the binary from uv's PyPI wheel in `.uv/`.

`.uv/uv` is where the bootstrap (manager/__main__.py) looks, and `.uv/python` holds the
uv-managed Pythons, so `.uv/` is not replaced as a folder: the binaries are renamed into
place one by one and the marker is written last (a copy whose marker does not match is
not trusted, so a crash in between only causes a reinstall).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from manager import archive
from manager.paths import Paths
from manager.tools.lifecycle import Tool, ToolUnavailable
from manager.tools.pins import UV, Platform, ToolPin


class Uv(Tool):
    exe_name = "uv"

    def __init__(self, pin: ToolPin = UV, **kwargs: Any) -> None:
        super().__init__(pin, **kwargs)

    def target(self, paths: Paths) -> Path:
        return paths.uv_dir

    def local_exe(self, root: Path, plat: Platform) -> Path:
        return root / self.exe_file(plat)

    def place(self, unpacked: Path, paths: Paths, plat: Platform,
              marker: archive.Marker) -> None:
        scripts = sorted(unpacked.glob("*.data/scripts"))
        if len(scripts) != 1:
            raise ToolUnavailable("uv: the wheel has no single *.data/scripts folder")
        binaries = [p for p in scripts[0].iterdir() if p.is_file()]
        main = scripts[0] / self.exe_file(plat)
        self.check_runs(main)
        target = self.target(paths)
        target.mkdir(parents=True, exist_ok=True)
        (target / archive.MARKER_NAME).unlink(missing_ok=True)  # untrusted until complete
        # uv before uvx & co: the one the manager runs is in place first.
        for binary in sorted(binaries, key=lambda p: p != main):
            archive.publish_file(binary, target / binary.name)
        archive.write_marker(target, marker)


def python_dir(paths: Paths) -> Path:
    """Where uv keeps the Pythons it manages (UV_PYTHON_INSTALL_DIR for children)."""
    return paths.uv_dir / "python"
