"""Where a run came from: toolkit version, git commit/branch/dirty files/remote (any
credential in the URL redacted), the versions of the libraries that shape the weights,
the torch build and the registered archs. Stdlib only and torch-free, so
`manager info` shows the same block that training outputs record in their metadata.
"""

from __future__ import annotations

import functools
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import aitk
from aitk_common.urls import redact_url

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("torch", "diffusers", "transformers", "peft", "optimum-quanto", "safetensors")
GIT_TIMEOUT = 10.0
def _git(root: Path, *args: str, strip: bool = True) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                              text=True, timeout=GIT_TIMEOUT, check=False,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    # porcelain lines start with a status column that may be a space: keep it
    return done.stdout.strip() if strip else done.stdout.rstrip("\n")


def git_info(root: Path = ROOT) -> dict[str, Any]:
    status = _git(root, "status", "--porcelain", "--untracked-files=no", strip=False)
    branch = _git(root, "symbolic-ref", "--quiet", "--short", "HEAD")
    upstream = _git(root, "rev-parse", "--abbrev-ref", "--symbolic-full-name", "@{u}")
    remote_name = upstream.split("/", 1)[0] if upstream else "origin"
    remote = _git(root, "remote", "get-url", remote_name)
    return {
        "commit": _git(root, "rev-parse", "HEAD"),
        "branch": branch,  # None: detached HEAD or not a checkout
        "dirty_files": [line[3:] for line in status.splitlines()] if status else [],
        "remote": redact_url(remote) if remote else None,
    }


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def torch_build(torch_version: str | None) -> str | None:
    """"2.13.0+cu130" -> "cu130"; a version without a local tag is a PyPI build."""
    if not torch_version:
        return None
    return torch_version.split("+", 1)[1] if "+" in torch_version else "pypi"


def registered_archs() -> list[str]:
    """Built-in archs (read from source), plus extension packages by folder name."""
    from aitk.models import catalog

    archs = sorted(catalog.builtin_archs())
    ext = catalog.EXTENSIONS_DIR
    if catalog.has_extensions(ext):
        archs += sorted(f"extension:{p.name}" for p in ext.iterdir()
                        if p.is_dir() and (p / "__init__.py").is_file()
                        and not p.name.startswith((".", "_")))
    return archs


@functools.lru_cache(maxsize=1)
def collect() -> dict[str, Any]:
    """The whole block (cached: a run records it at every save)."""
    packages = package_versions()
    return {"name": aitk.SOFTWARE_NAME, "version": aitk.__version__, **git_info(),
            "packages": packages, "torch_build": torch_build(packages.get("torch")),
            "archs": registered_archs()}
