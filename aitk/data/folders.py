"""Listing a dataset (or control) folder without a traceback: a folder that cannot be
listed is a DatasetError (one line, exit 2), an entry that cannot even be looked at is
not a file. Light (no torch): the preflight and the audits list folders too.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from aitk.errors import DatasetError


def folder_entries(folder: Path) -> list[Path]:
    """A dataset (or control) folder's entries, sorted by name; DatasetError when the
    folder cannot be listed (permissions, a mount that went away)."""
    try:
        return sorted(folder.iterdir())
    except OSError as exc:
        raise DatasetError(f"cannot list {folder} ({exc.strerror or exc})") from None


def is_regular_file(path: Path) -> bool:
    """`path.is_file()`, False when it cannot even be looked at (the reader says so)."""
    try:
        return path.is_file()
    except OSError:
        return False


def stem_index(paths: Iterable[Path]) -> dict[str, Path]:
    """stem -> file: how a control folder pairs with its images (`a.jpg` pairs with
    `ctrl/a.png`); of two files with one stem, the first by name wins."""
    found: dict[str, Path] = {}
    for path in sorted(paths):
        found.setdefault(path.stem, path)
    return found
