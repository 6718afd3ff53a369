"""What every route handler shares: one error type answered as one JSON line, bounded
request bodies, and parsing of ids and counts from a request."""

from __future__ import annotations

import json
import logging
import re
import sqlite3
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from aitk_server.runner import Conflict

MAX_JSON_BYTES = 1024 * 1024
log = logging.getLogger("aitk_server")


class ApiError(Exception):
    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.message, self.extra = status, message, extra


async def read_capped(request: Request, limit: int) -> bytes:
    too_large = ApiError(413, f"the request body is larger than {limit // 2**20} MiB")
    declared = request.headers.get("content-length")
    if declared and declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise too_large
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large
    return bytes(body)


def media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


async def json_body(request: Request) -> dict[str, Any]:
    if media_type(request) != "application/json":
        raise ApiError(415, "send the request body as application/json")
    raw = await read_capped(request, MAX_JSON_BYTES)
    try:
        data = json.loads(raw or b"{}")
    except (ValueError, RecursionError):
        raise ApiError(400, "the request body is not JSON (or nested too deeply)") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return data


def text_field(body: dict[str, Any], key: str, limit: int = 200, required: bool = True
               ) -> str | None:
    """A short text value of a JSON body; 400 when it is not one."""
    value = body.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value or len(value) > limit:
        raise ApiError(400, f'send {{"{key}": TEXT}} (1 to {limit} characters)')
    return value


def small_count(text: str, default: int, limit: int) -> int:
    """A query parameter that counts something: ASCII digits only, at most `limit`."""
    if not text:
        return default
    if not re.fullmatch(r"[0-9]{1,12}", text):
        raise ApiError(400, f"expected a whole number (0-{limit}), got {text[:40]!r}")
    return min(int(text), limit)


def answer_errors(endpoint: Callable[[Request], Any]) -> Callable[[Request], Any]:
    """Every failure of a handler as one JSON line: its own ApiError, a state conflict
    (409), the database unavailable (503), anything else 500 (logged in full)."""
    async def handler(request: Request) -> Response:
        try:
            return await endpoint(request)
        except ApiError as exc:
            return JSONResponse({"error": exc.message, **exc.extra}, status_code=exc.status)
        except Conflict as exc:
            return JSONResponse({"error": str(exc)}, status_code=409)
        except sqlite3.Error as exc:
            return JSONResponse({"error": f"the jobs database is unavailable ({exc}); "
                                 "try again"}, status_code=503)
        except Exception as exc:  # noqa: BLE001 - a bug: one line out, the trace logged
            log.exception("%s %s failed", request.method, request.url.path)
            return JSONResponse({"error": f"internal error ({type(exc).__name__}); the "
                                 "server's output has the details"}, status_code=500)

    return handler
