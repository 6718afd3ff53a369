"""aitk_common.urls: a URL shown anywhere keeps its shape and loses its credentials."""

from __future__ import annotations

import pytest

from aitk_common.urls import redact_url, redact_urls


@pytest.mark.parametrize(("url", "shown"), [
    ("https://user:ghp_secret@github.com/o/r.git", "https://***@github.com/o/r.git"),
    ("https://ghp_secret@github.com/o/r.git", "https://***@github.com/o/r.git"),
    ("https://github.com/o/r.git?access_token=ghp_secret",
     "https://github.com/o/r.git?access_token=***"),
    ("https://u:p@gitlab.example/r.git?private_token=abc&ref=main#frag",
     "https://***@gitlab.example/r.git?private_token=***&ref=***#frag"),
    ("https://host/r.git?justatoken", "https://host/r.git?***"),
    ("https://host/r.git?empty=", "https://host/r.git?empty="),
    ("https://host/cb#access_token=abc&state=1", "https://host/cb#access_token=***&state=***"),
    ("https://[::1]:8443/r.git?sig=abc", "https://[::1]:8443/r.git?sig=***"),
    # Nothing secret: as given.
    ("https://github.com/ostris/ai-toolkit.git", "https://github.com/ostris/ai-toolkit.git"),
    ("git@github.com:o/r.git", "git@github.com:o/r.git"),
    ("/srv/git/aitk.git", "/srv/git/aitk.git"),
    ("file:///srv/git/aitk.git", "file:///srv/git/aitk.git"),
])
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_a_malformed_url_still_loses_what_follows_its_at_and_question_mark() -> None:
    shown = redact_url("https://u:tok@[bad/r.git?access_token=abc")
    assert "tok" not in shown and "abc" not in shown


def test_redact_urls_in_a_message_as_git_prints_it() -> None:
    line = ("fatal: unable to access 'https://127.0.0.1:9/aitk.git?access_token=SECRET1/': "
            "Failed to connect to 127.0.0.1 port 9 (also http://u:pw@host/x)")
    assert redact_urls(line) == (
        "fatal: unable to access 'https://127.0.0.1:9/aitk.git?access_token=***': "
        "Failed to connect to 127.0.0.1 port 9 (also http://***@host/x)")
