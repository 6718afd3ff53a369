"""The settings page's stored values: the Hugging Face token, kept owner-only (0600) in
the data folder and never sent back (the page learns only whether one is set); the
trainer gets it as HF_TOKEN. The folders and host names are the server's start options
(shown, changed by restarting with --datasets-dir / --outputs-dir / --allowed-host)."""

from __future__ import annotations

from pathlib import Path

from aitk_common.files import atomic_write_text

TOKEN_FILE = "hf_token"
MAX_TOKEN_CHARS = 512


class PreferenceError(ValueError):
    pass


def token_path(data_dir: Path) -> Path:
    return data_dir / TOKEN_FILE


def has_token(data_dir: Path) -> bool:
    return token_path(data_dir).is_file()


def read_token(data_dir: Path) -> str | None:
    try:
        return token_path(data_dir).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def set_token(data_dir: Path, token: str) -> None:
    """Store (or, with "", forget) the token; owner-only from its first byte."""
    token = token.strip()
    if not token:
        token_path(data_dir).unlink(missing_ok=True)
        return
    if len(token) > MAX_TOKEN_CHARS or not token.isascii() or any(
            c.isspace() or ord(c) < 0x21 for c in token):
        raise PreferenceError("a Hugging Face token is one word of printable ASCII")
    data_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(token_path(data_dir), token + "\n", mode=0o600)
