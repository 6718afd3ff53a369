"""Which environment variables hold secrets, and scrubbing their values from text.

Doctor shows a secret only as set/unset: never its value, length or a prefix.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from aitk_common.urls import redact_urls

# Always listed (set/unset) so a bug report says whether they were present.
KNOWN = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "AITK_AUTH", "AI_TOOLKIT_AUTH")
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|CREDENTIAL|(^|_)AUTH(_|$)", re.I)
# Shorter values are too likely to match ordinary text ("1", "yes") to be scrubbed.
_MIN_SECRET_LEN = 4


def is_secret_name(name: str) -> bool:
    return name in KNOWN or bool(_SECRET_NAME.search(name))


def secret_names(environ: Mapping[str, str]) -> list[str]:
    """KNOWN first, then any other secret-looking variable that is set, sorted."""
    others = sorted(n for n in environ if is_secret_name(n) and n not in KNOWN)
    return [*KNOWN, *others]


def secret_values(environ: Mapping[str, str]) -> list[str]:
    values = {v for n, v in environ.items() if is_secret_name(n) and len(v) >= _MIN_SECRET_LEN}
    return sorted(values, key=len, reverse=True)  # longest first: no partial leftovers


def redact(text: str, values: Iterable[str]) -> str:
    for value in values:
        text = text.replace(value, "***")
    # Credentials inside URLs (a git remote, an index): userinfo and query values.
    return redact_urls(text)
