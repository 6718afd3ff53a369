"""The machine and the server's settings:

    GET    /api/machine                           GPUs (memory, use, temperature), CPU, RAM
    GET    /api/settings                          folders, host names, whether an HF token
                                                  is set (never the token)
    PUT    /api/settings                          {"hf_token"}: store it owner-only ("" forgets)
"""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from aitk_server import preferences
from aitk_server.http import ApiError, answer_errors, json_body
from aitk_server.machine import Machine


class SystemRoutes:
    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.machine = Machine()

    async def machine_now(self, request: Request) -> Response:
        return JSONResponse(await run_in_threadpool(self.machine.snapshot))

    def shown(self) -> dict[str, Any]:
        s = self.settings
        return {"hf_token_set": preferences.has_token(s.data_dir),
                "datasets_dir": str(s.datasets_dir), "outputs_dir": str(s.outputs_dir),
                "data_dir": str(s.data_dir), "allowed_hosts": list(s.allowed_hosts),
                "listening": s.token is not None}

    async def get(self, request: Request) -> Response:
        return JSONResponse(self.shown())

    async def put(self, request: Request) -> Response:
        body = await json_body(request)
        token = body.get("hf_token")
        if not isinstance(token, str):
            raise ApiError(400, 'send {"hf_token": TEXT} ("" to forget it)')
        try:
            await run_in_threadpool(preferences.set_token, self.settings.data_dir, token)
        except preferences.PreferenceError as exc:
            raise ApiError(400, str(exc)) from None
        return JSONResponse(self.shown())


def routes(settings: Any) -> list[Route]:
    handlers = SystemRoutes(settings)
    return [Route("/api/machine", answer_errors(handlers.machine_now), methods=["GET"]),
            Route("/api/settings", answer_errors(handlers.get), methods=["GET"]),
            Route("/api/settings", answer_errors(handlers.put), methods=["PUT"])]
