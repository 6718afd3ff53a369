"""The one downloader against a real loopback server that misbehaves on purpose."""

from __future__ import annotations

import io
import os
import time

import httpx
import pytest

from aitk_common.files import atomic_write_json
from manager import download
from manager.errors import UsageError
from tests.manager.tools.builders import sha

BODY = os.urandom(300_000)


def fetch(server, client, fast_retry, quiet, dest, url, **kw):
    kw.setdefault("sha256", sha(BODY))
    kw.setdefault("max_bytes", 10 << 20)
    return download.fetch(url, dest, client=client, retry=fast_retry, reporter=quiet, **kw)


def test_verified_download_lands_by_rename(server, client, fast_retry, quiet, tmp_path):
    url = server.add("f.bin", BODY)
    got = fetch(server, client, fast_retry, quiet, tmp_path / "f.bin", url)
    assert got.path.read_bytes() == BODY
    assert got.verified and got.sha256 == sha(BODY) and got.size == len(BODY)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]  # no .part left
    assert quiet.starts == [("f.bin", len(BODY), 0)] and quiet.advanced == len(BODY)


def test_wrong_checksum_deletes_everything(server, client, fast_retry, quiet, tmp_path):
    url = server.add("f.bin", BODY)
    with pytest.raises(download.ChecksumMismatch, match="SHA-256 mismatch"):
        fetch(server, client, fast_retry, quiet, tmp_path / "f.bin", url, sha256="0" * 64)
    assert list(tmp_path.iterdir()) == []


def test_dropped_connection_resumes_with_range(server, client, fast_retry, quiet, tmp_path):
    url = server.add("f.bin", BODY, "drop_once")
    got = fetch(server, client, fast_retry, quiet, tmp_path / "f.bin", url)
    assert got.path.read_bytes() == BODY
    first, second = server.hits("f.bin")
    assert "range" not in first
    resumed_at = quiet.starts[-1][2]  # what had been written before the drop
    assert 0 < resumed_at <= len(BODY) // 2
    assert second["range"] == f"bytes={resumed_at}-"
    assert second["if-range"]  # the validator guards the splice
    assert quiet.starts[-1] == ("f.bin", len(BODY), resumed_at)
    assert any("retrying" in n for n in quiet.notes)


def test_truncated_body_fails_and_keeps_only_the_part(server, client, fast_retry, quiet,
                                                      tmp_path):
    url = server.add("f.bin", BODY, "truncate")
    with pytest.raises(download.DownloadError, match="after 3 attempts"):
        fetch(server, client, fast_retry, quiet, tmp_path / "f.bin", url)
    assert not (tmp_path / "f.bin").exists()
    # Each retry resumed where the previous one stopped instead of starting over.
    ranges = [h.get("range") for h in server.hits("f.bin")]
    assert ranges[0] is None and all(r and r.startswith("bytes=") for r in ranges[1:])
    assert (tmp_path / "f.bin.part").stat().st_size < len(BODY)


def test_partial_file_from_an_earlier_run_is_resumed(server, client, fast_retry, quiet,
                                                     tmp_path):
    url = server.add("f.bin", BODY, "truncate")
    with pytest.raises(download.DownloadError):
        fetch(server, client, fast_retry, quiet, tmp_path / "f.bin", url)
    server.routes["/f.bin"].behaviour = "ok"  # the network is back
    got = fetch(server, client, fast_retry, quiet, tmp_path / "f.bin", url)
    assert got.path.read_bytes() == BODY
    assert server.hits("f.bin")[-1]["range"] != "bytes=0-"


def test_part_from_another_source_is_not_spliced(server, client, fast_retry, quiet, tmp_path):
    (tmp_path / "f.bin.part").write_bytes(b"junk from elsewhere")
    url = server.add("f.bin", BODY)
    got = fetch(server, client, fast_retry, quiet, tmp_path / "f.bin", url)
    assert got.path.read_bytes() == BODY
    assert "range" not in server.hits("f.bin")[0]


def test_server_ignoring_range_restarts_cleanly(server, client, fast_retry, quiet, tmp_path):
    url = server.add("f.bin", BODY, "ignore_range")
    part = tmp_path / "f.bin.part"
    part.write_bytes(BODY[:1000])
    atomic_write_json(part.with_name("f.bin.part.json"), {"url": url, "validator": None})
    got = fetch(server, client, fast_retry, quiet, tmp_path / "f.bin", url)
    assert got.path.read_bytes() == BODY  # not BODY[:1000] + BODY


def test_stalled_server_gives_up_at_the_stall_limit_and_says_what_stalled(
        server, client, quiet, tmp_path):
    """A server that sends a little, then nothing: it used to cost every attempt's full
    read timeout (5 x 60 s + backoff, 307 s); now the stall limit counts the seconds
    without data over all tries (one reconnect halfway), and the error names the host and
    the bytes received (issue 21)."""
    url = server.add("f.bin", BODY, "stall")
    policy = download.RetryPolicy(attempts=5, base_delay=0.01, sleep=lambda _s: None,
                                  stall=1.0)
    began = time.monotonic()
    with pytest.raises(download.DownloadError) as info:
        fetch(server, client, policy, quiet, tmp_path / "f.bin", url)
    spent = time.monotonic() - began
    assert len(server.hits("f.bin")) == 2  # one reconnect, not five tries
    assert spent < 5  # the client's own 0.5 s read timeout does not multiply it either
    message = str(info.value.message)
    assert "stalled" in message and "127.0.0.1" in message
    assert "no data for 1 s" in message
    assert "20 B of 293.0 KiB received" in message  # 10 bytes per try, resumed
    assert download.STALL_ENV in (info.value.hint or "")
    assert not (tmp_path / "f.bin").exists() and (tmp_path / "f.bin.part").exists()


def test_the_stall_limit_is_60_s_unless_the_environment_says_otherwise(monkeypatch):
    monkeypatch.delenv(download.STALL_ENV, raising=False)
    assert download.stall_limit() == 60.0
    monkeypatch.setenv(download.STALL_ENV, "15")
    assert download.stall_limit() == 15.0
    monkeypatch.setenv(download.STALL_ENV, "soon")
    with pytest.raises(UsageError, match=download.STALL_ENV):
        download.stall_limit()


def test_404_fails_at_once(server, client, fast_retry, quiet, tmp_path):
    with pytest.raises(download.DownloadError, match="HTTP 404") as info:
        fetch(server, client, fast_retry, quiet, tmp_path / "f.bin", server.url("missing"))
    assert len(server.hits("missing")) == 1
    assert info.value.hint and "mirror" in info.value.hint
    assert list(tmp_path.iterdir()) == []


def test_busy_server_is_retried_with_backoff(server, client, quiet, tmp_path):
    waits: list[float] = []
    policy = download.RetryPolicy(attempts=4, base_delay=1.0, max_delay=3.0, sleep=waits.append,
                                  rand=lambda lo, hi: hi)  # the ceiling of each jitter window
    url = server.add("f.bin", BODY, "flaky", fail_times=3)
    got = download.fetch(url, tmp_path / "f.bin", sha256=sha(BODY), max_bytes=1 << 30,
                         client=client, retry=policy, reporter=quiet)
    assert got.verified
    assert waits == [1.0, 2.0, 3.0]  # doubling, capped


def test_jitter_stays_inside_the_window():
    seen: list[tuple[float, float]] = []
    policy = download.RetryPolicy(base_delay=0.5, max_delay=4.0,
                                  rand=lambda lo, hi: seen.append((lo, hi)) or lo)
    for n in range(5):
        policy.delay(n)
    assert seen == [(0.0, 0.5), (0.0, 1.0), (0.0, 2.0), (0.0, 4.0), (0.0, 4.0)]


def test_announced_size_over_the_ceiling_is_refused(server, client, fast_retry, quiet,
                                                    tmp_path):
    url = server.add("f.bin", BODY)
    with pytest.raises(download.TooLarge):
        fetch(server, client, fast_retry, quiet, tmp_path / "f.bin", url, max_bytes=1000)
    assert list(tmp_path.iterdir()) == []


def test_unannounced_size_is_cut_at_the_ceiling(server, client, fast_retry, quiet, tmp_path):
    url = server.add("f.bin", BODY, "no_length")
    with pytest.raises(download.TooLarge):
        fetch(server, client, fast_retry, quiet, tmp_path / "f.bin", url, max_bytes=1000)
    assert list(tmp_path.iterdir()) == []


def test_unverified_only_on_request(server, client, fast_retry, quiet, tmp_path):
    url = server.add("f.bin", BODY)
    got = fetch(server, client, fast_retry, quiet, tmp_path / "f.bin", url, sha256=None)
    assert not got.verified and got.sha256 == sha(BODY)


def test_existing_download_is_rechecked(server, client, fast_retry, quiet, tmp_path):
    (tmp_path / "f.bin").write_bytes(b"tampered")
    url = server.add("f.bin", BODY)
    got = fetch(server, client, fast_retry, quiet, tmp_path / "f.bin", url)
    assert got.path.read_bytes() == BODY


def test_fetch_text_for_checksum_lists(server, client, fast_retry):
    url = server.add("SHASUMS256.txt", b"abc  file\n", "flaky", fail_times=1)
    assert download.fetch_text(url, client=client, retry=fast_retry) == "abc  file\n"
    with pytest.raises(download.DownloadError, match="404"):
        download.fetch_text(server.url("nope"), client=client, retry=fast_retry)


def test_mock_transport_client_is_accepted(tmp_path, fast_retry, quiet):
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=httpx.ByteStream(b"hello"))

    with httpx.Client(transport=httpx.MockTransport(handler)) as mock:
        got = download.fetch("http://127.0.0.1/x", tmp_path / "x", sha256=sha(b"hello"),
                             max_bytes=100, client=mock, retry=fast_retry, reporter=quiet)
    assert got.path.read_bytes() == b"hello"


def test_plain_reporter_prints_lines():
    out = io.StringIO()
    rep = download.PlainReporter(out)
    rep.start("node 22", 1000, 0)
    for _ in range(10):
        rep.advance(100)
    rep.finish()
    lines = out.getvalue().splitlines()
    assert lines[0] == "aitk: downloading node 22 (0.0 MiB)"
    assert any("(50%)" in line for line in lines)
    assert lines[-1].startswith("aitk: node 22: ") and "done" in lines[-1]


def test_rich_reporter_draws_on_a_terminal():
    from rich.console import Console

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    rep = download.reporter_for(console)
    assert isinstance(rep, download.RichReporter)
    rep.start("uv 0.13.9", 2 << 20, 0)
    rep.advance(1 << 20)
    rep.note("a note")
    rep.finish()
    text = out.getvalue()
    assert "uv 0.13.9" in text and "MB" in text and "aitk: a note" in text
    assert isinstance(download.reporter_for(Console(file=io.StringIO())), download.PlainReporter)


def test_a_stalled_checksum_list_gives_up_at_the_stall_limit_too(server, client, quiet):
    url = server.add("SHASUMS256.txt", b"x" * 1000, "stall")
    policy = download.RetryPolicy(attempts=5, base_delay=0.01, sleep=lambda _s: None,
                                  stall=1.0)
    with pytest.raises(download.DownloadError, match="stalled: no data for 1 s"):
        download.fetch_text(url, client=client, retry=policy)
    assert len(server.hits("SHASUMS256.txt")) == 2
