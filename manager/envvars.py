"""Settings read from AITK_* environment variables. A bad value is a usage error that
names the variable (exit 2), never silently replaced by the default."""

from __future__ import annotations

import os
from collections.abc import Mapping

from manager.errors import UsageError


def seconds(name: str, default: float, environ: Mapping[str, str] | None = None) -> float:
    raw = (os.environ if environ is None else environ).get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f"{name}={raw!r} is not a number of seconds",
                         hint=f"set {name} to a number such as 60, or unset it") from None
    if value <= 0:
        raise UsageError(f"{name}={raw!r} must be more than 0 seconds",
                         hint=f"set {name} to a number such as 60, or unset it")
    return value


def choice(name: str, allowed: tuple[str, ...],
           environ: Mapping[str, str] | None = None) -> str | None:
    """The variable's value (lower-cased) when set, None when unset or empty."""
    raw = (os.environ if environ is None else environ).get(name, "").strip().lower()
    if not raw:
        return None
    if raw not in allowed:
        raise UsageError(f"{name}={raw!r} is not one of {', '.join(allowed)}",
                         hint=f"set {name} to {' or '.join(allowed)}, or unset it")
    return raw
