"""Ordered, idempotent one-time migrations.

Each migration is a module of this package named `mNNN_<what>.py` with:

    ID           a stable id, never reused ("001_gradient_accumulation_key")
    DESCRIPTION  one line for `check` and `sync --dry-run`
    run(root)    does the work; idempotent, so a retry after a crash is safe; may return
                 notes (a list of lines) about what it deliberately left alone

They run in the order of their module names. The sync engine calls `run_pending` after
installing; each id is reported through `on_applied` only after its `run` succeeded, so
the caller records it in the state (`aitk_manager_state.json`) and a failed migration is
retried at the next sync. A migration never touches files tracked by git: that would
make the checkout dirty and block the next update.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from manager.errors import ManagerError

_MODULE_NAME = re.compile(r"^m(\d{3,})_[a-z0-9_]+$")


@dataclass(frozen=True)
class Migration:
    id: str
    description: str
    run: Callable[[Path], list[str] | None]


class MigrationFailed(ManagerError):
    """A migration raised; it is not recorded, and the next sync retries it."""

    def __init__(self, migration_id: str, cause: BaseException) -> None:
        super().__init__(
            f"migration {migration_id} failed: {cause}",
            hint="fix the cause above and run `python3 -m manager sync` again; "
                 "the migration is retried",
        )
        self.migration_id = migration_id


@lru_cache(maxsize=1)
def _discovered() -> tuple[Migration, ...]:
    names = sorted(
        (int(match.group(1)), info.name)
        for info in pkgutil.iter_modules(__path__)
        if (match := _MODULE_NAME.match(info.name))
    )
    found = []
    for _, name in names:
        module = importlib.import_module(f"{__name__}.{name}")
        found.append(Migration(module.ID, module.DESCRIPTION, module.run))
    ids = [m.id for m in found]
    if len(set(ids)) != len(ids):
        raise ManagerError(f"duplicate migration ids in {__name__}: {ids}")
    return tuple(found)


def available() -> list[Migration]:
    """Every migration shipped with this code, in the order they run."""
    return list(_discovered())


def pending_migrations(applied: Iterable[str],
                       migrations: Sequence[Migration] | None = None) -> list[Migration]:
    done = set(applied)
    return [m for m in (available() if migrations is None else migrations) if m.id not in done]


def pending(applied: Iterable[str], migrations: Sequence[Migration] | None = None) -> list[str]:
    """Ids of the migrations not yet applied, in order."""
    return [m.id for m in pending_migrations(applied, migrations)]


def describe(ids: Iterable[str]) -> dict[str, str]:
    """id -> description, for the ids this code knows."""
    known = {m.id: m.description for m in available()}
    return {i: known.get(i, "") for i in ids}


def run_pending(root: Path, applied: Iterable[str], on_applied: Callable[[str], None],
                migrations: Sequence[Migration] | None = None,
                report: Callable[[str], None] | None = None) -> list[str]:
    """Apply pending migrations in order; return the ids applied now.

    Stops at the first failure with MigrationFailed naming it; those applied before it
    have already been reported through on_applied."""
    done: list[str] = []
    for migration in pending_migrations(applied, migrations):
        try:
            notes = migration.run(root) or []
        except ManagerError as exc:
            raise MigrationFailed(migration.id, exc.message) from exc
        except Exception as exc:  # a migration's bug must name the migration, not crash
            raise MigrationFailed(migration.id, _cause(exc)) from exc
        for note in notes:
            if report is not None:
                report(f"migration {migration.id}: {note}")
        on_applied(migration.id)
        done.append(migration.id)
    return done


def _cause(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
