"""URLs as they may be shown: with their shape, never with their credentials.

A git remote or an index URL can carry a secret in two places: the userinfo
(`https://user:token@host/...`) and the query or fragment (`?access_token=...`,
`?private_token=...`, a signed URL's `X-Amz-Signature=...`). The userinfo becomes `***`;
every query and fragment value becomes `***` with its name kept, since no list of names
covers every service, and the name still tells the user which URL it was. Everything
that shows a URL (`info`, `check`, `update`, doctor, the provenance that training outputs
record) goes through here.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

MASK = "***"
# A URL inside free text (git's "unable to access '...'"): up to a space or a quote.
_IN_TEXT = re.compile(r"[a-z][a-z0-9+.-]*://[^\s'\"<>`]+", re.IGNORECASE)


def _mask_pairs(text: str) -> str:
    """`a=1&b=2` -> `a=***&b=***`; a value-less item (`?token`) is masked whole."""
    out = []
    for item in text.split("&"):
        name, sep, value = item.partition("=")
        out.append(f"{name}={MASK if value else ''}" if sep else (MASK if item else ""))
    return "&".join(out)


def redact_url(url: str) -> str:
    """The URL with its userinfo and query/fragment values masked; scp-style remotes
    (`git@host:path`) and plain paths come back as given."""
    try:
        parts = urlsplit(url)
    except ValueError:  # malformed (an unclosed IPv6 bracket): cut what could be secret
        head = url.split("?", 1)[0].split("#", 1)[0]
        scheme, sep, rest = head.partition("://")
        return f"{scheme}{sep}{MASK}@{rest.rpartition('@')[2]}" if "@" in rest else head
    if not parts.scheme or "://" not in url:
        return url
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{MASK}@{netloc.rpartition('@')[2]}"
    fragment = _mask_pairs(parts.fragment) if "=" in parts.fragment else parts.fragment
    return urlunsplit((parts.scheme, netloc, parts.path, _mask_pairs(parts.query)
                       if parts.query else "", fragment))


def redact_urls(text: str) -> str:
    """Every URL inside `text` (an error message, a command line) passed through
    redact_url."""
    return _IN_TEXT.sub(lambda match: redact_url(match.group(0)), text)
