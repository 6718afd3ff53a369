"""Jobs in an embedded SQLite database (stdlib sqlite3): one row per job with its config
and state, and an append-only history of what happened to it.

Every call opens its own short connection: the server's request handlers and its
monitor run on different threads, and SQLite serialises writers itself (WAL mode lets
readers go on while one writes). A state change that must happen once (a start) is a
compare-and-set (`transition`): one UPDATE that matches only the states it may leave.

The file is created once, at start; later connections never create it, so a database
moved away for a moment is an error the caller retries (sqlite3.OperationalError), not a
new empty one. A corrupt file is set aside (renamed, kept) and a fresh one started;
`set_aside` says where it went.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

MAX_JOB_ID = 2**63 - 1  # SQLite's INTEGER; a larger id names no job

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    config_yaml TEXT NOT NULL,
    out_dir TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'created',
    pid INTEGER,
    exit_code INTEGER,
    error TEXT,
    queue_order REAL,
    created REAL NOT NULL,
    started REAL,
    ended REAL,
    process TEXT
);
CREATE TABLE IF NOT EXISTS history (
    job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    time REAL NOT NULL,
    event TEXT NOT NULL
);
"""


@dataclass(frozen=True)
class JobRow:
    id: int
    name: str
    config_yaml: str
    out_dir: str
    state: str
    pid: int | None
    exit_code: int | None
    error: str | None
    queue_order: float | None
    created: float
    started: float | None
    ended: float | None
    process: str | None  # the trainer's ProcessIdentity as JSON (aitk_common.procs)


_COLUMNS = [f.name for f in fields(JobRow)]
# Columns added after the first release, with their type: added to an older file.
_ADDED = {"process": "TEXT"}


def is_corrupt(exc: sqlite3.DatabaseError) -> bool:
    """Damage, as opposed to a file that cannot be opened, written or locked
    (OperationalError, which is a DatabaseError too)."""
    text = str(exc).lower()
    return not isinstance(exc, sqlite3.OperationalError) or "malformed" in text \
        or "not a database" in text


def valid_id(job_id: int) -> bool:
    return 0 < job_id <= MAX_JOB_ID


class Database:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.set_aside: Path | None = None
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._prepare()
        except sqlite3.DatabaseError as exc:
            if not is_corrupt(exc):
                raise
            self.set_aside = self._set_aside()
            self._prepare()
        self._uri = path.resolve().as_uri() + "?mode=rw"

    def _prepare(self) -> None:
        db = sqlite3.connect(self.path, timeout=30)
        try:
            with db:
                db.execute("PRAGMA journal_mode=WAL")
                db.executescript(SCHEMA)
                have = {row[1] for row in db.execute("PRAGMA table_info(jobs)")}
                for column, kind in _ADDED.items():
                    if column not in have:
                        db.execute(f"ALTER TABLE jobs ADD COLUMN {column} {kind}")
                (verdict,) = db.execute("PRAGMA quick_check").fetchone()
                if verdict != "ok":
                    raise sqlite3.DatabaseError(f"database disk image is malformed: {verdict}")
        finally:
            db.close()

    def _set_aside(self) -> Path:
        """Rename the damaged file (and its journal files) out of the way; kept."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        kept = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        for suffix in ("", "-wal", "-shm"):
            part = self.path.with_name(self.path.name + suffix)
            if part.exists():
                part.replace(kept.with_name(kept.name + suffix))
        return kept

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self._uri, uri=True, timeout=30)
        db.execute("PRAGMA foreign_keys=ON")
        try:
            with db:  # commit, or roll back on an error
                yield db
        finally:
            db.close()

    def create(self, name: str, config_yaml: str, out_dir: str) -> JobRow:
        with self._connect() as db:
            cur = db.execute("INSERT INTO jobs (name, config_yaml, out_dir, created) "
                             "VALUES (?, ?, ?, ?)", (name, config_yaml, out_dir, time.time()))
            job_id = int(cur.lastrowid or 0)
            db.execute("INSERT INTO history VALUES (?, ?, ?)", (job_id, time.time(), "created"))
        found = self.get(job_id)
        assert found is not None
        return found

    def get(self, job_id: int) -> JobRow | None:
        if not valid_id(job_id):
            return None
        with self._connect() as db:
            row = db.execute(f"SELECT {', '.join(_COLUMNS)} FROM jobs WHERE id = ?",
                             (job_id,)).fetchone()
        return JobRow(*row) if row else None

    def all(self) -> list[JobRow]:
        with self._connect() as db:
            rows = db.execute(f"SELECT {', '.join(_COLUMNS)} FROM jobs ORDER BY id").fetchall()
        return [JobRow(*r) for r in rows]

    def update(self, job_id: int, event: str | None = None, **values: Any) -> None:
        unknown = set(values) - set(_COLUMNS)
        if unknown:
            raise ValueError(f"unknown job columns: {sorted(unknown)}")
        with self._connect() as db:
            if values:
                assignments = ", ".join(f"{k} = ?" for k in values)
                db.execute(f"UPDATE jobs SET {assignments} WHERE id = ?",
                           (*(_stored(v) for v in values.values()), job_id))
            if event:
                db.execute("INSERT INTO history VALUES (?, ?, ?)", (job_id, time.time(), event))

    def transition(self, job_id: int, leaving: Iterable[str], event: str,
                   **values: Any) -> bool:
        """Set `values` only while the job is in one of the states `leaving`, in one
        statement; False when it is not (another request changed it first)."""
        states = [str(s) for s in leaving]
        unknown = set(values) - set(_COLUMNS)
        if unknown or not values or not states:
            raise ValueError(f"bad transition: {sorted(unknown) or 'nothing to set'}")
        assignments = ", ".join(f"{k} = ?" for k in values)
        marks = ", ".join("?" for _ in states)
        with self._connect() as db:
            cur = db.execute(f"UPDATE jobs SET {assignments} WHERE id = ? AND state IN "
                             f"({marks})", (*(_stored(v) for v in values.values()),
                                            job_id, *states))
            if cur.rowcount != 1:
                return False
            db.execute("INSERT INTO history VALUES (?, ?, ?)", (job_id, time.time(), event))
        return True

    def set_queue_order(self, orders: dict[int, float], event: str) -> bool:
        """Give queued jobs new places in the queue, all or none: False (nothing
        changed) when one of them is no longer queued (it started, or left the queue)."""
        with self._connect() as db:
            for job_id, order in orders.items():
                cur = db.execute("UPDATE jobs SET queue_order = ? WHERE id = ? AND "
                                 "state = 'queued'", (order, job_id))
                if cur.rowcount != 1:
                    db.rollback()
                    return False
            db.executemany("INSERT INTO history VALUES (?, ?, ?)",
                           [(job_id, time.time(), event) for job_id in orders])
        return True

    def delete(self, job_id: int) -> None:
        with self._connect() as db:
            db.execute("DELETE FROM jobs WHERE id = ?", (job_id,))

    def history(self, job_id: int) -> list[dict[str, Any]]:
        with self._connect() as db:
            rows = db.execute("SELECT time, event FROM history WHERE job_id = ? ORDER BY "
                              "rowid", (job_id,)).fetchall()
        return [{"time": t, "event": e} for t, e in rows]


def _stored(value: Any) -> Any:
    """An enum member (a job state) is stored as its plain name."""
    return str(value) if isinstance(value, str) else value
