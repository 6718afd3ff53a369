"""Rename the legacy `gradient_accumulation_steps` key to `gradient_accumulation` in the
user's job configs under `config/`.

Configs written for older upstream releases carry the legacy name; with both names
around, a job can end up with an accumulation the user did not ask for. Only keys are
renamed: the positions come from YAML's own scanner, so the same words inside a string
(a prompt, a block scalar, a quoted value) are never touched, and comments and layout
stay as they are. Each changed file is first copied to `<file>.pre-<ID>.bak`, and the new
text replaces the old atomically with the same mode. A config that is a symlink stays
one: the file it points to is rewritten, when it lies inside the checkout; a link that
leads outside the checkout is left alone, with a note.

Left alone: files tracked by git (the shipped examples; editing them would make the
checkout dirty and block the next update), files that already use the new name (both
names at once is for the trainer's validation to report), files that are not UTF-8 or
not valid YAML.
"""

from __future__ import annotations

from pathlib import Path

from aitk_common.files import atomic_write_bytes, atomic_write_text
from manager.errors import ManagerError

ID = "001_gradient_accumulation_key"
DESCRIPTION = ("rename the legacy config key gradient_accumulation_steps to "
               "gradient_accumulation in config/*.yaml (with a backup)")

LEGACY_KEY = "gradient_accumulation_steps"
CURRENT_KEY = "gradient_accumulation"
_SUFFIXES = (".yaml", ".yml")


def key_spans(text: str) -> list[tuple[int, int, str]] | None:
    """(start, end, name) of every mapping key in `text`; None when it is not YAML.
    Scanning only: nothing is constructed and aliases are never expanded."""
    try:
        import yaml  # the trainer's dependency, installed before migrations run
    except ImportError as exc:
        raise ManagerError("PyYAML is not installed in .venv (requirements.txt has it)") \
            from exc
    try:
        tokens = list(yaml.scan(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError:
        return None
    return [(tok.start_mark.index, tok.end_mark.index, tok.value)
            for before, tok in zip(tokens, tokens[1:], strict=False)
            if isinstance(before, yaml.KeyToken) and isinstance(tok, yaml.ScalarToken)]


def convert(text: str) -> str | None:
    """The converted text, or None when there is nothing (safe) to change."""
    spans = key_spans(text)
    if spans is None:
        return None
    names = {name for _, _, name in spans}
    if LEGACY_KEY not in names or CURRENT_KEY in names:
        return None
    out = text
    for start, end, name in sorted(spans, reverse=True):  # from the end: indexes hold
        if name == LEGACY_KEY:
            out = out[:start] + out[start:end].replace(LEGACY_KEY, CURRENT_KEY) + out[end:]
    return out


def backup_path(path: Path) -> Path:
    return path.with_name(f"{path.name}.pre-{ID}.bak")


def run(root: Path) -> list[str]:
    """Convert the user's configs; return notes about files deliberately left alone."""
    folder = root / "config"
    if not folder.is_dir():
        return []
    tracked = _tracked(root)
    real_root = root.resolve()
    notes: list[str] = []
    for path in sorted(folder.rglob("*")):
        if path.suffix.lower() not in _SUFFIXES or not path.is_file():
            continue
        relative = path.relative_to(root).as_posix()
        if relative in tracked or relative.startswith("config/examples/"):
            continue
        target = path.resolve()  # a symlink is rewritten at its target, never replaced
        if path.is_symlink():
            try:
                inside = target.relative_to(real_root).as_posix()
            except ValueError:
                if _needs_conversion(target):
                    notes.append(f"{relative} links to {target}, outside the checkout: left "
                                 f"as it is (rename {LEGACY_KEY} there yourself, or keep it: "
                                 "the trainer still reads it)")
                continue
            if inside in tracked:
                continue
        _convert_file(target, backup_path(path))
    return notes


def _needs_conversion(path: Path) -> bool:
    try:
        return convert(path.read_bytes().decode("utf-8")) is not None
    except (OSError, UnicodeDecodeError):
        return False


def _convert_file(path: Path, backup: Path) -> None:
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return
    converted = convert(text)
    if converted is None:
        return
    # The config's own mode for both: the backup is the user's file like any other (it
    # follows their umask as the config did) and no more readable than the original.
    mode = path.stat().st_mode & 0o7777
    if not backup.exists():  # a retry keeps the first (original) backup
        atomic_write_bytes(backup, raw, mode=mode)
    atomic_write_text(path, converted, mode=mode)


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
