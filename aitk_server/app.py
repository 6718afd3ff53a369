"""The web UI's JSON API (Starlette) and the built front end (`ui/dist`).

Routes (all under /api need the token when one is set, i.e. beyond loopback):
    GET    /api/health                         version, whether a token is required
    GET    /api/examples                       example configs: name -> YAML
    GET    /api/jobs                           every job with its live progress
    POST   /api/jobs                           {"yaml"} or {"example", "name"}; 422 + errors
    GET    /api/jobs/{id}                      one job: config, progress, history
    PUT    /api/jobs/{id}/config               {"yaml"}: edit a job that is not running
    DELETE /api/jobs/{id}                      forget a job that is not running
    POST   /api/jobs/{id}/start                run now, or queue behind the running job
    POST   /api/jobs/{id}/resume               the same, from its last checkpoint
    POST   /api/jobs/{id}/stop                 the trainer saves and exits (130)
    POST   /api/queue                          {"ids": [...]}: run them one after another
    DELETE /api/jobs/{id}/outputs              {"confirm": NAME}: delete what the trainer
                                               wrote in its output folder
    GET    /api/jobs/{id}/loss                 [[step, loss], ...]
    GET    /api/jobs/{id}/samples              [{step, files}]
    GET    /api/jobs/{id}/loras                [{file, size, step, final}]
    GET    /api/jobs/{id}/log                  the end of the trainer's output
    GET    /api/jobs/{id}/files/{path}         a file of its output folder (?download=1)
    GET    /api/events                         server-sent events: the job list on change
    GET    /api/datasets                       folders under the datasets folder
    GET    /api/datasets/{name}/audit          images, sizes, missing captions, unreadable
    PUT    /api/datasets/{name}/files/{file}   upload one image or caption (size-capped)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

import aitk
from aitk_server import auth, configs, datasets, outputs
from aitk_server.confine import inside, simple_name
from aitk_server.db import Database, JobRow
from aitk_server.reconcile import ACTIVE
from aitk_server.runner import Runner

MAX_JSON_BYTES = 1024 * 1024
MAX_UPLOAD_BYTES = 50 * 1024 * 1024


@dataclass(frozen=True)
class Settings:
    root: Path  # the checkout: run.py, and where relative config paths start
    data_dir: Path  # jobs' folders (config, status, log) and the token
    db_path: Path
    examples_dir: Path
    datasets_dir: Path
    ui_dir: Path  # the built front end
    token: str | None = None  # required on /api when set
    python: str = ""  # the trainer's interpreter ("" = this one)
    trainer: Path | None = None  # the trainer script (None = ROOT/run.py)
    max_upload_bytes: int = MAX_UPLOAD_BYTES
    monitor_interval_s: float = 1.0
    stop_timeout_s: float = 120.0

    @classmethod
    def for_checkout(cls, root: Path, **overrides: Any) -> Settings:
        data = overrides.pop("data_dir", root / ".aitk-ui")
        return cls(root=root, data_dir=data,
                   db_path=overrides.pop("db_path", data / "jobs.sqlite"),
                   examples_dir=overrides.pop("examples_dir", root / "config" / "examples"),
                   datasets_dir=overrides.pop("datasets_dir", root / "datasets"),
                   ui_dir=overrides.pop("ui_dir", root / "ui" / "dist"), **overrides)


class ApiError(Exception):
    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.message, self.extra = status, message, extra


# ---- the token ------------------------------------------------------------------------
class TokenGate:
    """Every /api route needs the token (Authorization: Bearer, or ?token= for the
    browser's EventSource, images and downloads, which cannot send headers)."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app, self.token = app, token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.token and scope["type"] == "http" and scope["path"].startswith("/api/"):
            request = Request(scope)
            header = request.headers.get("authorization", "")
            given = header[7:] if header.lower().startswith("bearer ") else \
                request.query_params.get("token")
            if not auth.matches(given, self.token):
                await JSONResponse({"error": "a valid token is required (the one printed "
                                    "when the server started, or AI_TOOLKIT_AUTH)"},
                                   status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


# ---- helpers --------------------------------------------------------------------------
async def read_capped(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the upload is larger than {limit // (1024 * 1024)} MiB")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise ApiError(413, f"the upload is larger than {limit // (1024 * 1024)} MiB")
    return bytes(body)


async def json_body(request: Request) -> dict[str, Any]:
    raw = await read_capped(request, MAX_JSON_BYTES)
    try:
        data = json.loads(raw or b"{}")
    except ValueError:
        raise ApiError(400, "the request body is not JSON") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return data


class Api:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.db = Database(settings.db_path)
        kwargs = {"python": settings.python} if settings.python else {}
        self.runner = Runner(self.db, settings.data_dir, settings.root,
                             trainer=settings.trainer, **kwargs)

    def job(self, request: Request) -> JobRow:
        found = self.db.get(int(request.path_params["job_id"]))
        if found is None:
            raise ApiError(404, "no such job")
        return found

    def view(self, job: JobRow, detail: bool = False) -> dict[str, Any]:
        status = self.runner.status(job.id) or {}
        progress = {k: status.get(k) for k in ("phase", "step", "total_steps", "loss",
                                                "it_per_s", "eta_s")}
        if job.state not in ACTIVE and progress.get("phase") not in (None, "finished",
                                                                     "stopped", "failed"):
            progress["phase"] = None  # a stale phase from a run that ended without a word
        out: dict[str, Any] = {
            "id": job.id, "name": job.name, "state": job.state, "exit_code": job.exit_code,
            "error": job.error, "errors": status.get("errors") or [], "progress": progress,
            "out_dir": job.out_dir, "created": job.created, "started": job.started,
            "ended": job.ended, "queued": job.queue_order is not None}
        if detail:
            out["config_yaml"] = job.config_yaml
            out["history"] = self.db.history(job.id)
        return out

    def taken(self, exclude: int | None = None) -> dict[Path, str]:
        return {Path(j.out_dir).resolve(): j.name for j in self.db.all() if j.id != exclude}

    def checked(self, text: str, exclude: int | None = None) -> configs.Checked:
        result = configs.check(text, self.settings.root, self.taken(exclude))
        if result.loaded is None:
            raise ApiError(422, "the config has problems", errors=result.errors)
        return result

    # ---- routes ---------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        return JSONResponse({"ok": True, "version": aitk.__version__,
                             "token_required": bool(self.settings.token)})

    async def examples(self, request: Request) -> Response:
        return JSONResponse(configs.examples(self.settings.examples_dir))

    async def list_jobs(self, request: Request) -> Response:
        await run_in_threadpool(self.runner.reconcile)
        return JSONResponse([self.view(j) for j in self.db.all()])

    async def create(self, request: Request) -> Response:
        body = await json_body(request)
        text = body.get("yaml")
        if text is None and "example" in body:
            found = configs.examples(self.settings.examples_dir).get(str(body["example"]))
            if found is None:
                raise ApiError(404, f"no example named {body['example']!r}")
            text = configs.with_name(found, str(body["name"])) if body.get("name") else found
        if not isinstance(text, str):
            raise ApiError(400, 'send {"yaml": TEXT} or {"example": NAME}')
        result = self.checked(text)
        assert result.loaded is not None
        job = self.db.create(result.loaded.name, text,
                             str(configs.out_dir(result.loaded, self.settings.root)))
        return JSONResponse({**self.view(job, True), "warnings": result.warnings},
                            status_code=201)

    async def get_job(self, request: Request) -> Response:
        await run_in_threadpool(self.runner.reconcile)
        return JSONResponse(self.view(self.job(request), True))

    async def edit(self, request: Request) -> Response:
        job = self.job(request)
        if job.state in ACTIVE or job.state == "queued":
            raise ApiError(409, f"{job.name} is {job.state}; stop it before editing")
        text = (await json_body(request)).get("yaml")
        if not isinstance(text, str):
            raise ApiError(400, 'send {"yaml": TEXT}')
        result = self.checked(text, exclude=job.id)
        assert result.loaded is not None
        self.db.update(job.id, "config edited", config_yaml=text, name=result.loaded.name,
                       out_dir=str(configs.out_dir(result.loaded, self.settings.root)))
        return JSONResponse(self.view(self.job(request), True))

    async def delete_job(self, request: Request) -> Response:
        job = self.job(request)
        await run_in_threadpool(self.runner.reconcile)
        job = self.job(request)
        if job.state in ACTIVE:
            raise ApiError(409, f"{job.name} is {job.state}; stop it first")
        self.db.delete(job.id)
        shutil.rmtree(self.runner.job_dir(job.id), ignore_errors=True)
        return JSONResponse({"deleted": job.id})

    async def start(self, request: Request) -> Response:
        job = self.job(request)
        return JSONResponse(self.view(await run_in_threadpool(self.runner.start, job)))

    async def stop(self, request: Request) -> Response:
        job = self.job(request)
        return JSONResponse(self.view(await run_in_threadpool(self.runner.stop, job)))

    async def queue(self, request: Request) -> Response:
        ids = (await json_body(request)).get("ids")
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            raise ApiError(400, 'send {"ids": [JOB_ID, ...]}')
        jobs = [self.db.get(i) for i in ids]
        if any(j is None for j in jobs):
            raise ApiError(404, "no such job: " + ", ".join(
                str(i) for i, j in zip(ids, jobs, strict=True) if j is None))
        done = [await run_in_threadpool(self.runner.enqueue, j) for j in jobs if j]
        return JSONResponse([self.view(j) for j in done])

    async def delete_outputs(self, request: Request) -> Response:
        job = self.job(request)
        await run_in_threadpool(self.runner.reconcile)
        job = self.job(request)
        if (await json_body(request)).get("confirm") != job.name:
            raise ApiError(400, f'confirm with {{"confirm": "{job.name}"}}: this deletes '
                           f"{job.out_dir} (LoRA files, checkpoints, samples)")
        if job.state in ACTIVE or job.state == "queued":
            raise ApiError(409, f"{job.name} is {job.state}; stop it first")
        removed = outputs.delete_outputs(Path(job.out_dir), job.name)
        self.db.update(job.id, f"outputs deleted ({len(removed)} entries)", state="created",
                       exit_code=None, error=None)
        self.runner.status_path(job.id).unlink(missing_ok=True)
        return JSONResponse({**self.view(self.job(request)), "removed": removed})

    async def loss(self, request: Request) -> Response:
        job = self.job(request)
        limit = request.query_params.get("max_points", "1000")
        points = outputs.loss_points(Path(job.out_dir), int(limit) if limit.isdigit() else 1000)
        return JSONResponse(points)

    async def samples(self, request: Request) -> Response:
        return JSONResponse(outputs.samples(Path(self.job(request).out_dir)))

    async def loras(self, request: Request) -> Response:
        job = self.job(request)
        return JSONResponse(outputs.loras(Path(job.out_dir), job.name))

    async def log(self, request: Request) -> Response:
        path = self.runner.log_path(self.job(request).id)
        try:
            with open(path, "rb") as fh:
                fh.seek(max(0, path.stat().st_size - 64 * 1024))
                text = fh.read().decode("utf-8", errors="replace")
        except OSError:
            text = ""
        return JSONResponse({"log": text})

    async def file(self, request: Request) -> Response:
        job = self.job(request)
        found = inside(Path(job.out_dir), request.path_params["path"])
        if found is None or not found.is_file():
            raise ApiError(404, "no such file in this job's output folder")
        download = request.query_params.get("download") == "1"
        return FileResponse(found, filename=found.name if download else None,
                            content_disposition_type="attachment" if download else "inline")

    async def events(self, request: Request) -> Response:
        async def stream() -> AsyncIterator[str]:
            last, quiet = None, 0
            while not request.app.state.closing.is_set():
                if await request.is_disconnected():
                    return
                await run_in_threadpool(self.runner.reconcile)
                payload = json.dumps([self.view(j) for j in self.db.all()])
                if payload != last:
                    last, quiet = payload, 0
                    yield f"event: jobs\ndata: {payload}\n\n"
                elif (quiet := quiet + 1) >= 15:
                    quiet = 0
                    yield ": still here\n\n"
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(request.app.state.closing.wait(),
                                           self.settings.monitor_interval_s)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store"})

    def dataset(self, name: str) -> Path:
        if not simple_name(name):
            raise ApiError(400, "a dataset is a folder name under the datasets folder")
        found = inside(self.settings.datasets_dir, name)
        if found is None or not found.is_dir():
            raise ApiError(404, f"no dataset folder {name!r}")
        return found

    async def list_datasets(self, request: Request) -> Response:
        return JSONResponse({"folder": str(self.settings.datasets_dir),
                             "datasets": datasets.folders(self.settings.datasets_dir)})

    async def audit(self, request: Request) -> Response:
        folder = self.dataset(request.path_params["name"])
        ext = request.query_params.get("caption_ext", "txt")
        if not ext.isalnum():
            raise ApiError(400, "caption_ext is letters and digits")
        return JSONResponse(await run_in_threadpool(datasets.audit, folder, ext))

    async def upload(self, request: Request) -> Response:
        name, file_name = request.path_params["name"], request.path_params["file"]
        if not simple_name(name) or not simple_name(file_name):
            raise ApiError(400, "dataset and file names are single names (no folders)")
        if Path(file_name).suffix.lower() not in datasets.UPLOAD_EXTENSIONS:
            raise ApiError(400, "only " + ", ".join(datasets.UPLOAD_EXTENSIONS) +
                           " files can be uploaded")
        root = self.settings.datasets_dir
        root.mkdir(parents=True, exist_ok=True)
        folder = root / name
        if folder.is_symlink() or (folder.exists() and inside(root, name) is None):
            raise ApiError(400, "that dataset folder points outside the datasets folder")
        folder.mkdir(exist_ok=True)
        target = folder / file_name
        if target.is_symlink():
            raise ApiError(400, "that file is a symlink; it is not replaced")
        data = await read_capped(request, self.settings.max_upload_bytes)
        fd, tmp = tempfile.mkstemp(prefix=f".{file_name}.", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return JSONResponse({"dataset": name, "file": file_name, "size": len(data)},
                            status_code=201)


def not_built_page(ui_dir: Path) -> HTMLResponse:
    return HTMLResponse(
        "<!doctype html><title>aitk</title><h1>aitk: the web UI is not built</h1>"
        f"<p>{ui_dir} has no index.html. Run <code>python3 -m manager sync</code> "
        "(it builds the UI with the checkout's Node), then reload.</p>"
        "<p>The JSON API is at <code>/api/jobs</code>.</p>", status_code=503)


def create_app(settings: Settings, on_ready: Any = None) -> Starlette:
    """`on_ready()` runs once the app has started (the server then accepts requests)."""
    api = Api(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        app.state.closing = asyncio.Event()
        await run_in_threadpool(api.runner.reconcile)  # adopt or close what ran before

        async def monitor() -> None:  # queued jobs move on with nobody watching
            while True:
                await asyncio.sleep(settings.monitor_interval_s)
                await run_in_threadpool(api.runner.reconcile)

        task = asyncio.create_task(monitor())
        if on_ready is not None:
            on_ready()
        try:
            yield
        finally:
            task.cancel()
            app.state.closing.set()

    def route(path: str, endpoint: Any, *methods: str) -> Route:
        async def guarded(request: Request) -> Response:
            try:
                return await endpoint(request)
            except ApiError as exc:
                return JSONResponse({"error": exc.message, **exc.extra},
                                    status_code=exc.status)

        return Route(path, guarded, methods=list(methods) or ["GET"])

    job = "/api/jobs/{job_id:int}"
    routes = [
        route("/api/health", api.health),
        route("/api/examples", api.examples),
        route("/api/jobs", api.list_jobs),
        route("/api/jobs", api.create, "POST"),
        route(job, api.get_job),
        route(job, api.delete_job, "DELETE"),
        route(f"{job}/config", api.edit, "PUT"),
        route(f"{job}/start", api.start, "POST"),
        route(f"{job}/resume", api.start, "POST"),
        route(f"{job}/stop", api.stop, "POST"),
        route("/api/queue", api.queue, "POST"),
        route(f"{job}/outputs", api.delete_outputs, "DELETE"),
        route(f"{job}/loss", api.loss),
        route(f"{job}/samples", api.samples),
        route(f"{job}/loras", api.loras),
        route(f"{job}/log", api.log),
        route(f"{job}/files/{{path:path}}", api.file),
        route("/api/events", api.events),
        route("/api/datasets", api.list_datasets),
        route("/api/datasets/{name}/audit", api.audit),
        route("/api/datasets/{name}/files/{file}", api.upload, "PUT"),
    ]
    if (settings.ui_dir / "index.html").is_file():
        routes.append(Mount("/", StaticFiles(directory=settings.ui_dir, html=True)))
    else:
        routes.append(Route("/", lambda request: not_built_page(settings.ui_dir)))
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.api = api
    app.state.closing = asyncio.Event()
    app.add_middleware(TokenGate, token=settings.token)
    return app
