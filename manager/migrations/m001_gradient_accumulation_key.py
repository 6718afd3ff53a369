"""Rename the legacy `gradient_accumulation_steps` key to `gradient_accumulation` in the
user's job configs under `config/`.

Configs written for older upstream releases carry the legacy name; with both names
around, a job can end up with an accumulation the user did not ask for. The rename is
textual (comments and layout stay as they are), each changed file is first copied to
`<file>.pre-<ID>.bak`, and the new text replaces the old atomically with the same mode.

Left alone: files tracked by git (the shipped examples; editing them would make the
checkout dirty and block the next update), files that already use the new name (both
names at once is for the trainer's validation to report), and files that are not UTF-8.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from manager.files import atomic_write_bytes, atomic_write_text

ID = "001_gradient_accumulation_key"
DESCRIPTION = ("rename the legacy config key gradient_accumulation_steps to "
               "gradient_accumulation in config/*.yaml (with a backup)")

_LEGACY = re.compile(r"^(\s*(?:-\s+)?)(['\"]?)gradient_accumulation_steps\2(\s*:)", re.MULTILINE)
_CURRENT = re.compile(r"^\s*(?:-\s+)?(['\"]?)gradient_accumulation\1\s*:", re.MULTILINE)
_SUFFIXES = (".yaml", ".yml")


def convert(text: str) -> str | None:
    """The converted text, or None when there is nothing (safe) to change."""
    if not _LEGACY.search(text) or _CURRENT.search(text):
        return None
    return _LEGACY.sub(r"\1\2gradient_accumulation\2\3", text)


def backup_path(path: Path) -> Path:
    return path.with_name(f"{path.name}.pre-{ID}.bak")


def run(root: Path) -> None:
    folder = root / "config"
    if not folder.is_dir():
        return
    tracked = _tracked(root)
    for path in sorted(folder.rglob("*")):
        if path.suffix.lower() not in _SUFFIXES or not path.is_file():
            continue
        relative = path.relative_to(root).as_posix()
        if relative in tracked or relative.startswith("config/examples/"):
            continue
        _convert_file(path)


def _convert_file(path: Path) -> None:
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return
    converted = convert(text)
    if converted is None:
        return
    backup = backup_path(path)
    if not backup.exists():  # a retry keeps the first (original) backup
        atomic_write_bytes(backup, raw)
    mode = path.stat().st_mode & 0o7777
    atomic_write_text(path, converted)
    os.chmod(path, mode)


def _tracked(root: Path) -> set[str]:
    """Paths under config/ that git tracks; empty when this is not a git checkout."""
    import git  # the manager's venv has GitPython; imported here to keep discovery cheap

    try:
        repo = git.Repo(root)
        listed = repo.git.ls_files("-z", "--", "config")
    except (git.InvalidGitRepositoryError, git.NoSuchPathError, git.GitCommandError,
            git.GitCommandNotFound):
        return set()
    return {p for p in listed.split("\0") if p}
