"""Node.js: system node >= the pin's minimum, else the pinned LTS in `.node/`.

No digest is pinned for Node: the archive is verified against the vendor's
SHASUMS256.txt, fetched from the same (mirrorable) release folder at download time.
An older local copy has a marker for another version, so it is not trusted and the
next provisioning replaces it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from manager.paths import Paths
from manager.tools.lifecycle import Context, Tool, ToolUnavailable
from manager.tools.pins import NODE, Artefact, Platform, ToolPin


class Node(Tool):
    exe_name = "node"

    def __init__(self, pin: ToolPin = NODE, **kwargs: Any) -> None:
        super().__init__(pin, **kwargs)

    def target(self, paths: Paths) -> Path:
        return paths.node_dir

    def local_exe(self, root: Path, plat: Platform) -> Path:
        # Windows archives keep node.exe at the top; the others in bin/.
        if plat[0] == "windows":
            return root / "node.exe"
        return root / "bin" / "node"

    def expected_sha256(self, art: Artefact, ctx: Context) -> str | None:
        from manager import download  # only when installing (see lifecycle.py)

        if not self.pin.checksum_list:
            return art.sha256
        url = ctx.settings.url(self.pin, self.pin.checksum_list)
        text = download.fetch_text(url, client=ctx.client, retry=ctx.retry)
        digest = parse_shasums(text).get(art.filename)
        if digest is None:
            raise ToolUnavailable(f"node: {art.filename} is not listed in {url}",
                                  hint="the mirror does not hold this release")
        return digest


def parse_shasums(text: str) -> dict[str, str]:
    """`<sha256>  <file>` lines (sha256sum format) -> {file: sha256}."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and len(parts[0]) == 64:
            try:
                int(parts[0], 16)
            except ValueError:
                continue
            out[parts[1].lstrip("*")] = parts[0].lower()
    return out
