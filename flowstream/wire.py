"""The events topic's wire contract: record kinds, their headers and values, and one classifier.

Every record on the events topic is one of these (header ``flowstream-record`` names the kind; a
record without it is an event):

- ``event`` (key: run id): an ``EventEnvelope``, Avro single-object encoded (``C3 01`` and the
  writer schema's fingerprint); header ``flowstream-writer`` names the instance that wrote it.
- ``inbox`` (key: run id): ``run_id NUL inbox_id NUL command bytes``, a command parked until it
  can apply; header ``flowstream-reason`` says why it waits.
- ``inbox-done`` (key: run id): ``run_id NUL inbox_id NUL``, that parked command applied or was
  given up.
- ``hook-token`` (key: token digest): ``digest NUL run_id NUL hook_id``, which hook owns a digest.

Readers of histories (restore, ``FlowClient``, ``flowstream audit``) take ``event`` records only and
classify every record with :func:`kind_of`; a kind this release does not know is skipped, never
taken for an event, so a newer writer's bookkeeping cannot corrupt an older reader's history.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

__all__ = [
    "EVENT_HEADERS",
    "REASON_HEADER",
    "RECORD_HEADER",
    "WRITER_HEADER",
    "RecordKind",
    "event_headers",
    "hook_token_value",
    "inbox_done_value",
    "inbox_value",
    "kind_of",
    "split_hook_token",
    "split_inbox",
]

#: Names what a record of the events topic is (a :class:`RecordKind` value).
RECORD_HEADER = "flowstream-record"
#: Names the processor instance (or store) that wrote an event: for audits and failure tests.
WRITER_HEADER = "flowstream-writer"
#: Says why a parked (``inbox``) command waits.
REASON_HEADER = "flowstream-reason"

#: The first bytes of every Avro single-object encoded value (the codec's ``MARKER``).
_AVRO_MARKER = b"\xc3\x01"


class RecordKind(StrEnum):
    """What a record of the events topic is."""

    EVENT = "event"
    INBOX = "inbox"
    INBOX_DONE = "inbox-done"
    HOOK_TOKEN = "hook-token"


#: Headers of an event record written by a writer that names no instance.
EVENT_HEADERS: list[tuple[str, bytes]] = [(RECORD_HEADER, RecordKind.EVENT.value.encode())]


def event_headers(writer: str) -> list[tuple[str, bytes]]:
    """The headers of an event record written by ``writer``."""
    return [*EVENT_HEADERS, (WRITER_HEADER, writer.encode())]


def kind_of(message: Any) -> RecordKind | None:
    """The kind of a consumed record of the events topic; ``None`` for a kind this release does
    not know (skip it).

    A value that starts with the Avro marker is an event without its headers being read (building
    them costs more than storing an event): the other kinds' values start with UTF-8 text, which
    never starts with ``C3 01``, and a new kind must keep it so. Any other value is classified by
    its header; one without the header is an event (and fails to decode as one if it is not).
    """
    value = message.value()
    if value is not None and value[:2] == _AVRO_MARKER:
        return RecordKind.EVENT
    for key, found in message.headers() or ():
        if key == RECORD_HEADER:
            try:
                return RecordKind(bytes(found).decode())
            except (UnicodeDecodeError, ValueError, TypeError):
                return None
    return RecordKind.EVENT


def inbox_value(run_id: str, inbox_id: str, raw: bytes) -> bytes:
    """The value of an ``inbox`` record: the parked command's bytes after its run and id."""
    return run_id.encode() + b"\0" + inbox_id.encode() + b"\0" + raw


def inbox_done_value(run_id: str, inbox_id: str) -> bytes:
    """The value of an ``inbox-done`` record."""
    return inbox_value(run_id, inbox_id, b"")


def split_inbox(value: bytes) -> tuple[str, str, bytes]:
    """``(run_id, inbox_id, command bytes)`` of an ``inbox`` or ``inbox-done`` value; raises
    ``ValueError`` for a value of another shape."""
    run_id, inbox_id, raw = value.split(b"\0", 2)
    return run_id.decode(), inbox_id.decode(), raw


def hook_token_value(digest: str, run_id: str, hook_id: str) -> bytes:
    """The value of a ``hook-token`` record."""
    return "\0".join((digest, run_id, hook_id)).encode()


def split_hook_token(value: bytes) -> tuple[str, str, str]:
    """``(digest, run_id, hook_id)`` of a ``hook-token`` value; ``ValueError`` otherwise."""
    digest, run_id, hook_id = value.decode().split("\0", 2)
    return digest, run_id, hook_id
