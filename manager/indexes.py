"""Where packages come from: the user's index/mirror configuration, and the torch source.

pip reads its own configuration (files and PIP_* variables), so the pip backend is only
given what we add. uv reads none of pip's configuration, so the same settings are handed
to it as flags, unless the user configured uv itself through UV_* variables. Mirrors and
offline setups therefore behave the same whichever installer runs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

TORCH_INDEX_ENV = "AITK_TORCH_INDEX_URL"
PYPI_WORD = "pypi"  # AITK_TORCH_INDEX_URL=pypi: default index + find-links


@dataclass(frozen=True)
class IndexConfig:
    """The user's package sources, merged from pip's config files and environment."""

    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    constraints: tuple[str, ...] = ()  # the user's own constraint files
    no_index: bool = False
    cert: str | None = None
    trusted_hosts: tuple[str, ...] = ()

    def describe(self) -> str:
        parts = [f"index {self.index_url or 'PyPI (default)'}"]
        if self.no_index:
            parts = ["no index"]
        parts += [f"extra index {u}" for u in self.extra_index_urls]
        parts += [f"find-links {f}" for f in self.find_links]
        return ", ".join(parts)


# pip option name -> IndexConfig field; list options are whitespace-separated.
_KEYS = {
    "index-url": "index_url",
    "extra-index-url": "extra_index_urls",
    "find-links": "find_links",
    "constraint": "constraints",
    "no-index": "no_index",
    "cert": "cert",
    "trusted-host": "trusted_hosts",
}
_LISTS = {"extra_index_urls", "find_links", "constraints", "trusted_hosts"}


def pip_config_files(environ: Mapping[str, str]) -> list[Path]:
    """pip's configuration files in the order pip loads them (later ones win)."""
    explicit = environ.get("PIP_CONFIG_FILE")
    if explicit == os.devnull:
        return []  # pip's documented way to load no configuration file at all
    files: list[Path] = []
    home = Path(environ.get("HOME") or Path.home())
    if sys.platform == "win32":
        program_data = environ.get("PROGRAMDATA", r"C:\ProgramData")
        files.append(Path(program_data) / "pip" / "pip.ini")
        appdata = environ.get("APPDATA")
        files.append(home / "pip" / "pip.ini")
        if appdata:
            files.append(Path(appdata) / "pip" / "pip.ini")
    else:
        xdg_dirs = environ.get("XDG_CONFIG_DIRS", "/etc/xdg").split(os.pathsep)
        files += [Path(d) / "pip" / "pip.conf" for d in xdg_dirs if d]
        files.append(Path("/etc/pip.conf"))
        files.append(home / ".pip" / "pip.conf")
        if sys.platform == "darwin":
            files.append(home / "Library" / "Application Support" / "pip" / "pip.conf")
        xdg_home = environ.get("XDG_CONFIG_HOME") or str(home / ".config")
        files.append(Path(xdg_home) / "pip" / "pip.conf")
    if explicit:
        files.append(Path(explicit))
    return files


def _truthy(value: str) -> bool:
    return value.strip().lower() in {"1", "true", "yes", "on"}


def _apply(values: dict[str, object], key: str, raw: str) -> None:
    # pip reads `index_url` and `--index-url` in its files as `index-url`; so do we
    name = _KEYS.get(key.lower().replace("_", "-").removeprefix("--"))
    if name is None:
        return
    if name in _LISTS:
        values[name] = tuple(raw.split())
    elif name == "no_index":
        values[name] = _truthy(raw)
    else:
        values[name] = raw.strip() or None


def read_config(environ: Mapping[str, str] | None = None,
                files: list[Path] | None = None) -> IndexConfig:
    """Merge pip's config files ([global], then [install]) and PIP_* variables."""
    import configparser  # only an install reads them: a no-op sync never gets here

    env = os.environ if environ is None else environ
    values: dict[str, object] = {}
    for path in pip_config_files(env) if files is None else files:
        parser = configparser.RawConfigParser()
        try:
            parser.read(path, encoding="utf-8")
        except (configparser.Error, UnicodeDecodeError, OSError):
            continue  # pip would complain itself; we only mirror what it can read
        for section in ("global", "install"):
            if parser.has_section(section):
                for key, raw in parser.items(section):
                    _apply(values, key, raw)
    for key in _KEYS:
        raw = env.get("PIP_" + key.upper().replace("-", "_"))
        if raw is not None:
            _apply(values, key, raw)
    return IndexConfig(**values)  # type: ignore[arg-type]


def uv_args(config: IndexConfig, environ: Mapping[str, str] | None = None) -> list[str]:
    """Flags that give uv the user's pip configuration. UV_* settings win where set."""
    env = os.environ if environ is None else environ
    args: list[str] = []
    if config.no_index and "UV_NO_INDEX" not in env:
        args.append("--no-index")
    if config.index_url and not (env.get("UV_DEFAULT_INDEX") or env.get("UV_INDEX_URL")):
        args += ["--default-index", config.index_url]
    if not (env.get("UV_INDEX") or env.get("UV_EXTRA_INDEX_URL")):
        for url in config.extra_index_urls:
            args += ["--index", url]
    if not env.get("UV_FIND_LINKS"):
        for link in config.find_links:
            args += ["--find-links", link]
    if not env.get("UV_CONSTRAINT"):
        for path in config.constraints:
            args += ["--constraints", path]
    for host in config.trusted_hosts:
        if not env.get("UV_INSECURE_HOST"):
            args += ["--allow-insecure-host", host]
    several = bool(config.extra_index_urls or config.find_links)
    if several and not env.get("UV_INDEX_STRATEGY"):
        # pip picks the best match over all sources; uv by default stops at the first
        # index that knows a name. Keep pip's meaning for a pip-style configuration.
        args += ["--index-strategy", "unsafe-best-match"]
    return args


def uv_env(config: IndexConfig, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    env = os.environ if environ is None else environ
    out: dict[str, str] = {}
    if config.cert and not env.get("SSL_CERT_FILE"):
        out["SSL_CERT_FILE"] = config.cert
    return out


def torch_index_override(environ: Mapping[str, str] | None = None) -> tuple[bool, str | None]:
    """(overridden, url): AITK_TORCH_INDEX_URL replaces the spec's PyTorch index."""
    env = os.environ if environ is None else environ
    raw = (env.get(TORCH_INDEX_ENV) or "").strip()
    if not raw:
        return False, None
    return True, None if raw.lower() == PYPI_WORD else raw.rstrip("/")
