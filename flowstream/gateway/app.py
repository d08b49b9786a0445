"""``create_app``: the gateway's ASGI application (FastAPI) over a ``Backend``.

=========================================  ======================================================
``GET  /api/runs``                          rows, filtered (``status``, ``workflow``: repeat or
                                            comma-separate) and paged (``limit``, ``cursor``)
``GET  /api/runs/{run_id}``                 its row, condition, snapshot and pending work
``GET  /api/runs/{run_id}/history``         its committed events
``POST /api/runs``                          start ``{"workflow", "run_id"?, "input"}``: 201, or
                                            200 for a start that changed nothing
``POST /api/runs/{run_id}/signals/{name}``  ``{"payload", "signal_id"?}``
``POST /api/runs/{run_id}/cancel``          ``{"reason"?, "force"?}``
``POST /api/runs/{run_id}/retry``           drive it again now
``GET  /api/counts``                        runs by status
``GET  /openapi.json``                      this API's OpenAPI description
``POST /hooks/{token}``                     the body is the payload; resumes the token's hook
``GET  /``                                  the web console's static files
=========================================  ======================================================

Every ``/api`` endpoint and the OpenAPI description need ``Authorization: Bearer <token>``
(``guards.BearerCheck``); a webhook needs nothing but its URL, and resumes that one hook and
nothing else; the console's files hold no data (the console asks its user for the token).
A command answers ``{"run_id", "outcome", "reason"?}``: 200, or 202 when it was recorded and
its drive goes on (embedded) or it is parked (Kafka). Errors: ``problems``.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.security import HTTPBearer
from pydantic import BaseModel, ConfigDict, Field, JsonValue
from starlette.exceptions import HTTPException
from starlette.staticfiles import StaticFiles

from flowstream.errors import (
    CommandParkedError,
    FlowError,
    InvalidInputError,
    PayloadTooLargeError,
    RunConflictError,
)
from flowstream.gateway.backend import Answer, Backend
from flowstream.gateway.guards import AccessLog, BearerCheck, BodyLimit, BodyTooLargeError
from flowstream.gateway.problems import UNAUTHORIZED, error_body, status_of
from flowstream.gateway.settings import GatewaySettings
from flowstream.index import MAX_LIMIT, RunQuery
from flowstream.index.table import decode_cursor
from flowstream.model.snapshot import RunStatus

__all__ = ["create_app"]

LOG = logging.getLogger("flowstream.gateway")

#: The longest page ``GET /api/runs`` returns.
MAX_PAGE = MAX_LIMIT

_NOT_RUN_ID = re.compile(r"[^A-Za-z0-9_-]+")

#: Declares the bearer scheme in the OpenAPI description; ``BearerCheck`` does the check. (At
#: module level: FastAPI resolves the annotations of a dependency in its module's globals.)
_SCHEME = HTTPBearer(auto_error=False, description="the gateway's token")


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StartRequest(_Body):
    workflow: str = Field(description="the name of a workflow the gateway serves")
    run_id: str | None = Field(default=None, description="default: a new id")
    input: JsonValue = None


class SignalRequest(_Body):
    payload: JsonValue = None
    signal_id: str | None = Field(
        default=None,
        description="the idempotency id (give one: a signal sent again with it is applied once; "
        "default: a new id)",
    )


class CancelRequest(_Body):
    reason: str | None = None
    force: bool = Field(default=False, description="end it at once, without workflow code")


class ErrorDetail(BaseModel):
    kind: str = Field(description="the flowstream.errors class, or Unauthorized, NotFound...")
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail


class CommandAnswer(BaseModel):
    run_id: str
    outcome: str = Field(description="applied, noop, accepted (still being driven) or parked")
    reason: str | None = None


class RunsPage(BaseModel):
    runs: list[dict[str, Any]]
    next_cursor: str | None


class RunDetail(BaseModel):
    run: dict[str, Any]
    condition: dict[str, Any]
    snapshot: dict[str, Any]
    pending: list[dict[str, Any]]


class History(BaseModel):
    events: list[dict[str, Any]]


class Counts(BaseModel):
    counts: dict[str, int]
    total: int


class HookAnswer(BaseModel):
    outcome: str


class _Unauthorized(Exception):
    """No credential, or a wrong one."""


_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (401, 404, 409, 413, 422, 500, 504)
}


def _json(value: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(value), status_code=status, media_type="application/json", headers=headers
    )


def _answered(answer: Answer, *, created: bool = False) -> Response:
    if answer.outcome in ("accepted", "parked"):
        return _json(answer.json(), 202)
    return _json(answer.json(), 201 if created and answer.outcome == "applied" else 200)


def _problem(status: int, kind: str, message: str) -> Response:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return Response(
        error_body(kind, message),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def _one_line(errors: Any) -> str:
    """Validation errors in one line, without the values (a payload may hold secrets)."""
    parts = []
    for item in errors:
        where = ".".join(str(p) for p in item.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {item.get('msg', 'invalid')}")
    return "; ".join(parts) or "the request does not validate"


def _split(values: list[str] | None) -> tuple[str, ...]:
    return tuple(v for value in values or () for v in value.split(",") if v)


def console_directory() -> Path | None:
    """The web console's files (``flowstream/gateway/console``), if they are installed."""
    folder = Path(str(resources.files("flowstream.gateway") / "console"))
    return folder if (folder / "index.html").is_file() else None


def create_app(
    backend: Backend, settings: GatewaySettings, *, console: Path | None = None
) -> FastAPI:
    """The gateway over ``backend``; ``console``: the static files served at ``/`` (default:
    the package's console, if installed)."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await backend.open()
        try:
            yield
        finally:
            await backend.close()

    app = FastAPI(
        title="flowstream gateway",
        summary="Start, steer and read flowstream runs; resume hooks by their webhook URLs.",
        version="1",
        lifespan=lifespan,
        openapi_url=None,  # served below, behind the credential
        docs_url=None,  # the interactive docs load their assets from the internet
        redoc_url=None,
    )
    check = BearerCheck(settings.token)

    async def authorized(request: Request, _: Annotated[Any, Depends(_SCHEME)]) -> None:
        if not check.admits(request.headers.get("authorization")):
            raise _Unauthorized

    api = APIRouter(prefix="/api", dependencies=[Depends(authorized)], responses=_ERRORS)
    _add_runs(api, backend)
    app.include_router(api)

    @app.get("/openapi.json", include_in_schema=False, dependencies=[Depends(authorized)])
    async def openapi() -> Response:
        return _json(app.openapi())

    _add_hooks(app, backend)
    _add_handlers(app)
    folder = console if console is not None else console_directory()
    if folder is not None:
        app.mount("/", StaticFiles(directory=folder, html=True), name="console")
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes, too_large=_too_large)
    app.add_middleware(AccessLog)
    return app


def _too_large(limit: int) -> bytes:
    return error_body(
        PayloadTooLargeError.__name__,
        f"the request body exceeds the gateway's limit of {limit} bytes; keep large payloads "
        "outside the history and send a reference",
    )


def _add_runs(api: APIRouter, backend: Backend) -> None:
    @api.get("/runs", response_model=RunsPage, summary="list runs")
    async def list_runs(
        status: Annotated[list[str] | None, Query(description="statuses (any of)")] = None,
        workflow: Annotated[list[str] | None, Query(description="workflows (any of)")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
        cursor: str | None = None,
    ) -> Response:
        statuses = _split(status)
        known = {s.value for s in RunStatus}
        unknown = [s for s in statuses if s not in known]
        if unknown:
            return _problem(
                422,
                InvalidInputError.__name__,
                f"unknown status {unknown[0]!r}: one of {', '.join(sorted(known))}",
            )
        if cursor is not None:
            try:
                decode_cursor(cursor)
            except FlowError as exc:
                return _problem(422, InvalidInputError.__name__, str(exc))
        workflows = _split(workflow)
        query = RunQuery(
            status=frozenset(RunStatus(s) for s in statuses) or None,
            workflow=frozenset(workflows) or None,
            limit=limit,
            cursor=cursor,
        )
        page = await backend.runs(query)
        rows = [row.model_dump(mode="json") for row in page.rows]
        return _json({"runs": rows, "next_cursor": page.next_cursor})

    @api.get("/counts", response_model=Counts, summary="count runs by status")
    async def counts() -> Response:
        found = await backend.counts()
        return _json({"counts": found, "total": sum(found.values())})

    @api.get("/runs/{run_id}", response_model=RunDetail, summary="show a run")
    async def show(run_id: str) -> Response:
        return _json(await backend.run(run_id))

    @api.get("/runs/{run_id}/history", response_model=History, summary="a run's events")
    async def history(run_id: str) -> Response:
        return _json({"events": await backend.history(run_id)})

    @api.post("/runs", status_code=201, response_model=CommandAnswer, summary="start a run")
    async def start(body: StartRequest) -> Response:
        run_id = body.run_id or _new_run_id(body.workflow)
        spec = backend.spec(body.workflow, run_id)
        answer = await backend.start(run_id, spec, body.input)
        response = _answered(answer, created=True)
        response.headers["Location"] = f"/api/runs/{run_id}"
        return response

    @api.post("/runs/{run_id}/signals/{name}", response_model=CommandAnswer, summary="signal")
    async def signal(run_id: str, name: str, body: SignalRequest | None = None) -> Response:
        body = body or SignalRequest()
        signal_id = body.signal_id or uuid.uuid4().hex
        return _answered(await backend.signal(run_id, name, body.payload, signal_id))

    @api.post("/runs/{run_id}/cancel", response_model=CommandAnswer, summary="cancel a run")
    async def cancel(run_id: str, body: CancelRequest | None = None) -> Response:
        body = body or CancelRequest()
        return _answered(await backend.cancel(run_id, body.reason, body.force))

    @api.post("/runs/{run_id}/retry", response_model=CommandAnswer, summary="retry a run now")
    async def retry(run_id: str) -> Response:
        return _answered(await backend.retry(run_id))


def _new_run_id(workflow: str) -> str:
    stem = _NOT_RUN_ID.sub("-", workflow).strip("-")[:100] or "run"
    return f"{stem}-{uuid.uuid4().hex[:12]}"


#: What a webhook answers when its token leads to no hook that can be resumed: one answer
#: whatever the reason (no such token, a hook resumed, disposed or ended with its run).
_NO_HOOK = "no hook waits at this URL"


def _add_hooks(app: FastAPI, backend: Backend) -> None:
    @app.post(
        "/hooks/{token}",
        response_model=HookAnswer,
        summary="resume the hook this URL names (no credential: the URL is one)",
        responses={code: {"model": ErrorBody} for code in (404, 409, 413, 422)},
    )
    async def resume(token: str, request: Request) -> Response:
        raw = await request.body()
        try:
            payload = orjson.loads(raw) if raw.strip() else None
        except orjson.JSONDecodeError:
            return _problem(422, InvalidInputError.__name__, "the body is not JSON")
        try:
            answer = await backend.resume_hook_by_token(token, payload)
        except CommandParkedError:
            return _json({"outcome": "parked"}, 202)
        except TimeoutError:  # its message names the token's digest, the key it was sent by
            return _problem(504, "Timeout", "no answer in time; the resumption stays queued")
        except RunConflictError:
            message = "this hook was already resumed with another payload"
            return _problem(409, RunConflictError.__name__, message)
        except PayloadTooLargeError as exc:
            return _problem(413, PayloadTooLargeError.__name__, str(exc).split(": ", 1)[-1])
        except FlowError as exc:
            status = status_of(exc)
            if status in (404, 409, 422):  # no such hook, or none that can be resumed
                return _problem(404, "InvalidTransitionError", _NO_HOOK)
            LOG.error("a webhook's resumption failed: %s", type(exc).__name__)
            return _problem(status, type(exc).__name__, "the hook could not be resumed")
        status = 202 if answer.outcome in ("accepted", "parked") else 200
        return _json({"outcome": answer.outcome}, status)


def _add_handlers(app: FastAPI) -> None:
    @app.exception_handler(FlowError)
    async def flow_error(_: Request, exc: FlowError) -> Response:
        return _problem(status_of(exc), type(exc).__name__, str(exc))

    @app.exception_handler(TimeoutError)
    async def timed_out(_: Request, exc: TimeoutError) -> Response:
        return _problem(504, "Timeout", str(exc) or "no answer in time")

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> Response:
        return _problem(422, InvalidInputError.__name__, _one_line(exc.errors()))

    @app.exception_handler(_Unauthorized)
    async def unauthorized(_: Request, __: _Unauthorized) -> Response:
        return _problem(401, UNAUTHORIZED, "give the gateway's token: Authorization: Bearer ...")

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> Response:
        if isinstance(exc, BodyTooLargeError):  # a chunked body passed the limit
            return Response(_too_large(exc.limit), 413, media_type="application/json")
        kinds = {404: "NotFound", 405: "MethodNotAllowed"}
        return _problem(exc.status_code, kinds.get(exc.status_code, "HTTPError"), str(exc.detail))
