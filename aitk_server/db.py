"""Jobs in an embedded SQLite database (stdlib sqlite3): one row per job with its config
and state, and an append-only history of what happened to it.

Every call opens its own short connection: the server's request handlers and its
monitor run on different threads, and SQLite serialises writers itself (WAL mode lets
readers go on while one writes).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

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
    ended REAL
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


_COLUMNS = [f.name for f in fields(JobRow)]


class Database:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(SCHEMA)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=30)
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
                           (*values.values(), job_id))
            if event:
                db.execute("INSERT INTO history VALUES (?, ?, ?)", (job_id, time.time(), event))

    def delete(self, job_id: int) -> None:
        with self._connect() as db:
            db.execute("DELETE FROM jobs WHERE id = ?", (job_id,))

    def history(self, job_id: int) -> list[dict[str, Any]]:
        with self._connect() as db:
            rows = db.execute("SELECT time, event FROM history WHERE job_id = ? ORDER BY "
                              "rowid", (job_id,)).fetchall()
        return [{"time": t, "event": e} for t, e in rows]
