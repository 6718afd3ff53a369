"""The git checkout (branch, commit, local changes, behind) and free disk space where
models, caches and outputs go. Never touches the network: `behind` is counted against
the last fetched upstream."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from manager.health.check import FIX_REPORT, Check, Probe, fail, ok, warn
from manager.paths import Paths

GIB = 1024**3
DISK_FAIL_GIB = 5  # below this a model download or a checkpoint save will fail
DISK_WARN_GIB = 30  # one large base model plus its cache
CHECKOUT = "checkout"


def judge_checkout(repo: Any | None, error: str | None = None) -> Check:
    if repo is None:
        return warn("checkout", f"not a git checkout ({error}): `update` cannot work",
                    "clone the repository with git to get updates")
    where = repo.branch or "detached HEAD"
    commit = (repo.commit or "no commit")[:12]
    parts = [f"{where} at {commit}"]
    fixes = []
    if repo.dirty_files:
        files = list(repo.dirty_files)
        shown = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
        parts.append(f"local changes: {shown}")
        fixes.append("commit or stash them (`git stash`) before updating")
    if repo.behind:
        parts.append(f"{repo.behind} commit(s) behind {repo.upstream}")
        fixes.append("python3 -m manager update")
    elif repo.upstream is None and repo.branch:
        parts.append("no upstream branch")
    if repo.branch is None:
        fixes.append("git switch main  (updates need a branch)")
    if fixes:
        return warn("checkout", "; ".join(parts), "; then ".join(fixes))
    return ok("checkout", "; ".join(parts) + ("; up to date" if repo.upstream else ""))


@dataclass(frozen=True)
class Place:
    label: str  # "checkout", "models (HF cache)"
    path: Path
    free_bytes: int


def judge_disk(places: Sequence[Place]) -> Check:
    if not places:
        return warn("disk", "no location could be measured", FIX_REPORT)
    low = min(places, key=lambda p: p.free_bytes)
    shown = "; ".join(f"{p.label} {p.free_bytes / GIB:.1f} GiB free ({p.path})" for p in places)
    # HF_HOME moves only the model cache; .venv and outputs stay in the checkout.
    fix = (f"free space on {low.path}, or point HF_HOME at a bigger disk"
           if low.label != CHECKOUT else
           f"free space on {low.path} (.venv and outputs live in the checkout), or move the "
           f"checkout to a bigger disk and reinstall")
    if low.free_bytes < DISK_FAIL_GIB * GIB:
        return fail("disk", shown, fix)
    if low.free_bytes < DISK_WARN_GIB * GIB:
        return warn("disk", shown, fix)
    return ok("disk", shown)


def _existing(path: Path) -> Path:
    """The path itself or its nearest existing parent (outputs may not exist yet)."""
    path = path.absolute()
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def hf_cache(environ: dict[str, str]) -> Path:
    if environ.get("HF_HUB_CACHE"):
        return Path(environ["HF_HUB_CACHE"])
    if environ.get("HF_HOME"):
        return Path(environ["HF_HOME"])
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "huggingface"


def free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


def gather_places(paths: Paths, environ: dict[str, str]) -> list[Place]:
    """One Place per filesystem: outputs and venv live in the checkout, models in the HF
    cache."""
    places, seen = [], set()
    for label, path in ((CHECKOUT, paths.root), ("models (HF cache)", hf_cache(environ))):
        there = _existing(path)
        device = os.stat(there).st_dev
        if device in seen:
            continue
        seen.add(device)
        places.append(Place(label, path, free_bytes(there)))
    return places


def probe_checkout(paths: Paths) -> list[Check]:
    from manager import repo

    if not (paths.root / ".git").exists():
        return [judge_checkout(None, "no .git")]
    return [judge_checkout(repo.status(paths.root, fetch=False, timeout=15.0))]


def probes(paths: Paths, environ: dict[str, str]) -> list[Probe]:
    return [
        Probe(("checkout",), lambda: probe_checkout(paths), 20.0),
        Probe(("disk",), lambda: [judge_disk(gather_places(paths, environ))], 10.0),
    ]
