"""Captioning a dataset from the page (aitk_server/captions.py runs it):

    POST   /api/datasets/{name}/caption   {"model", "prompt"?, "trigger"?, "overwrite"?}
                                          -> 202 the run (409 while one captions it)
    GET    /api/captioning                every run, newest first (kept across restarts:
                                          one the server died under is `interrupted`)
    POST   /api/captioning/{id:int}/stop  stop after the current image
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from aitk_server import datasets
from aitk_server.captions import CaptionConflict, Captioning
from aitk_server.http import ApiError, answer_errors, json_body


class CaptionRoutes:
    def __init__(self, captioning: Captioning, root: Path) -> None:
        self.captioning, self.root = captioning, root

    async def start(self, request: Request) -> Response:
        name = request.path_params["name"]
        body = await json_body(request)
        try:
            folder = datasets.folder(self.root, name)
        except datasets.DatasetError as exc:
            raise ApiError(404 if exc.missing else 400, str(exc)) from None
        fields: dict[str, Any] = {}
        for key, limit in (("model", 500), ("prompt", 2000), ("trigger", 100)):
            value = body.get(key)
            if value is not None and (not isinstance(value, str) or len(value) > limit
                                      or "\0" in value):
                raise ApiError(400, f"{key} is text of at most {limit} characters")
            fields[key] = value or None
        if not fields["model"]:
            raise ApiError(400, 'name the model: {"model": "FOLDER or org/name"}')
        try:
            run = await run_in_threadpool(
                self.captioning.start, name, folder, fields["model"], fields["prompt"],
                fields["trigger"], body.get("overwrite") is True)
        except CaptionConflict as exc:
            raise ApiError(409, str(exc)) from None
        except OSError as exc:
            raise ApiError(409, f"cannot start the captioner ({exc.strerror or exc})"
                           ) from None
        return JSONResponse(run, status_code=202)

    async def list(self, request: Request) -> Response:
        return JSONResponse(await run_in_threadpool(self.captioning.all))

    async def stop(self, request: Request) -> Response:
        await json_body(request)
        try:
            return JSONResponse(self.captioning.stop(request.path_params["run_id"]))
        except KeyError:
            raise ApiError(404, "no such captioning run") from None


def routes(captioning: Captioning, root: Path) -> list[Route]:
    handlers = CaptionRoutes(captioning, root)
    return [Route("/api/datasets/{name}/caption", answer_errors(handlers.start),
                  methods=["POST"]),
            Route("/api/captioning", answer_errors(handlers.list), methods=["GET"]),
            Route("/api/captioning/{run_id:int}/stop", answer_errors(handlers.stop),
                  methods=["POST"])]
