"""File routes never leave their folder: a request path is resolved (symlinks
followed) and must still be inside the folder it was asked under."""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

SIMPLE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._ -]{0,127}$")


def inside(base: Path, relative: str) -> Path | None:
    """`base/relative`, or None when it would leave `base` (.., absolute, a symlink
    pointing out) or does not exist."""
    rel = PurePosixPath(relative.replace("\\", "/"))
    if rel.is_absolute() or ".." in rel.parts or not rel.parts or "\0" in relative:
        return None
    try:
        real_base = base.resolve(strict=True)
        target = (base / rel).resolve(strict=True)
    except (OSError, RuntimeError, ValueError):  # missing, a symlink loop, a NUL
        return None
    return target if target.is_relative_to(real_base) else None


def simple_name(name: str) -> bool:
    """A single folder or file name: no separators, no leading dot."""
    return bool(SIMPLE_NAME.match(name)) and name not in (".", "..")
