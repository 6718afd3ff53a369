"""The dataset manager's routes (aitk_server/datasets.py does the work):

    GET    /api/datasets                          folders under the datasets folder
    POST   /api/datasets                          {"name"}: a new, empty dataset
    GET    /api/datasets/{name}/audit             images, sizes, captions, unreadable, and
                                                  the trainer's audit findings per file
    PUT    /api/datasets/{name}/files/{file}      upload one image, video or caption
                                                  (application/octet-stream, size-capped)
    GET    /api/datasets/{name}/files/{file}      an image or video inline, else a download
    DELETE /api/datasets/{name}/files/{file}      into the trash (with its caption)
    POST   /api/datasets/{name}/files/{file}/rename   {"to": NEW_NAME_WITHOUT_EXTENSION}
    PUT    /api/datasets/{name}/captions/{file}   {"text"}: the caption, written atomically
    GET    /api/datasets/{name}/thumbs/{file}     a small JPEG of an image (cached)
    GET    /api/datasets/{name}/pairs?control=C   each target with its control image in
                                                  dataset C (repeat for several; none:
                                                  NAME_control by convention), and what
                                                  has no partner
    GET    /api/datasets/{name}/trash             what was deleted, newest first
    POST   /api/datasets/{name}/trash/{entry}/restore
    GET    /api/datasets/{name}/zip               the dataset as a zip download
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from aitk_common.files import atomic_write_bytes
from aitk_server import datasets
from aitk_server.http import ApiError, answer_errors, json_body, media_type, read_capped


def _caption_ext(request: Request) -> str:
    ext = request.query_params.get("caption_ext", "txt")
    if not ext.isascii() or not ext.isalnum() or len(ext) > 10:
        raise ApiError(400, "caption_ext is letters and digits")
    return ext


class DatasetRoutes:
    def __init__(self, root: Path, data_dir: Path, max_upload_bytes: int) -> None:
        self.root, self.data_dir, self.max_upload_bytes = root, data_dir, max_upload_bytes

    async def run(self, work: Any, *args: Any) -> Any:
        """A dataset operation in a worker thread; its DatasetError as a 4xx line."""
        try:
            return await run_in_threadpool(work, *args)
        except datasets.DatasetError as exc:
            raise ApiError(404 if exc.missing else 409 if exc.taken else 400,
                           str(exc)) from None
        except OSError as exc:
            raise ApiError(409, f"the dataset folder cannot be changed "
                           f"({exc.strerror or exc})") from None

    def names(self, request: Request) -> tuple[str, str]:
        return request.path_params["name"], request.path_params.get("file", "")

    async def list(self, request: Request) -> Response:
        return JSONResponse({"folder": str(self.root),
                             "datasets": datasets.folders(self.root)})

    async def create(self, request: Request) -> Response:
        name = (await json_body(request)).get("name")
        if not isinstance(name, str):
            raise ApiError(400, 'send {"name": TEXT}')
        await self.run(datasets.create, self.root, name)
        return JSONResponse({"name": name, "images": 0}, status_code=201)

    async def audit(self, request: Request) -> Response:
        name, _ = self.names(request)
        ext = _caption_ext(request)
        folder = await self.run(datasets.folder, self.root, name)
        found = await self.run(datasets.audit, folder, self.root, ext)
        found["findings"] = await self.run(datasets.findings, folder, ext)
        return JSONResponse(found)

    async def upload(self, request: Request) -> Response:
        name, file_name = self.names(request)
        if media_type(request) != "application/octet-stream":
            raise ApiError(415, "send the file's bytes as application/octet-stream")
        target = await self.run(datasets.upload_target, self.root, name, file_name)
        data = await read_capped(request, self.max_upload_bytes)
        await run_in_threadpool(atomic_write_bytes, target, data)
        return JSONResponse({"dataset": name, "file": file_name, "size": len(data)},
                            status_code=201)

    async def file(self, request: Request) -> Response:
        name, file_name = self.names(request)
        path = await self.run(datasets.member, self.root, name, file_name)
        shown = datasets.media_type(path)
        return FileResponse(path, media_type=shown or "application/octet-stream",
                            filename=path.name,
                            content_disposition_type="inline" if shown else "attachment")

    async def delete(self, request: Request) -> Response:
        name, file_name = self.names(request)
        entry = await self.run(datasets.trash, self.root, name, file_name,
                               _caption_ext(request))
        return JSONResponse({"trash": entry})

    async def rename(self, request: Request) -> Response:
        name, file_name = self.names(request)
        to = (await json_body(request)).get("to")
        if not isinstance(to, str):
            raise ApiError(400, 'send {"to": NEW_NAME}')
        new = await self.run(datasets.rename, self.root, name, file_name, to,
                             _caption_ext(request))
        return JSONResponse({"file": new})

    async def caption(self, request: Request) -> Response:
        name, file_name = self.names(request)
        text = (await json_body(request)).get("text")
        if not isinstance(text, str):
            raise ApiError(400, 'send {"text": CAPTION}')
        path = await self.run(datasets.write_caption, self.root, name, file_name, text,
                              _caption_ext(request))
        return JSONResponse({"caption": path.name, "text": text})

    async def pairs(self, request: Request) -> Response:
        name, _ = self.names(request)
        chosen = request.query_params.getlist("control") or None
        return JSONResponse(await self.run(datasets.control_pairs, self.root, name, chosen))

    async def thumb(self, request: Request) -> Response:
        name, file_name = self.names(request)
        thumb = await self.run(datasets.thumbnail, self.root, name, file_name,
                               self.data_dir / "thumbs")
        return FileResponse(thumb, media_type="image/jpeg",
                            headers={"Cache-Control": "private, max-age=60"})

    async def trash(self, request: Request) -> Response:
        name, _ = self.names(request)
        await self.run(datasets.folder, self.root, name)
        return JSONResponse(datasets.trashed(self.root, name))

    async def restore(self, request: Request) -> Response:
        name, _ = self.names(request)
        await json_body(request)
        files = await self.run(datasets.restore, self.root, name,
                               request.path_params["entry"])
        return JSONResponse({"restored": files})

    async def zip(self, request: Request) -> Response:
        name, _ = self.names(request)
        scratch = self.data_dir / "zips"
        scratch.mkdir(parents=True, exist_ok=True)
        handle, tmp = tempfile.mkstemp(dir=scratch, suffix=".zip")
        try:
            with os.fdopen(handle, "wb") as out:
                await self.run(datasets.write_zip, self.root, name, out)
        except BaseException:
            os.unlink(tmp)
            raise
        return FileResponse(tmp, media_type="application/zip", filename=f"{name}.zip",
                            background=BackgroundTask(os.unlink, tmp))


def routes(root: Path, data_dir: Path, max_upload_bytes: int) -> list[Route]:
    handlers = DatasetRoutes(root, data_dir, max_upload_bytes)
    one, file = "/api/datasets/{name}", "/api/datasets/{name}/files/{file}"

    def route(path: str, endpoint: Any, method: str = "GET") -> Route:
        return Route(path, answer_errors(endpoint), methods=[method])

    return [
        route("/api/datasets", handlers.list),
        route("/api/datasets", handlers.create, "POST"),
        route(f"{one}/audit", handlers.audit),
        route(file, handlers.upload, "PUT"),
        route(file, handlers.file),
        route(file, handlers.delete, "DELETE"),
        route(f"{file}/rename", handlers.rename, "POST"),
        route(f"{one}/captions/{{file}}", handlers.caption, "PUT"),
        route(f"{one}/thumbs/{{file}}", handlers.thumb),
        route(f"{one}/pairs", handlers.pairs),
        route(f"{one}/trash", handlers.trash),
        route(f"{one}/trash/{{entry}}/restore", handlers.restore, "POST"),
        route(f"{one}/zip", handlers.zip),
    ]
