"""The wire contract of the events topic: record kinds, their headers and values, one classifier,
and the readers of command outcomes.

Every record on the events topic is one of these (header ``flowstream-record`` names the kind; a
record without it is an event):

- ``event`` (key: run id): an ``EventEnvelope``, Avro single-object encoded (``C3 01`` and the
  writer schema's fingerprint); header ``flowstream-writer`` names the instance that wrote it.
- ``inbox`` (key: run id): ``run_id NUL inbox_id NUL command bytes``, a command parked until it
  can apply; header ``flowstream-reason`` says why it waits.
- ``inbox-done`` (key: run id): ``run_id NUL inbox_id NUL``, that parked command applied or was
  given up.
- ``hook-claim`` (key: token digest): ``digest NUL run_id NUL hook_id``, that hook's claim of the
  digest is the active one (the first; a later claim is answered ``HookTokenRejected``).
- ``hook-release`` (key: token digest): ``digest NUL run_id NUL hook_id``, that hook's claim
  (or earlier registration) of the digest was released.
- ``hook-waiter`` (key: token digest): ``digest NUL run_id NUL hook_id``, that hook's claim lost
  and its run is woken when the digest is released (the release record forgets the waiters).
- ``hook-token`` (key: token digest): the same value, written by releases before claims: the last
  hook registered for a digest. Restored as a routing fallback only.
- ``outcome`` (key: the command's key): ``command_id NUL`` and a ``CommandOutcome`` (Avro, like
  the commands), what became of a command a client sent (below).
- ``anchor`` (no key, empty value): written by a processor's transaction only to register the
  partition with it early (where the steps it starts will report); no reader takes it.
- ``positions`` (no key): ``writer NUL`` and, one per command topic, ``topic=offset`` lines: how
  far the partition's commands are applied, written by each transaction that moved them (the
  transaction that holds those commands' effects). Most of them are not records of their own:
  the same value rides in header ``flowstream-positions`` of the last record the transaction
  writes to the partition anyway (of any kind); a ``positions`` record is written only where
  the transaction wrote nothing else. A processor's restore takes the last of either
  (:func:`positions_of`); the group's committed offsets follow them outside the transactions,
  later (for lag and for finding the partition's last writer).

Readers of histories (restore, ``FlowClient``, ``flowstream audit``) take ``event`` records only and
classify every record with :func:`kind_of`; a kind this release does not know is skipped, never
taken for an event, so a newer writer's bookkeeping cannot corrupt an older reader's history.

Readers that only look (``FlowClient``, ``flowstream audit``, tests and benchmarks) decode through
:func:`decode_events` (or :func:`event_records`, which keeps each record with its event): an event
record that does not decode (a value that is not Avro, an unknown writer schema, a corrupt body)
is reported as a :class:`BadRecord` naming its partition, offset and the run of its key, and
skipped; the reader decides what it means for that run. A writer's restore, which must not go on
with a shorter history, stops at such a record instead.

A command a client sent with a ``command_id`` (all of them, since command ids; a command without
one gets none) is answered by ``outcome`` records on the events partition of its key: its run id,
or a token-only hook resumption's token digest. The processor writes each in the transaction that
records the command's effect, on a partition that transaction writes anyway, so a
``read_committed`` reader sees an outcome only with the events it speaks of, and an answer adds no
partition to the transaction. (Earlier releases wrote them to a topic of their own, ``outcomes``,
whose partitions each transaction added: up to one more per partition it applied commands of.)
One command may have several outcomes, in order: ``parked`` and then what became of it when it was
retried, or ``forwarded`` and then, on the partition of the run it went on to, the rest.
:func:`outcomes_of` picks one command's outcomes out of consumed records.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from flowstream import codec
from flowstream.errors import SerializationError
from flowstream.model.events import EventEnvelope
from flowstream.model.messages import CommandOutcome

__all__ = [
    "ANCHOR_HEADERS",
    "EVENT_HEADERS",
    "OUTCOME_HEADERS",
    "POSITIONS_HEADER",
    "POSITIONS_HEADERS",
    "REASON_HEADER",
    "RECORD_HEADER",
    "WRITER_HEADER",
    "BadRecord",
    "Headers",
    "RecordKind",
    "decode_events",
    "event_headers",
    "event_records",
    "header_of",
    "hook_token_value",
    "inbox_done_value",
    "inbox_value",
    "kind_of",
    "log_bad_record",
    "outcome_value",
    "outcomes_of",
    "positions_of",
    "positions_value",
    "split_hook_token",
    "split_inbox",
    "split_positions",
    "writer_of",
]

LOG = logging.getLogger("flowstream.wire")

#: Names what a record of the events topic is (a :class:`RecordKind` value).
RECORD_HEADER = "flowstream-record"
#: Names the processor instance (or store) that wrote an event: for audits and failure tests.
WRITER_HEADER = "flowstream-writer"
#: Says why a parked (``inbox``) command waits.
REASON_HEADER = "flowstream-reason"
#: Carries a transaction's positions of the record's partition on the last record it wrote there.
POSITIONS_HEADER = "flowstream-positions"


class RecordKind(StrEnum):
    """What a record of the events topic is."""

    EVENT = "event"
    INBOX = "inbox"
    INBOX_DONE = "inbox-done"
    HOOK_TOKEN = "hook-token"
    HOOK_CLAIM = "hook-claim"
    HOOK_RELEASE = "hook-release"
    HOOK_WAITER = "hook-waiter"
    OUTCOME = "outcome"
    ANCHOR = "anchor"
    POSITIONS = "positions"


#: Record headers as a producer takes them (confluent-kafka's ``produce(headers=...)``).
Headers = list[tuple[str, str | bytes | None]]

#: Headers of an event record written by a writer that names no instance.
EVENT_HEADERS: Headers = [(RECORD_HEADER, RecordKind.EVENT.value.encode())]


def event_headers(writer: str) -> Headers:
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
    if value is not None and value[:2] == codec.MARKER:
        return RecordKind.EVENT
    for key, found in message.headers() or ():
        if key == RECORD_HEADER:
            try:
                return RecordKind(bytes(found).decode())
            except (UnicodeDecodeError, ValueError, TypeError):
                return None
    return RecordKind.EVENT


def header_of(message: Any, name: str) -> bytes | None:
    """The value of header ``name`` of a consumed record; ``None`` when it has none."""
    for key, found in message.headers() or ():
        if key == name:
            return bytes(found) if found is not None else None
    return None


def writer_of(message: Any) -> str:
    """The instance that wrote an event record (its ``flowstream-writer``); empty if unnamed."""
    return (header_of(message, WRITER_HEADER) or b"").decode(errors="replace")


# -- reading histories ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BadRecord:
    """A record of the events topic that is an event by its kind and does not decode as one."""

    topic: str
    partition: int
    offset: int
    #: The run the record belongs to, by its key; ``None`` for a record without a (text) key.
    run_id: str | None
    reason: str

    @property
    def where(self) -> str:
        """``topic[partition]@offset``."""
        return f"{self.topic}[{self.partition}]@{self.offset}"

    def __str__(self) -> str:
        owner = f"run {self.run_id}" if self.run_id is not None else "no run key"
        return f"{self.where} ({owner}): {self.reason}"

    @classmethod
    def of(cls, message: Any, reason: str) -> BadRecord:
        """The bad record ``message``, which failed to decode for ``reason``."""
        key = message.key()
        try:
            run_id = None if key is None else bytes(key).decode()
        except UnicodeDecodeError:
            run_id = None
        return cls(
            str(message.topic()), int(message.partition()), int(message.offset()), run_id, reason
        )


def log_bad_record(bad: BadRecord) -> None:
    """The default report of a bad record: a warning that names it."""
    LOG.warning("skipped an event record that does not decode: %s", bad)


def event_records(
    messages: Iterable[Any], *, on_bad: Callable[[BadRecord], None] = log_bad_record
) -> Iterator[tuple[Any, EventEnvelope]]:
    """Each event record of ``messages`` (consumed records of the events topic) with its decoded
    envelope, in order.

    Records of other kinds, and messages that carry a consumer error instead of a record, are
    skipped; an event record that fails to decode is passed to ``on_bad`` and skipped.
    """
    for message in messages:
        if message.error() is not None or kind_of(message) is not RecordKind.EVENT:
            continue
        try:
            envelope = codec.decode_event(message.value() or b"")
        except SerializationError as exc:
            on_bad(BadRecord.of(message, str(exc)))
            continue
        yield message, envelope


def decode_events(
    messages: Iterable[Any], *, on_bad: Callable[[BadRecord], None] = log_bad_record
) -> Iterator[EventEnvelope]:
    """The decoded events of ``messages``: :func:`event_records` without the records."""
    for _, envelope in event_records(messages, on_bad=on_bad):
        yield envelope


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
    """The value of a ``hook-token``, ``hook-claim``, ``hook-release`` or ``hook-waiter``
    record."""
    return "\0".join((digest, run_id, hook_id)).encode()


def split_hook_token(value: bytes) -> tuple[str, str, str]:
    """``(digest, run_id, hook_id)`` of a token-index record's value; ``ValueError`` otherwise."""
    digest, run_id, hook_id = value.decode().split("\0", 2)
    return digest, run_id, hook_id


#: Headers of an ``anchor`` record.
ANCHOR_HEADERS: Headers = [(RECORD_HEADER, RecordKind.ANCHOR.value.encode())]


#: Headers of a ``positions`` record.
POSITIONS_HEADERS: Headers = [(RECORD_HEADER, RecordKind.POSITIONS.value.encode())]


def positions_value(writer: str, positions: dict[str, int]) -> bytes:
    """The value of a ``positions`` record: its writer, a NUL, then ``topic=offset`` lines
    (text first, as every kind but ``event``)."""
    lines = "\n".join(f"{topic}={offset}" for topic, offset in sorted(positions.items()))
    return f"{writer}\0{lines}".encode()


def split_positions(value: bytes) -> tuple[str, dict[str, int]]:
    """``(writer, {topic: offset})`` of a ``positions`` value; ``ValueError`` for another
    shape."""
    writer, lines = value.decode().split("\0", 1)
    positions: dict[str, int] = {}
    for line in lines.split("\n") if lines else ():
        topic, offset = line.rsplit("=", 1)
        positions[topic] = int(offset)
    return writer, positions


def positions_of(message: Any, kind: RecordKind | None) -> dict[str, int] | None:
    """The positions a consumed record of the events topic of ``kind`` (:func:`kind_of`)
    records, by command topic: a ``positions`` record's, or those in its
    ``flowstream-positions`` header; ``None`` when it records none. ``ValueError`` for a value of
    another shape."""
    if kind is RecordKind.POSITIONS:
        return split_positions(message.value() or b"")[1]
    carried = header_of(message, POSITIONS_HEADER)
    return None if carried is None else split_positions(carried)[1]


#: Headers of an ``outcome`` record.
OUTCOME_HEADERS: Headers = [(RECORD_HEADER, RecordKind.OUTCOME.value.encode())]


def outcome_value(command_id: str, outcome: bytes) -> bytes:
    """The value of an ``outcome`` record: the encoded ``CommandOutcome`` after its command's id
    (text first, as every kind but ``event``; a reader finds its command's without decoding)."""
    return command_id.encode() + b"\0" + outcome


def outcomes_of(messages: Iterable[Any], command_id: str) -> Iterator[CommandOutcome]:
    """The outcomes of command ``command_id`` among ``messages`` (consumed records of the events
    topic), in order; records of other kinds, records that carry an error and outcomes that do
    not decode are skipped."""
    prefix = command_id.encode() + b"\0"
    for message in messages:
        value = message.value()
        if message.error() is not None or not value or not value.startswith(prefix):
            continue
        if kind_of(message) is not RecordKind.OUTCOME:
            continue
        try:
            outcome = codec.decode_outcome(value[len(prefix) :])
        except SerializationError as exc:
            LOG.warning("skipped an outcome record that does not decode: %s", exc)
            continue
        if outcome.command_id == command_id:
            yield outcome
