"""The one downloader: every file the manager fetches comes through `fetch`.

What it guarantees, and why (each one is a way downloads failed users before):
- a stall limit (AITK_DOWNLOAD_STALL_SECONDS, default 60): the seconds without a byte
  are counted over all tries, each try waiting half of it before reconnecting, so a
  server that goes silent costs about a minute, not every try's full read timeout
  (5 x 60 s, 307 s with the backoff); the error names the host and the bytes received;
- retries with exponential backoff and full jitter on network errors, 408/429/5xx;
  4xx answers (a 404 from a moved "latest" URL) fail at once;
- resume: bytes land in `<dest>.part`; a later attempt (or a later run) asks for the
  rest with an HTTP Range, guarded by If-Range so a file that changed upstream is
  fetched whole instead of being spliced;
- a size ceiling, checked against the announced length and while streaming;
- SHA-256 verification: `dest` appears (by rename) only once the digest matched, and a
  file that failed is deleted, so nothing unverified is left where it could be used.

Progress goes to stderr: a rich bar (size, speed, ETA) on a terminal, plain lines
otherwise. The httpx client is injectable (tests use a loopback server or MockTransport).
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

import httpx
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from aitk_common.files import atomic_write_json
from aitk_common.urls import redact_url
from manager import envvars
from manager.errors import ManagerError

CHUNK = 1 << 16
DEFAULT_TIMEOUT = httpx.Timeout(connect=15.0, read=60.0, write=30.0, pool=15.0)
STALL_ENV = "AITK_DOWNLOAD_STALL_SECONDS"
DEFAULT_STALL = 60.0
# Answers worth another try: the server or something on the way is briefly unwell.
RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


class DownloadError(ManagerError):
    """A download failed for good (after the retries, or an answer retrying can't fix)."""


class ChecksumMismatch(DownloadError):
    """The bytes received are not the pinned ones; they were deleted."""


class TooLarge(DownloadError):
    """The download is larger than its ceiling; what arrived was deleted."""


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 5
    base_delay: float = 1.0
    max_delay: float = 30.0
    # Injected by tests so retries cost no wall time.
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False)
    rand: Callable[[float, float], float] = field(default=random.uniform, compare=False)
    # Seconds without data, over all tries, before giving up; None: stall_limit().
    stall: float | None = None

    def delay(self, failures: int) -> float:
        """Full jitter: uniform in [0, min(cap, base * 2**n)] spreads clients apart."""
        return self.rand(0.0, min(self.max_delay, self.base_delay * (2 ** failures)))


def stall_limit() -> float:
    """The stall limit in seconds: AITK_DOWNLOAD_STALL_SECONDS, else 60."""
    return envvars.seconds(STALL_ENV, DEFAULT_STALL)


@dataclass
class _StallBudget:
    """The seconds a download may go without data, spent across its tries."""

    limit: float
    spent: float = 0.0

    def timeout(self) -> httpx.Timeout:
        # Half the limit per try: a wedged connection gets one fresh one before giving up.
        half = max(self.limit / 2, 0.05)
        return httpx.Timeout(connect=min(15.0, half), read=half, write=30.0,
                             pool=min(15.0, half))

    def spend(self, seconds: float) -> bool:
        """Count a stall; True once the limit is reached (timers fire a hair late or
        early, so within 5 %)."""
        self.spent += seconds
        return self.spent >= self.limit * 0.95


@dataclass(frozen=True)
class Fetched:
    path: Path
    sha256: str
    size: int
    verified: bool  # False only when the caller passed sha256=None (an explicit opt-in)


# ---- progress --------------------------------------------------------------------------


class Reporter(Protocol):
    def start(self, label: str, total: int | None, done: int) -> None: ...
    def advance(self, n: int) -> None: ...
    def finish(self) -> None: ...
    def note(self, message: str) -> None: ...


class RichReporter:
    """A rich progress bar with size, speed and ETA, on stderr."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def start(self, label: str, total: int | None, done: int) -> None:
        self.finish()
        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
            TransferSpeedColumn(), TimeRemainingColumn(), console=self._console,
        )
        self._progress.start()
        self._task = self._progress.add_task(label, total=total, completed=done)

    def advance(self, n: int) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, n)

    def finish(self) -> None:
        if self._progress is not None:
            self._progress.stop()
        self._progress = None
        self._task = None

    def note(self, message: str) -> None:
        self._console.print(f"aitk: {message}", markup=False, highlight=False)


class PlainReporter:
    """Plain lines for logs and pipes: start, every 10 %, and the end."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self._stream = stream
        self._label = ""
        self._total: int | None = None
        self._done = 0
        self._shown = 0
        self._began = 0.0

    def _write(self, line: str) -> None:
        stream = self._stream or sys.stderr
        stream.write(f"aitk: {line}\n")
        stream.flush()

    def start(self, label: str, total: int | None, done: int) -> None:
        self._label, self._total, self._done, self._began = label, total, done, time.monotonic()
        self._shown = done * 10 // total if total else 0
        size = _mib(total) if total else "unknown size"
        resumed = f", resuming at {_mib(done)}" if done else ""
        self._write(f"downloading {label} ({size}{resumed})")

    def advance(self, n: int) -> None:
        self._done += n
        if not self._total:
            return
        tenth = min(10, self._done * 10 // self._total)
        if tenth > self._shown and tenth < 10:
            self._shown = tenth
            self._write(f"{self._label}: {_mib(self._done)} of {_mib(self._total)} "
                        f"({tenth * 10}%)")

    def finish(self) -> None:
        if self._label:
            spent = max(time.monotonic() - self._began, 1e-6)
            self._write(f"{self._label}: {_mib(self._done)} done ({_mib(self._done / spent)}/s)")
        self._label = ""

    def note(self, message: str) -> None:
        self._write(message)


def reporter_for(console: Console | None = None) -> Reporter:
    """A bar on a terminal, plain lines otherwise (CI logs, `--json` callers' stderr)."""
    console = console or Console(stderr=True)
    return RichReporter(console) if console.is_terminal else PlainReporter()


def _mib(n: float | None) -> str:
    return f"{(n or 0) / (1 << 20):.1f} MiB"


def _size(n: int | None) -> str:
    n = n or 0
    if n < 1 << 10:
        return f"{n} B"
    return f"{n / (1 << 10):.1f} KiB" if n < 1 << 20 else _mib(n)


# ---- the downloader ----------------------------------------------------------------------


class _Retry(Exception):
    """One attempt failed in a way another attempt may fix."""


class _Stalled(_Retry):
    """No data arrived for `seconds`; `have` of `total` bytes are in the part file."""

    def __init__(self, message: str, seconds: float, have: int, total: int | None) -> None:
        super().__init__(message)
        self.seconds, self.have, self.total = seconds, have, total


def _stall_error(url: str, label: str, budget: _StallBudget, exc: _Stalled) -> DownloadError:
    host = httpx.URL(url).host or url
    of = f" of {_size(exc.total)}" if exc.total else ""
    return DownloadError(
        f"downloading {label} from {host} stalled: no data for {budget.spent:.0f} s "
        f"({_size(exc.have)}{of} received)",
        hint=f"check the network or point the tool's mirror variable at a reachable copy; "
             f"the partial file is kept and resumed next time; {STALL_ENV} sets the limit "
             f"in seconds (default {DEFAULT_STALL:.0f})")


def fetch(
    url: str,
    dest: Path,
    *,
    sha256: str | None,
    max_bytes: int,
    client: httpx.Client | None = None,
    retry: RetryPolicy | None = None,
    reporter: Reporter | None = None,
    label: str | None = None,
) -> Fetched:
    """Download url to dest, verified. sha256=None means the caller has the user's
    explicit opt-in to an unverified file; the digest is still computed and returned."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    retry = retry or RetryPolicy()
    attempts = max(1, retry.attempts)
    reporter = reporter or reporter_for()
    label = label or dest.name
    expected = sha256.lower() if sha256 else None

    if dest.exists():  # only ever created verified; re-check before trusting it again
        digest = sha256_file(dest)
        if expected is None or digest == expected:
            return Fetched(dest, digest, dest.stat().st_size, verified=expected is not None)
        dest.unlink()

    own_client = client is None
    http = client or httpx.Client(timeout=DEFAULT_TIMEOUT, follow_redirects=True)
    part = dest.with_name(dest.name + ".part")
    budget = _StallBudget(retry.stall if retry.stall is not None else stall_limit())
    try:
        for failures in range(attempts):
            try:
                _attempt(http, url, part, max_bytes, reporter, label, budget.timeout())
                break
            except _Stalled as exc:
                reporter.finish()
                if budget.spend(exc.seconds) or failures + 1 >= attempts:
                    raise _stall_error(url, label, budget, exc) from None
                reporter.note(f"{label}: {exc}; reconnecting")
            except _Retry as exc:
                reporter.finish()
                if failures + 1 >= attempts:
                    raise DownloadError(
                        f"downloading {redact_url(url)} failed after {attempts} attempts: {exc}",
                        hint="check the network or point the tool's mirror variable at a "
                             "reachable copy; the partial file is kept and resumed next time",
                    ) from None
                wait = retry.delay(failures)
                reporter.note(f"{label}: {exc}; retrying in {wait:.1f}s")
                retry.sleep(wait)
            except BaseException:
                reporter.finish()
                raise
        reporter.finish()
    finally:
        if own_client:
            http.close()

    digest = sha256_file(part)
    size = part.stat().st_size
    if expected is not None and digest != expected:
        _discard(part)
        raise ChecksumMismatch(
            f"{label}: SHA-256 mismatch (expected {expected}, got {digest}); file deleted",
            hint="the source served different bytes than the pinned ones; if you use a "
                 "mirror, check that it holds the same release",
        )
    part.replace(dest)
    _meta(part).unlink(missing_ok=True)
    return Fetched(dest, digest, size, verified=expected is not None)


def fetch_text(url: str, *, max_bytes: int = 1 << 20, client: httpx.Client | None = None,
               retry: RetryPolicy | None = None) -> str:
    """A small text file (a checksum list), kept in memory, same timeouts and retries."""
    retry = retry or RetryPolicy()
    attempts = max(1, retry.attempts)
    own_client = client is None
    http = client or httpx.Client(timeout=DEFAULT_TIMEOUT, follow_redirects=True)
    problem = ""
    shown = redact_url(url)  # a mirror URL may carry a token
    budget = _StallBudget(retry.stall if retry.stall is not None else stall_limit())
    try:
        for failures in range(attempts):
            began = time.monotonic()
            try:
                with http.stream("GET", url, timeout=budget.timeout()) as resp:
                    if resp.status_code == 200:
                        body = b""
                        for chunk in resp.iter_bytes(CHUNK):
                            body += chunk
                            if len(body) > max_bytes:
                                raise TooLarge(f"{shown} is larger than {_mib(max_bytes)}")
                        return body.decode("utf-8", errors="replace")
                    if resp.status_code not in RETRY_STATUS:
                        raise DownloadError(f"{shown}: HTTP {resp.status_code}",
                                            hint="check the URL or the mirror variable")
                    problem = f"HTTP {resp.status_code}"
            except httpx.TimeoutException as exc:
                if budget.spend(time.monotonic() - began):
                    raise _stall_error(url, shown, budget,
                                       _Stalled(_describe(exc), 0, 0, None)) from None
                problem = _describe(exc)
            except httpx.TransportError as exc:
                problem = _describe(exc)
            if failures + 1 < attempts:
                retry.sleep(retry.delay(failures))
        raise DownloadError(f"fetching {shown} failed after {attempts} attempts: {problem}",
                            hint="check the network or the mirror variable")
    finally:
        if own_client:
            http.close()


def _attempt(http: httpx.Client, url: str, part: Path, max_bytes: int,
             reporter: Reporter, label: str, timeout: httpx.Timeout) -> None:
    have, validator = _resumable(part, url)
    total: int | None = None
    last_data = time.monotonic()  # a stall is measured from the last byte (or the start)
    # Ranges must count the bytes as stored, so ask for no content coding.
    headers = {"Accept-Encoding": "identity"}
    if have:
        headers["Range"] = f"bytes={have}-"
        if validator:
            headers["If-Range"] = validator
    try:
        with http.stream("GET", url, headers=headers, timeout=timeout) as resp:
            status = resp.status_code
            if status == 416 and have:
                _discard(part)
                raise _Retry("the server refused to resume; starting over")
            if status in RETRY_STATUS:
                raise _Retry(f"HTTP {status}")
            if status >= 400 or status not in (200, 206):
                raise DownloadError(f"{redact_url(url)}: HTTP {status}",
                                    hint="the file is not at that address; check the URL "
                                         "or the mirror variable")
            start = _range_start(resp) if status == 206 else 0
            if start != have:  # a 200, or a range we did not ask for: take it whole
                have = 0
            length = _int(resp.headers.get("Content-Length"))
            total = have + length if length is not None else None
            if total is not None and total > max_bytes:
                _discard(part)
                raise TooLarge(f"{label} is {_mib(total)}, over its {_mib(max_bytes)} ceiling")
            atomic_write_json(_meta(part), {
                "url": url,
                "validator": resp.headers.get("ETag") or resp.headers.get("Last-Modified"),
            })
            reporter.start(label, total, have)
            with open(part, "ab" if have else "wb") as fh:
                # As the bytes arrive (a chunk size would hold them back until it is full,
                # so a stalled transfer would keep nothing to resume from).
                for chunk in resp.iter_raw():
                    have += len(chunk)
                    if have > max_bytes:
                        fh.close()
                        _discard(part)
                        raise TooLarge(f"{label} grew past its {_mib(max_bytes)} ceiling")
                    fh.write(chunk)
                    last_data = time.monotonic()
                    reporter.advance(len(chunk))
            if total is not None and have != total:
                raise _Retry(f"the body ended at {have} of {total} bytes")
    except httpx.TimeoutException as exc:  # connect or read: nothing came
        raise _Stalled(_describe(exc), time.monotonic() - last_data, have, total) from None
    except httpx.TransportError as exc:  # refused, reset, cut-off body
        raise _Retry(_describe(exc)) from None


def _resumable(part: Path, url: str) -> tuple[int, str | None]:
    """Bytes already in part, and the validator to send, if they came from this url."""
    if not part.exists():
        return 0, None
    try:
        meta = json.loads(_meta(part).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        meta = None
    if not isinstance(meta, dict) or meta.get("url") != url:
        _discard(part)  # leftovers from another source: not safe to splice onto
        return 0, None
    return part.stat().st_size, meta.get("validator")


def _range_start(resp: httpx.Response) -> int | None:
    # Content-Range: bytes START-END/TOTAL
    value = resp.headers.get("Content-Range", "")
    try:
        unit, rest = value.split(" ", 1)
        return int(rest.split("-", 1)[0]) if unit == "bytes" else None
    except ValueError:
        return None


def _meta(part: Path) -> Path:
    return part.with_name(part.name + ".json")


def _discard(part: Path) -> None:
    part.unlink(missing_ok=True)
    _meta(part).unlink(missing_ok=True)


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _describe(exc: httpx.TransportError) -> str:
    kind = "timed out" if isinstance(exc, httpx.TimeoutException) else "network error"
    return f"{kind} ({type(exc).__name__}: {exc})" if str(exc) else f"{kind} ({type(exc).__name__})"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
