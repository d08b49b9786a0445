"""What stands between a request and the runs: the bearer check, the body limit, the access log.

* ``BearerCheck``: ``Authorization: Bearer <token>`` compared with the settings' token by
  ``hmac.compare_digest`` over bytes, so the time taken says nothing about how much of a guess
  was right. Missing or wrong: 401 with ``WWW-Authenticate: Bearer``, the same answer for both.
* ``BodyLimit`` (ASGI middleware): a ``Content-Length`` over the limit is refused at once with
  413; a body without one (chunked) is counted as it arrives and refused once past the limit, so
  no handler ever holds more than the limit in memory.
* ``AccessLog`` (ASGI middleware): one line per request on the ``flowstream.gateway.access``
  logger: client, method, path, status, duration. The path of a webhook carries its hook's
  token, so every ``/hooks/...`` path is logged as ``/hooks/<redacted>``; query strings are
  never logged. uvicorn's own access log is turned off (``flowstream.gateway.server``): it would
  print the raw path.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Callable

from fastapi import HTTPException
from pydantic import SecretStr
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["AccessLog", "BearerCheck", "BodyLimit", "BodyTooLargeError", "redact_path"]

ACCESS_LOG = logging.getLogger("flowstream.gateway.access")

#: The prefix of webhook paths: the rest of such a path is a secret.
HOOKS_PREFIX = "/hooks/"


def redact_path(path: str) -> str:
    """``path`` as it may be logged: everything after a ``/hooks/`` (a webhook's token, even in
    a path that does not route to the webhook, ``/x/../hooks/TOKEN``) replaced by
    ``<redacted>``."""
    at = path.find(HOOKS_PREFIX)
    if at < 0:
        return path
    return path[:at] + HOOKS_PREFIX + "<redacted>"


class BearerCheck:
    """Whether a request's ``Authorization`` header carries the gateway's token."""

    def __init__(self, token: SecretStr | None) -> None:
        #: ``None``: no credential is asked for (``--no-auth``, local development).
        self._expected = None if token is None else token.get_secret_value().encode()

    @property
    def required(self) -> bool:
        return self._expected is not None

    def admits(self, authorization: str | None) -> bool:
        if self._expected is None:
            return True
        scheme, _, presented = (authorization or "").partition(" ")
        # Compared even when the scheme is wrong, so both answers take the same time.
        matches = hmac.compare_digest(presented.strip().encode(), self._expected)
        return matches and scheme.lower() == "bearer"


class BodyTooLargeError(HTTPException):
    """A request body went past the gateway's limit while it was read: 413.

    An HTTP exception, so that FastAPI, which turns anything else raised while it reads a body
    into a 400, lets it through to the gateway's handler.
    """

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body exceeds the gateway's limit of {limit} bytes")
        self.limit = limit


async def _send_json(send: Send, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """Refuse request bodies over ``limit`` bytes with 413 (``too_large`` is the body)."""

    def __init__(self, app: ASGIApp, *, limit: int, too_large: Callable[[int], bytes]) -> None:
        self.app = app
        self.limit = limit
        self.too_large = too_large

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.limit:
            await _send_json(send, 413, self.too_large(self.limit))
            return
        received = 0
        started = False

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise BodyTooLargeError(self.limit)
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except BodyTooLargeError:
            if started:
                raise
            await _send_json(send, 413, self.too_large(self.limit))


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class AccessLog:
    """One redacted line per HTTP request, after its response."""

    def __init__(self, app: ASGIApp, *, logger: logging.Logger = ACCESS_LOG) -> None:
        self.app = app
        self.logger = logger

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()
        status = 500  # what the server answers when the app raises before responding

        async def watched(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, watched)
        finally:
            client = scope.get("client")
            where = f"{client[0]}:{client[1]}" if client else "-"
            self.logger.info(
                '%s "%s %s" %d %.1fms',
                where,
                scope.get("method", "-"),
                redact_path(str(scope.get("path", ""))),
                status,
                (time.perf_counter() - began) * 1000,
            )
