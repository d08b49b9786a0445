"""Errors as HTTP answers: a status code and ``{"error": {"kind", "message"}}``.

``kind`` is the name of the ``flowstream.errors`` class the Python API raises for the same
request (embedded, or the class a Kafka processor named in the command's outcome), so a client
tells answers apart by kind, as it would by exception class. Answers of the HTTP layer itself
have kinds of their own: ``Unauthorized`` (401), ``NotFound`` (no such route, 404),
``MethodNotAllowed`` (405), ``Timeout`` (504: no outcome in time, the command stays on its
topic). A body that does not parse or does not fit the endpoint is ``InvalidInputError`` (422),
one over the limit ``PayloadTooLargeError`` (413).

Messages are flowstream's own, which never hold a hook token; an error the gateway did not
expect answers 500 with its class name only (the log has the rest).
"""

from __future__ import annotations

from typing import Any

import orjson

from flowstream.errors import (
    CommandParkedError,
    CorruptHistoryError,
    FlowError,
    HookTokenConflictError,
    InvalidIdentifierError,
    InvalidInputError,
    InvalidTransitionError,
    LimitExceededError,
    NonDeterministicError,
    PayloadTooLargeError,
    RunConflictError,
    RunNotFoundError,
    RuntimeBuildUnavailableError,
    SerializationError,
    StoreCorruptError,
    StoreLockedError,
    WorkflowNotServedError,
)

__all__ = ["UNAUTHORIZED", "error_body", "status_of"]

#: The kind of a missing or wrong credential.
UNAUTHORIZED = "Unauthorized"

#: The status of each error class, most specific first (the first ``isinstance`` match wins).
_STATUSES: tuple[tuple[type[FlowError], int], ...] = (
    (CommandParkedError, 202),  # Kafka: it applies once it can (its run starts, say)
    (RunNotFoundError, 404),
    (HookTokenConflictError, 409),
    (RunConflictError, 409),
    (CorruptHistoryError, 500),
    (InvalidTransitionError, 409),  # not in this state: a completed run, a resumed hook...
    (InvalidIdentifierError, 422),
    (InvalidInputError, 422),
    (SerializationError, 422),
    (WorkflowNotServedError, 422),
    (PayloadTooLargeError, 413),
    (LimitExceededError, 409),
    (RuntimeBuildUnavailableError, 503),
    (StoreLockedError, 503),
    (StoreCorruptError, 500),
    (NonDeterministicError, 500),
)


def status_of(error: FlowError) -> int:
    """The HTTP status for ``error``: 500 for a class with no better answer."""
    for cls, status in _STATUSES:
        if isinstance(error, cls):
            return status
    return 500


def error_body(kind: str, message: str, **extra: Any) -> bytes:
    """The JSON body of an error answer."""
    return orjson.dumps({"error": {"kind": kind, "message": message, **extra}})
