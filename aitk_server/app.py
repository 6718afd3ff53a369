"""The web UI's JSON API (Starlette) and the built front end (`ui/dist`).

Every route sits behind the guard (guard.py: Host, Origin, the secret, never CORS); the
handlers here check only what a request asks for. Routes:
    GET    /auth/{code}                        (the guard) a one-time sign-in link
    POST   /api/session                        (the guard) {"token"}: sign in, --listen
    POST   /api/links                          (the guard) a new one-time link (tools)
    GET    /api/health                         version, whether a token is required
    GET    /api/examples                       example configs: name -> YAML
    GET    /api/jobs                           every job with its live progress
    GET    /api/form                           the job form's fields and the model picker
    POST   /api/form                           {"yaml", "edits"}: the form's changes made
                                               in the YAML -> {"yaml", "values"}
    POST   /api/check                          {"yaml"}: the trainer's full preflight,
                                               without making a job
    POST   /api/jobs                           {"yaml"} or {"example", "name"}; 422 + errors
                                               (schema, confinement, `run.py --check`)
    GET    /api/jobs/{id}                      one job: config, progress, history, kind
                                               (a file job: `files`, what it made)
    PUT    /api/jobs/{id}/config               {"yaml"}: edit a job that is not running
    DELETE /api/jobs/{id}                      forget a job that is not running
    POST   /api/jobs/{id}/start                run now, or queue behind the running job
    POST   /api/jobs/{id}/resume               the same, from its last checkpoint
    POST   /api/jobs/{id}/stop                 the trainer saves and exits (130)
    POST   /api/jobs/{id}/copy                 {"name"}: "run again", a new job
    POST   /api/jobs/{id}/ask                  {"what": "save"|"sample"}: at the next step
    POST   /api/queue                          {"ids": [...]}: run them one after another
    POST   /api/queue/order                    {"ids": [...]}: these queued jobs start
                                               first, in this order; the rest after them
                                               as they were (409 naming one not queued)
    DELETE /api/jobs/{id}/outputs              {"confirm": NAME}: delete what the trainer
                                               wrote in its output folder
    GET    /api/jobs/{id}/loss                 [[step, loss], ...]
    GET    /api/jobs/{id}/samples              [{step, files}]
    GET    /api/jobs/{id}/previews             per prompt across steps, with prompt and seed
    GET    /api/jobs/{id}/loras                [{file, size, step, final}]
    GET    /api/jobs/{id}/log                  the end of the trainer's output
    GET    /api/jobs/{id}/files/{path}         a file the trainer wrote in its output folder
    GET    /api/events                         server-sent events: the job list on change
    /api/datasets...                           the dataset manager (routes/datasets.py)
    /api/machine, /api/settings                the monitor and settings (routes/system.py)
    /api/datasets/{name}/caption, /api/captioning   captioning runs (routes/captioning.py)
Writes send JSON (`{}` when there is nothing to say). A job's view carries `actions`
(aitk_common.jobstates: what its state allows) and `active`, so the page holds no list
of states. Every error is one line: {"error": ...} with a 4xx (503 while the database
is unavailable).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import shutil
import sqlite3
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

import aitk
from aitk_common import jobstates, requests
from aitk_common.jobstates import ACTIVE, ENDED, Action
from aitk_server import configs, form, outputs, preflight
from aitk_server.auth import Keys
from aitk_server.captions import Captioning
from aitk_server.db import Database, JobRow, valid_id
from aitk_server.guard import Guard, Policy
from aitk_server.http import (
    MAX_JSON_BYTES,
    ApiError,
    answer_errors,
    json_body,
    small_count,
    text_field,
)
from aitk_server.routes.captioning import routes as caption_routes
from aitk_server.routes.datasets import routes as dataset_routes
from aitk_server.routes.system import routes as system_routes
from aitk_server.runner import Runner, queue_of

MAX_UPLOAD_BYTES = 50 * 1024 * 1024
DEFAULT_PORT = 8675
log = logging.getLogger("aitk_server")


@dataclass(frozen=True)
class Settings:
    root: Path  # the checkout: run.py, and where relative config paths start
    data_dir: Path  # jobs' folders (config, status, log) and the token
    db_path: Path
    examples_dir: Path
    datasets_dir: Path
    ui_dir: Path  # the built front end
    outputs_dir: Path  # jobs made here write only under it
    port: int = DEFAULT_PORT  # the port the server is reached on (the Host allow-list)
    token: str | None = None  # --listen: the access token (and IP literals as hosts)
    secret: str = ""  # this start's secret ("" = make one; __main__ stores it 0600)
    allowed_hosts: tuple[str, ...] = ()  # --allowed-host NAME
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
                   ui_dir=overrides.pop("ui_dir", root / "ui" / "dist"),
                   outputs_dir=overrides.pop("outputs_dir", root / "output"), **overrides)


def job_id(value: object) -> int:
    """A job id from a request: an integer SQLite can hold, else 404 (no such job)."""
    if isinstance(value, bool) or not isinstance(value, int) or not valid_id(value):
        raise ApiError(404, f"no such job: {str(value)[:40]}")
    return value



def kind_of(job: JobRow) -> str:
    """The stored job's kind (`job:`); a config that no longer parses counts as
    training, whose file rules are the narrowest."""
    try:
        return configs.parse_stored(job.config_yaml).kind
    except ValueError:
        return "extension"


class Api:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.db = Database(settings.db_path)
        kwargs = {"python": settings.python} if settings.python else {}
        self.runner = Runner(self.db, settings.data_dir, settings.root,
                             trainer=settings.trainer, **kwargs)
        self.captioning = Captioning(settings.data_dir, settings.root, self.runner.python)

    def job(self, request: Request) -> JobRow:
        found = self.db.get(job_id(request.path_params["job_id"]))
        if found is None:
            raise ApiError(404, "no such job")
        return found

    def allow(self, job: JobRow, action: Action) -> None:
        if not jobstates.allows(job.state, action):
            raise ApiError(409, f"{job.name} is {job.state}; stop it first")

    def places(self, jobs: list[JobRow] | None = None) -> dict[int, int]:
        """Each queued job's place in the queue: 1 starts next."""
        return {j.id: n for n, j in enumerate(queue_of(self.db.all() if jobs is None else jobs), 1)}

    def view(self, job: JobRow, detail: bool = False,
             places: dict[int, int] | None = None) -> dict[str, Any]:
        status = self.runner.status(job.id)
        fields = status.to_json() if status is not None else {}
        progress = honest_progress(fields, job.state in ACTIVE)
        out: dict[str, Any] = {
            "id": job.id, "name": job.name, "state": job.state,
            "active": jobstates.is_active(job.state), "actions": jobstates.actions(job.state),
            "exit_code": job.exit_code,
            "error": job.error, "errors": fields.get("errors") or [], "progress": progress,
            "out_dir": job.out_dir, "created": job.created, "started": job.started,
            "ended": job.ended, "queued": job.queue_order is not None,
            "queue_place": (places if places is not None else self.places()).get(job.id),
            "asked": sorted(r.value for r in requests.pending(
                self.runner.requests_dir(job.id))) if job.state in ACTIVE else []}
        if detail:
            out["config_yaml"] = job.config_yaml
            out["history"] = self.db.history(job.id)
            out["kind"] = kind = kind_of(job)
            if kind in configs.FILE_KINDS:  # what it made, for the file route
                out["files"] = outputs.file_job_outputs(Path(job.out_dir))
        return out

    def taken(self, exclude: int | None = None) -> dict[Path, str]:
        return {Path(j.out_dir).resolve(): j.name for j in self.db.all() if j.id != exclude}

    def checked(self, text: str, exclude: int | None = None) -> configs.Checked:
        result = configs.check(text, self.settings.root, self.settings.outputs_dir,
                               self.taken(exclude))
        if result.loaded is None:
            raise ApiError(422, "the config has problems", errors=result.errors)
        return result

    def trainer_check(self, text: str) -> preflight.Verdict:
        """The trainer's own `run.py --check` (device, optimizer, datasets, arch)."""
        return preflight.check(text, python=self.runner.python, trainer=self.runner.trainer,
                               root=self.settings.root,
                               scratch=self.settings.data_dir / "checks")

    async def accepted(self, text: str, exclude: int | None = None
                       ) -> tuple[configs.Checked, preflight.Verdict]:
        """A config a job may run: the server's checks (schema, confinement, folders,
        another job's output folder), then the trainer's full preflight, so a config
        that cannot start is never accepted silently. 422 with every problem at its
        field otherwise."""
        result = self.checked(text, exclude)
        verdict = await run_in_threadpool(self.trainer_check, text)
        if not verdict.ok:
            raise ApiError(422, "the trainer's check refuses this config",
                           errors=verdict.errors, notes=verdict.notes,
                           memory=verdict.memory)
        return result, verdict

    def created(self, text: str, result: configs.Checked, verdict: preflight.Verdict
                ) -> Response:
        assert result.loaded is not None
        job = self.db.create(result.loaded.name, text,
                             str(configs.out_dir(result.loaded, self.settings.root)))
        return JSONResponse({**self.view(job, True), "warnings": result.warnings,
                             "notes": verdict.notes, "memory": verdict.memory},
                            status_code=201)

    # ---- routes ---------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        return JSONResponse({"ok": True, "version": aitk.__version__,
                             "token_required": bool(self.settings.token)})

    async def examples(self, request: Request) -> Response:
        return JSONResponse(configs.examples(self.settings.examples_dir))

    async def list_jobs(self, request: Request) -> Response:
        await run_in_threadpool(self.runner.reconcile)
        return JSONResponse(self.views())

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
        return self.created(text, *await self.accepted(text))

    async def copy(self, request: Request) -> Response:
        """"Run again" under a new name: the job's config with `config.name` replaced
        (every comment kept), checked as a new job is."""
        job = self.job(request)
        name = text_field(await json_body(request), "name")
        assert name is not None
        try:
            text = form.apply(job.config_yaml, [{"path": "config.name", "value": name}])
        except form.EditError as exc:
            raise ApiError(422, "the config has problems",
                           errors=[{"path": "config.name", "message": str(exc)}]) from None
        return self.created(text, *await self.accepted(text))

    async def check(self, request: Request) -> Response:
        """{"yaml"} (and "job": the id being edited): every problem the job would meet,
        without making it; always 200 {ok, errors, notes, memory}."""
        body = await json_body(request)
        text = body.get("yaml")
        if not isinstance(text, str):
            raise ApiError(400, 'send {"yaml": TEXT}')
        exclude = body.get("job") if isinstance(body.get("job"), int) else None
        try:
            self.checked(text, exclude)
        except ApiError as exc:
            return JSONResponse({"ok": False, **exc.extra, "notes": [], "memory": None})
        verdict = await run_in_threadpool(self.trainer_check, text)
        return JSONResponse({"ok": verdict.ok, "errors": verdict.errors,
                             "notes": verdict.notes, "memory": verdict.memory})

    async def form_spec(self, request: Request) -> Response:
        """The form's fields (config paths, kinds, bounds from the schema) and the
        model picker's archs (the torch-free descriptions) with their defaults."""
        from aitk.models import catalog

        shipped = configs.examples(self.settings.examples_dir)
        return JSONResponse({"fields": form.spec(),
                             "archs": [form.arch_view(d, shipped)
                                       for d in catalog.descriptions()]})

    async def form_edit(self, request: Request) -> Response:
        """{"yaml", "edits": [{path, value} | {path, remove}]} -> {"yaml", "values"}:
        the form's changes written into the text (comments of the rest kept) and every
        field's value read back from it."""
        body = await json_body(request)
        text, edits = body.get("yaml"), body.get("edits", [])
        if not isinstance(text, str) or not isinstance(edits, list) or not all(
                isinstance(e, dict) for e in edits):
            raise ApiError(400, 'send {"yaml": TEXT, "edits": [{"path", "value"}, ...]}')
        try:
            configs.load_yaml(text)
            if edits:
                text = form.apply(text, edits)
            data = configs.load_yaml(text)
        except form.EditError as exc:
            raise ApiError(422, "the form cannot make that change",
                           errors=[{"path": "", "message": str(exc)}]) from None
        except ValueError as exc:
            raise ApiError(422, "the YAML has problems",
                           errors=[{"path": "", "message": str(exc)}]) from None
        return JSONResponse({"yaml": text, "values": form.values(data)})

    async def get_job(self, request: Request) -> Response:
        await run_in_threadpool(self.runner.reconcile)
        return JSONResponse(self.view(self.job(request), True))

    async def edit(self, request: Request) -> Response:
        job = self.job(request)
        self.allow(job, Action.EDIT)
        text = (await json_body(request)).get("yaml")
        if not isinstance(text, str):
            raise ApiError(400, 'send {"yaml": TEXT}')
        result, _ = await self.accepted(text, exclude=job.id)
        assert result.loaded is not None
        self.db.update(job.id, "config edited", config_yaml=text, name=result.loaded.name,
                       out_dir=str(configs.out_dir(result.loaded, self.settings.root)))
        return JSONResponse(self.view(self.job(request), True))

    async def delete_job(self, request: Request) -> Response:
        job = self.job(request)
        await run_in_threadpool(self.runner.reconcile)
        job = self.job(request)
        self.allow(job, Action.DELETE)
        self.db.delete(job.id)
        shutil.rmtree(self.runner.job_dir(job.id), ignore_errors=True)
        return JSONResponse({"deleted": job.id})

    async def start(self, request: Request) -> Response:
        job = self.job(request)
        await json_body(request)  # nothing to say, but a write sends JSON
        return JSONResponse(self.view(await run_in_threadpool(self.runner.start, job.id)))

    async def stop(self, request: Request) -> Response:
        job = self.job(request)
        await json_body(request)
        return JSONResponse(self.view(await run_in_threadpool(self.runner.stop, job.id)))

    async def ask(self, request: Request) -> Response:
        """{"what": "save" | "sample"}: the running trainer saves (or previews) at its
        next step boundary (aitk_common.requests)."""
        job = self.job(request)
        what = (await json_body(request)).get("what")
        try:
            asked = requests.Request(what)
        except ValueError:
            raise ApiError(400, 'send {"what": "save"} or {"what": "sample"}') from None
        if not jobstates.allows(job.state, Action.SAVE_NOW if asked is
                                requests.Request.SAVE else Action.SAMPLE_NOW):
            raise ApiError(409, f"{job.name} is {job.state}: only a running job "
                           "can be asked that")
        requests.ask(self.runner.requests_dir(job.id), asked)
        return JSONResponse(self.view(self.job(request)))

    async def known_jobs(self, request: Request) -> list[JobRow]:
        """The jobs of a body {"ids": [JOB_ID, ...]}: 400 for anything else, 404 naming
        the ids of no job."""
        ids = (await json_body(request)).get("ids")
        if not isinstance(ids, list) or len(ids) > 10_000 or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise ApiError(400, 'send {"ids": [JOB_ID, ...]}')
        jobs = [self.db.get(i) if valid_id(i) else None for i in ids]
        if any(j is None for j in jobs):
            raise ApiError(404, "no such job: " + ", ".join(
                str(i)[:40] for i, j in zip(ids, jobs, strict=True) if j is None))
        return [j for j in jobs if j is not None]

    async def queue(self, request: Request) -> Response:
        jobs = await self.known_jobs(request)
        done = [await run_in_threadpool(self.runner.enqueue, j.id) for j in jobs]
        places = self.places()
        return JSONResponse([self.view(j, places=places) for j in done])

    async def queue_order(self, request: Request) -> Response:
        """{"ids"}: these queued jobs start first, in this order; the queue's other
        jobs follow as they were. -> the queue in its new order."""
        ids = [j.id for j in await self.known_jobs(request)]
        if len(set(ids)) != len(ids):
            raise ApiError(400, "each job once: a job is named twice")
        queue = await run_in_threadpool(self.runner.reorder, ids)
        places = self.places()
        return JSONResponse([self.view(j, places=places) for j in queue])

    async def delete_outputs(self, request: Request) -> Response:
        job = self.job(request)
        await run_in_threadpool(self.runner.reconcile)
        job = self.job(request)
        if (await json_body(request)).get("confirm") != job.name:
            raise ApiError(400, f'confirm with {{"confirm": "{job.name}"}}: this deletes '
                           f"{job.out_dir} (LoRA files, checkpoints, samples)")
        self.allow(job, Action.DELETE_OUTPUTS)
        removed = outputs.delete_outputs(Path(job.out_dir), job.name, kind_of(job))
        self.db.update(job.id, f"outputs deleted ({len(removed)} entries)",
                       state=jobstates.JobState.CREATED, exit_code=None, error=None)
        self.runner.status_path(job.id).unlink(missing_ok=True)
        return JSONResponse({**self.view(self.job(request)), "removed": removed})

    async def loss(self, request: Request) -> Response:
        job = self.job(request)
        limit = small_count(request.query_params.get("max_points", ""), 1000, 100_000)
        return JSONResponse(outputs.loss_points(Path(job.out_dir), limit))

    async def samples(self, request: Request) -> Response:
        return JSONResponse(outputs.samples(Path(self.job(request).out_dir)))

    async def previews(self, request: Request) -> Response:
        job = self.job(request)
        try:
            proc = configs.parse_stored(job.config_yaml).job.config.process[0]
            sample, trigger = proc.sample, proc.trigger_word
        except (ValueError, IndexError, AttributeError):  # no longer parses, or a file
            # job (no previews): files only
            sample, trigger = None, None
        return JSONResponse(outputs.previews(Path(job.out_dir), sample, trigger))

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
        """Only a file the trainer wrote; a preview inline as its image type, anything
        else as a download; never HTML (outputs.served_file)."""
        job = self.job(request)
        found = await run_in_threadpool(outputs.served_file, Path(job.out_dir), job.name,
                                        request.path_params["path"], kind_of(job))
        if found is None:
            raise ApiError(404, "no such file written by the trainer in this job's folder")
        download = not found.inline or request.query_params.get("download") == "1"
        return FileResponse(found.path, media_type=found.media_type, filename=found.path.name,
                            content_disposition_type="attachment" if download else "inline")

    def views(self) -> list[dict[str, Any]]:
        jobs = self.db.all()
        places = self.places(jobs)
        return [self.view(j, places=places) for j in jobs]

    def snapshot(self) -> str:
        self.runner.reconcile()
        return json.dumps(self.views())

    async def events(self, request: Request) -> Response:
        async def stream() -> AsyncIterator[str]:
            last, quiet = None, 0
            while not request.app.state.closing.is_set():
                if await request.is_disconnected():
                    return
                try:
                    payload = await run_in_threadpool(self.snapshot)
                except (sqlite3.Error, OSError):
                    payload = last  # the database away for a moment: the next round
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


PHASE_WORDS = {"starting": "starting the trainer", "loading": "loading the model",
               "caching": "caching latents and text embeddings",
               "training": "training", "sampling": "making previews",
               "saving": "saving a checkpoint", "captioning": "captioning",
               "working": "working", "finished": "finished",
               "stopped": "stopped", "failed": "failed"}


def honest_progress(status: dict[str, Any], active: bool) -> dict[str, Any]:
    """What the page shows of a run: a phase from its first second ("starting" until
    the trainer's first status, whose file the runner removed at launch), in words;
    speed and ETA only while it trains (never a finished job's last it/s)."""
    progress = {k: status.get(k) for k in ("phase", "step", "total_steps", "loss",
                                            "it_per_s", "eta_s", "message")}
    phase = progress["phase"]
    if active and phase is None:
        phase = "starting"
    elif not active and phase is not None and phase not in {s.value for s in ENDED}:
        phase = None  # a stale phase from a run that ended without a word
    if not active or phase != "training":
        progress["it_per_s"] = progress["eta_s"] = None
    progress["phase"] = phase
    progress["phase_text"] = PHASE_WORDS.get(phase, phase) if phase else None
    return progress


def not_built_page(ui_dir: Path) -> HTMLResponse:
    return HTMLResponse(
        "<!doctype html><title>aitk</title><h1>aitk: the web UI is not built</h1>"
        f"<p>{ui_dir} has no index.html. Run <code>python3 -m manager sync</code> "
        "(it builds the UI with the checkout's Node), then reload.</p>"
        "<p>The JSON API is at <code>/api/jobs</code>.</p>", status_code=503)


async def monitor(runner: Runner, interval_s: float) -> None:
    """Queued jobs move on, and ended ones are recorded, with nobody watching. Any error
    (the database away for a moment, a full disk) is logged once and retried: the
    monitor never stops while the server runs."""
    failing: str | None = None
    while True:
        await asyncio.sleep(interval_s)
        try:
            await run_in_threadpool(runner.reconcile)
        except Exception as exc:  # noqa: BLE001 - any failure: say it, try again
            line = f"{type(exc).__name__}: {exc}"
            if line != failing:
                log.warning("the job monitor failed (%s); retrying", line)
                failing = line
            continue
        if failing is not None:
            log.warning("the job monitor works again")
            failing = None


def create_app(settings: Settings, on_ready: Any = None) -> Starlette:
    """`on_ready()` runs once the app has started (the server then accepts requests).
    `app.state.keys` holds this start's credentials (a first sign-in link: new_link)."""
    api = Api(settings)
    keys = Keys(settings.secret or secrets.token_urlsafe(32), settings.token)
    policy = Policy.for_server(settings.port, listening=settings.token is not None,
                               allowed_hosts=settings.allowed_hosts,
                               max_body_bytes=max(settings.max_upload_bytes,
                                                  MAX_JSON_BYTES))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        app.state.closing = asyncio.Event()
        await run_in_threadpool(api.runner.reconcile)  # adopt or close what ran before
        task = asyncio.create_task(monitor(api.runner, settings.monitor_interval_s))
        if on_ready is not None:
            on_ready()
        try:
            yield
        finally:
            task.cancel()
            app.state.closing.set()
            api.captioning.stop_all()

    def route(path: str, endpoint: Any, *methods: str) -> Route:
        return Route(path, answer_errors(endpoint), methods=list(methods) or ["GET"])

    job = "/api/jobs/{job_id:int}"
    routes = [
        route("/api/health", api.health),
        route("/api/examples", api.examples),
        route("/api/form", api.form_spec),
        route("/api/form", api.form_edit, "POST"),
        route("/api/check", api.check, "POST"),
        route("/api/jobs", api.list_jobs),
        route("/api/jobs", api.create, "POST"),
        route(job, api.get_job),
        route(job, api.delete_job, "DELETE"),
        route(f"{job}/config", api.edit, "PUT"),
        route(f"{job}/start", api.start, "POST"),
        route(f"{job}/resume", api.start, "POST"),
        route(f"{job}/stop", api.stop, "POST"),
        route(f"{job}/copy", api.copy, "POST"),
        route(f"{job}/ask", api.ask, "POST"),
        route("/api/queue", api.queue, "POST"),
        route("/api/queue/order", api.queue_order, "POST"),
        route(f"{job}/outputs", api.delete_outputs, "DELETE"),
        route(f"{job}/loss", api.loss),
        route(f"{job}/samples", api.samples),
        route(f"{job}/previews", api.previews),
        route(f"{job}/loras", api.loras),
        route(f"{job}/log", api.log),
        route(f"{job}/files/{{path:path}}", api.file),
        route("/api/events", api.events),
        *dataset_routes(settings.datasets_dir, settings.data_dir,
                        settings.max_upload_bytes),
        *system_routes(settings),
        *caption_routes(api.captioning, settings.datasets_dir),
    ]
    if (settings.ui_dir / "index.html").is_file():
        routes.append(Mount("/", StaticFiles(directory=settings.ui_dir, html=True)))
    else:
        routes.append(Route("/", lambda request: not_built_page(settings.ui_dir)))
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.api = api
    app.state.keys = keys
    app.state.closing = asyncio.Event()
    app.add_middleware(Guard, policy=policy, keys=keys)
    return app
