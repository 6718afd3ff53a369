"""What every audit (and the preflight) reports: findings with a level, a place, a
message and a fix, rendered as a short summary or as one JSON document."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, TextIO

from aitk.errors import EXIT_FINDINGS, EXIT_OK


class Level(str, Enum):
    ERROR = "error"  # the run would fail or produce a broken result
    WARNING = "warning"  # it runs, but probably not as meant
    INFO = "info"  # worth knowing


@dataclass(frozen=True)
class Finding:
    level: Level
    path: str  # a config field path, or a file (relative to the audited folder)
    message: str
    fix: str = ""
    code: str = ""  # a stable kind, e.g. "missing_caption"; groups the summary

    def line(self) -> str:
        where = f"{self.path}: " if self.path else ""
        fix = f" (fix: {self.fix})" if self.fix else ""
        return f"{self.level.value}: {where}{self.message}{fix}"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "level": self.level.value}


def error(path: str, message: str, fix: str = "", code: str = "") -> Finding:
    return Finding(Level.ERROR, path, message, fix, code)


def warning(path: str, message: str, fix: str = "", code: str = "") -> Finding:
    return Finding(Level.WARNING, path, message, fix, code)


def info(path: str, message: str, fix: str = "", code: str = "") -> Finding:
    return Finding(Level.INFO, path, message, fix, code)


def has_errors(findings: Iterable[Finding]) -> bool:
    return any(f.level is Level.ERROR for f in findings)


@dataclass
class Report:
    """One audit's result: its subject, summary numbers and the findings."""

    kind: str  # config | dataset | adapter
    subject: str
    summary: Mapping[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT_FINDINGS if has_errors(self.findings) else EXIT_OK

    def as_dict(self) -> dict[str, Any]:
        counts = Counter(f.level.value for f in self.findings)
        return {"audit": self.kind, "subject": self.subject, "ok": self.exit_code == 0,
                "counts": {lv.value: counts.get(lv.value, 0) for lv in Level},
                "summary": dict(self.summary),
                "findings": [f.as_dict() for f in self.findings]}

    def write_json(self, out: TextIO) -> None:
        out.write(json.dumps(self.as_dict(), indent=2, default=str) + "\n")

    def write_text(self, out: TextIO, per_kind: int = 3) -> None:
        """A short summary: the numbers, then findings grouped by kind, a few of each."""
        out.write(f"{self.kind} audit: {self.subject}\n")
        for key, value in self.summary.items():
            if isinstance(value, Mapping | list) and len(value) > 8:
                value = f"{len(value)} entries (see --json)"
            out.write(f"  {key}: {_short(value)}\n")
        groups: dict[tuple[Level, str], list[Finding]] = {}
        for f in self.findings:
            groups.setdefault((f.level, f.code or f.message), []).append(f)
        order = {Level.ERROR: 0, Level.WARNING: 1, Level.INFO: 2}
        for (_, _), items in sorted(groups.items(), key=lambda kv: order[kv[0][0]]):
            for f in items[:per_kind]:
                out.write(f"{f.line()}\n")
            if len(items) > per_kind:
                out.write(f"  ... and {len(items) - per_kind} more like this (see --json)\n")
        counts = Counter(f.level for f in self.findings)
        verdict = "FAIL" if self.exit_code else "OK"
        out.write(f"{verdict}: {counts[Level.ERROR]} errors, {counts[Level.WARNING]} "
                  f"warnings, {counts[Level.INFO]} notes\n")


def _short(value: Any) -> str:
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return str(value)
