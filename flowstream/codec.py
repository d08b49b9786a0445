"""Avro encoding of events and command messages: the only module that imports fastavro.

Every value flowstream puts on Kafka uses the Avro single-object encoding::

    C3 01 | fingerprint: 8 bytes | Avro binary body
            CRC-64-AVRO of the writer schema's parsing canonical form, little-endian

so a reader knows the exact writer schema from the bytes alone. Schemas are the ``.avsc``
files shipped in ``flowstream/schemas`` (``schemas/`` in the source tree), one per named
record, each file named ``<full name>.avsc``; a reference to another record is resolved from
its file and inlined at first use, as ``fastavro.schema.load_schema`` does. The wire records
are the event envelope and one record per message; ``history/`` keeps superseded,
self-contained writer schemas. The codec registers every writer schema by fingerprint, so bytes
written with an older version decode into the current model through Avro schema resolution.

Anything that does not decode into the expected type raises
:class:`~flowstream.errors.SerializationError`: a missing marker, an unknown fingerprint, a
record of another type, a corrupt body, trailing bytes, or a value the model rejects. Errors
about a record that can hold a hook token (``ResumeHook``, ``DeadLetter``) never quote the
underlying exception or any input value.
"""

from __future__ import annotations

import functools
import io
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, TypeVar, get_args, overload

import fastavro
from fastavro.schema import fingerprint, to_parsing_canonical_form
from pydantic import BaseModel, ValidationError

from flowstream.avsc import default_directory, documents, fullname, resolve_schema
from flowstream.datum import RecordPlan, plan
from flowstream.errors import SerializationError
from flowstream.model.events import EVENT_SCHEMA_VERSION, EventEnvelope, FlowEvent
from flowstream.model.messages import (
    CancelRun,
    CommandMessage,
    CommandOutcome,
    DeadLetter,
    DisposeHook,
    FireTimer,
    HookTokenRejected,
    OutcomeStatus,
    RegisterHookToken,
    ReleaseHookToken,
    ResolveChild,
    ResumeHook,
    RetryRun,
    SendSignal,
    StartRun,
)

__all__ = [
    "ENVELOPE_SCHEMA",
    "MARKER",
    "AvroCodec",
    "decode_command",
    "decode_dead_letter",
    "decode_event",
    "decode_outcome",
    "default_codec",
    "encode_event",
    "encode_message",
    "event_head",
    "message_schema_name",
    "resolve_schema",
]

MARKER = b"\xc3\x01"
ENVELOPE_SCHEMA = "flowstream.EventEnvelope"
_HEADER_SIZE = len(MARKER) + 8
_COMMANDS: tuple[type[BaseModel], ...] = (
    StartRun,
    SendSignal,
    ResumeHook,
    DisposeHook,
    CancelRun,
    FireTimer,
    ResolveChild,
    RegisterHookToken,
    RetryRun,
    ReleaseHookToken,
    HookTokenRejected,
)
_SECRET_BEARING: frozenset[type[BaseModel]] = frozenset({ResumeHook, DeadLetter})

M = TypeVar("M", bound=BaseModel)

#: The envelope fields ``event_head`` reads, in the order the current schema must have them.
_HEAD_FIELDS = ("run_id", "sequence", "event_id", "timestamp", "event")
#: Event type by model class name (the short name of its branch of the envelope's union).
_EVENT_TYPES: dict[str, str] = {
    member.__name__: str(member.model_fields["type"].default)
    for member in get_args(get_args(FlowEvent)[0])
}


def message_schema_name(message_type: type[BaseModel]) -> str:
    """Full Avro name of a message record, e.g. ``flowstream.message.StartRun``."""
    return f"flowstream.message.{message_type.__name__}"


# -- the codec --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Reader:
    """The current schema of one wire record and how its datum becomes a model."""

    name: str
    model: type[BaseModel]
    parsed: Any
    header: bytes
    plan: RecordPlan
    #: The named types ``parsed`` holds, as ``_write_datum`` wants them.
    named: dict[str, Any]


@dataclass(frozen=True, slots=True)
class _Writer:
    """A known writer schema: the current one (``parsed is None``) or a superseded one."""

    reader: _Reader
    parsed: Any


class AvroCodec:
    """Encodes and decodes events and messages; build once (schemas are parsed here) and reuse.

    ``schema_dir`` defaults to the schemas shipped with the package.
    """

    def __init__(self, schema_dir: Traversable | Path | None = None) -> None:
        directory = default_directory() if schema_dir is None else schema_dir
        library: dict[str, dict[str, Any]] = {}
        for file_name, document in documents(directory):
            full, _ = fullname(document, "")
            if file_name != f"{full}.avsc":
                raise SerializationError(f"schema file {file_name} must be named {full}.avsc")
            library[full] = document
        wire: dict[str, type[BaseModel]] = {ENVELOPE_SCHEMA: EventEnvelope}
        messages: tuple[type[BaseModel], ...] = (*_COMMANDS, DeadLetter, CommandOutcome)
        wire.update((message_schema_name(m), m) for m in messages)
        self._readers: dict[type[BaseModel], _Reader] = {}
        self._writers: dict[bytes, _Writer] = {}
        self._event_header = b""
        self._event_types: tuple[str, ...] | None = None
        for name, model in wire.items():
            resolved = resolve_schema(name, library)
            reader = self._reader(name, model, resolved)
            self._readers[model] = reader
            self._writers[reader.header[len(MARKER) :]] = _Writer(reader, None)
            if model is EventEnvelope:
                self._event_header = reader.header
                self._event_types = _head_plan(resolved)
        history = directory.joinpath("history")
        if history.is_dir():
            by_name = {reader.name: reader for reader in self._readers.values()}
            for file_name, document in documents(history):
                full, _ = fullname(document, "")
                if full not in by_name:
                    raise SerializationError(f"history schema {file_name}: no current {full}")
                resolved = resolve_schema(full, {full: document})
                header = _header(resolved)
                if header[len(MARKER) :] not in self._writers:
                    writer = _Writer(by_name[full], fastavro.parse_schema(resolved))
                    self._writers[header[len(MARKER) :]] = writer

    @staticmethod
    def _reader(name: str, model: type[BaseModel], resolved: dict[str, Any]) -> _Reader:
        record_plan = plan(model, resolved, tagged=model is not EventEnvelope)
        named: dict[str, Any] = {}
        parsed = fastavro.parse_schema(resolved, named)
        return _Reader(name, model, parsed, _header(resolved), record_plan, named)

    # -- public API ---------------------------------------------------------------------------

    def encode_event(self, envelope: EventEnvelope) -> bytes:
        """The single-object encoding of one event envelope."""
        return self._encode(envelope, self._readers[EventEnvelope], envelope.run_id)

    def decode_event(self, data: bytes) -> EventEnvelope:
        """Decode bytes from the events topic."""
        envelope = self._decode(data, (EventEnvelope,))
        assert isinstance(envelope, EventEnvelope)
        return envelope

    def event_head(self, data: bytes) -> tuple[str, int, str] | None:
        """``(run id, sequence, event type)`` of an event envelope, read from its first bytes
        without decoding or validating the rest (for records flowstream itself wrote to the
        events topic and validated then, e.g. on restore).

        ``None`` when the fast read does not apply (another writer schema, or a schema version
        it cannot see at a glance): use :meth:`decode_event`. Bytes that are not an event
        envelope, or whose first fields are corrupt, raise ``SerializationError``.
        """
        if not isinstance(data, bytes):
            return None
        if self._event_types is None or data[:_HEADER_SIZE] != self._event_header:
            if self._writer(data).reader.model is not EventEnvelope:
                self._decode(data, (EventEnvelope,))  # raises: another record
            return None
        # The last field is schema_version; a one-byte varint of the supported version, after
        # a byte that ends the event body, is the common case; anything else takes decode_event.
        if len(data) < _HEADER_SIZE + 6 or data[-1] != _VERSION_BYTE or data[-2] >= 0x80:
            return None
        # Varints below 64 (most lengths, sequences and branches) are one even byte; the
        # others go through _long. The timestamp is skipped, not read.
        try:
            at = _HEADER_SIZE
            byte = data[at]
            size, at = (byte >> 1, at + 1) if not byte & 0x81 else _long(data, at)
            end = at + size
            if size < 0 or end > len(data):
                raise SerializationError("run_id overruns the record")
            run_id = data[at:end].decode()
            byte = data[end]
            sequence, at = (byte >> 1, end + 1) if not byte & 0x81 else _long(data, end)
            byte = data[at]
            size, at = (byte >> 1, at + 1) if not byte & 0x81 else _long(data, at)
            if size < 0:
                raise SerializationError("event_id has a negative length")
            at += size
            while data[at] & 0x80:  # the timestamp
                at += 1
            byte = data[at + 1]
            branch, at = (byte >> 1, at + 2) if not byte & 0x81 else _long(data, at + 1)
            if sequence < 1 or not 0 <= branch < len(self._event_types) or at >= len(data):
                raise SerializationError(f"sequence {sequence} or event branch {branch} is invalid")
            return run_id, sequence, self._event_types[branch]
        except SerializationError as exc:
            raise SerializationError(f"corrupt {ENVELOPE_SCHEMA}: {exc}") from None
        except (IndexError, UnicodeDecodeError) as exc:
            raise SerializationError(f"corrupt {ENVELOPE_SCHEMA}: {exc}") from None

    def encode_message(self, message: CommandMessage | DeadLetter | CommandOutcome) -> bytes:
        """The single-object encoding of a :data:`CommandMessage`, a :class:`DeadLetter` or a
        :class:`CommandOutcome`."""
        reader = self._readers.get(type(message))
        if reader is None or reader.model is EventEnvelope:
            raise SerializationError(
                f"cannot encode {type(message).__name__} as a message: use a command message "
                "a DeadLetter or a CommandOutcome (and encode_event for events)"
            )
        # From the fields, not ``getattr``: a model without the field (an outcome) raises and
        # catches an AttributeError inside pydantic, which cost more than the encoding.
        return self._encode(message, reader, message.__dict__.get("run_id"))

    def encode_outcome(
        self,
        *,
        command_id: str,
        key: str,
        command: str,
        status: OutcomeStatus,
        reason: str | None = None,
        error_kind: str | None = None,
        forwarded_to: str | None = None,
        source: str = "",
    ) -> bytes:
        """The bytes of ``encode_message(CommandOutcome(...))`` for fields the caller took
        from a command already validated (its id, key and type; the run it went on to), so
        the outcome is not built and validated again: the processor writes one per command."""
        datum = {
            "type": "command_outcome",
            "command_id": command_id,
            "key": key,
            "command": command,
            "status": status,
            "reason": reason,
            "error_kind": error_kind,
            "forwarded_to": forwarded_to,
            "source": source,
        }
        return self._encode(None, self._readers[CommandOutcome], None, datum)

    @overload
    def decode_command(self, data: bytes) -> CommandMessage: ...

    @overload
    def decode_command(self, data: bytes, expected: type[M]) -> M: ...

    def decode_command(self, data: bytes, expected: type[BaseModel] | None = None) -> Any:
        """Decode bytes from a command topic, optionally requiring one message type."""
        if expected is not None and expected not in _COMMANDS:
            raise TypeError(f"{expected.__name__} is not a command message type")
        return self._decode(data, _COMMANDS if expected is None else (expected,))

    def decode_dead_letter(self, data: bytes) -> DeadLetter:
        """Decode bytes from the dead-letter topic."""
        letter = self._decode(data, (DeadLetter,))
        assert isinstance(letter, DeadLetter)
        return letter

    def decode_outcome(self, data: bytes) -> CommandOutcome:
        """Decode a ``CommandOutcome`` (the Avro part of an ``outcome`` record)."""
        outcome = self._decode(data, (CommandOutcome,))
        assert isinstance(outcome, CommandOutcome)
        return outcome

    def schema_name(self, data: bytes) -> str:
        """The full name of the record ``data`` holds, read from its fingerprint."""
        return self._writer(data).reader.name

    def fingerprint(self, name: str) -> bytes:
        """The 8-byte fingerprint of the current schema of the wire record ``name``."""
        for reader in self._readers.values():
            if reader.name == name:
                return reader.header[len(MARKER) :]
        raise SerializationError(f"no wire record named {name}")

    # -- internals ----------------------------------------------------------------------------

    @staticmethod
    def _encode(
        value: BaseModel | None, reader: _Reader, run_id: str | None, datum: Any = None
    ) -> bytes:
        """``value`` (or, for ``None``, the ``datum`` given) written after ``reader``'s header."""
        try:
            if value is not None:
                datum = reader.plan.to_datum(value)
            if _write_datum is not None:
                body = bytearray(reader.header)
                try:
                    _write_datum(body, datum, reader.parsed, reader.named, "", _WRITE_OPTIONS)
                    return bytes(body)
                except TypeError:
                    pass  # a wrong datum: schemaless_writer raises it again, as it always did
            buffer = io.BytesIO()
            buffer.write(reader.header)
            fastavro.schemaless_writer(buffer, reader.parsed, datum)
        except SerializationError as exc:
            raise SerializationError(f"cannot encode {reader.name}: {exc}", run_id=run_id) from None
        except Exception as exc:
            raise SerializationError(
                f"cannot encode {reader.name}: {_describe(exc, reader.model)}", run_id=run_id
            ) from (None if reader.model in _SECRET_BEARING else exc)
        return buffer.getvalue()

    def _writer(self, data: bytes) -> _Writer:
        if not isinstance(data, bytes | bytearray | memoryview):
            raise SerializationError(f"expected bytes, got {type(data).__name__}")
        if len(data) < _HEADER_SIZE or bytes(data[: len(MARKER)]) != MARKER:
            raise SerializationError(
                "not an Avro single-object encoded value: it must start with C3 01 and an "
                "8-byte schema fingerprint"
            )
        fp = bytes(data[len(MARKER) : _HEADER_SIZE])
        writer = self._writers.get(fp)
        if writer is None:
            raise SerializationError(
                f"unknown writer schema fingerprint {fp.hex()}: written by a schema this "
                "flowstream does not know (a newer release, or another producer); keep every "
                "superseded schema in schemas/history/"
            )
        return writer

    def _decode(self, data: bytes, expected: tuple[type[BaseModel], ...]) -> BaseModel:
        writer = self._writer(data)
        reader = writer.reader
        if reader.model not in expected:
            wanted = ", ".join(self._readers[m].name for m in expected)
            raise SerializationError(f"expected {wanted} but the bytes hold {reader.name}")
        secret = reader.model in _SECRET_BEARING
        buffer = io.BytesIO(data)
        buffer.seek(_HEADER_SIZE)
        try:
            datum = fastavro.schemaless_reader(
                buffer,
                reader.parsed if writer.parsed is None else writer.parsed,
                None if writer.parsed is None else reader.parsed,
                return_record_name=True,
                return_record_name_override=True,
            )
            if buffer.tell() != len(data):
                raise SerializationError(f"{len(data) - buffer.tell()} trailing bytes")
            if not isinstance(datum, dict):
                raise SerializationError(f"the body is a {type(datum).__name__}, not a record")
            return reader.model.model_validate(reader.plan.from_datum(datum))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or '<record>'}: {e['msg']}"
                for e in exc.errors(include_url=False, include_input=False, include_context=False)
            )
            raise SerializationError(f"{reader.name} does not validate: {problems}") from (
                None if secret else exc
            )
        except Exception as exc:
            raise SerializationError(
                f"cannot decode {reader.name}: {_describe(exc, reader.model)}"
            ) from (None if secret else exc)

    def __repr__(self) -> str:
        return f"AvroCodec({len(self._readers)} wire records, {len(self._writers)} writer schemas)"


_VERSION_BYTE = EVENT_SCHEMA_VERSION << 1  # zigzag; the fast read needs it below 0x80
assert _VERSION_BYTE < 0x80


def _head_plan(resolved: dict[str, Any]) -> tuple[str, ...] | None:
    """Event type by union branch index, when the envelope schema starts with the fields
    ``event_head`` reads and ends with ``schema_version``; ``None`` turns the fast read off."""
    fields = resolved["fields"]
    names = tuple(field["name"] for field in fields)
    if names[: len(_HEAD_FIELDS)] != _HEAD_FIELDS or names[-1] != "schema_version":
        return None
    kinds = [fields[0]["type"], fields[1]["type"], fields[-1]["type"]]
    stamp = fields[3]["type"]
    if kinds != ["string", "long", "long"] or fields[2]["type"] != "string":
        return None
    if not (isinstance(stamp, dict) and stamp.get("type") == "long"):
        return None
    types: list[str] = []
    for branch in fields[4]["type"]:
        name = branch if isinstance(branch, str) else branch.get("name", "")
        kind = _EVENT_TYPES.get(str(name).rsplit(".", 1)[-1])
        if kind is None:
            return None
        types.append(kind)
    return tuple(types)


_WRITE_OPTIONS = {"strict": False, "strict_allow_default": False, "disable_tuple_notation": False}


def _datum_writer() -> Any:
    """fastavro's compiled writer of one datum, if this fastavro has it as expected, else
    ``None``. ``schemaless_writer`` calls it after parsing the parsed schema again and copying
    its named types, a fifth of an envelope's encoding; checked here against it."""
    try:
        from fastavro import _write

        if not getattr(_write, "CYTHON_MODULE", 0):
            return None
        write_data = _write.write_data  # type: ignore[attr-defined]
        schema = {"type": "record", "name": "check", "fields": [{"name": "a", "type": "long"}]}
        named: dict[str, Any] = {}
        parsed = fastavro.parse_schema(schema, named)
        expected = io.BytesIO()
        fastavro.schemaless_writer(expected, parsed, {"a": 150})
        body = bytearray(b"-")
        write_data(body, {"a": 150}, parsed, named, "", _WRITE_OPTIONS)
        return write_data if bytes(body) == b"-" + expected.getvalue() else None
    except Exception:  # another fastavro: schemaless_writer does it all
        return None


_write_datum = _datum_writer()


def _long(data: bytes, at: int) -> tuple[int, int]:
    """The zigzag varint (Avro ``long``) at ``at`` and the position after it."""
    byte = data[at]
    value = byte & 0x7F
    shift = 7
    while byte & 0x80:
        at += 1
        byte = data[at]
        value |= (byte & 0x7F) << shift
        shift += 7
        if shift > 70:
            raise SerializationError("a varint is longer than 10 bytes")
    return (value >> 1) ^ -(value & 1), at + 1


def _header(resolved: dict[str, Any]) -> bytes:
    canonical = to_parsing_canonical_form(resolved)
    return MARKER + bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO"))


def _describe(exc: Exception, model: type[BaseModel]) -> str:
    if model in _SECRET_BEARING and not isinstance(exc, SerializationError):
        return f"{type(exc).__name__} (details withheld: the record can hold a hook token)"
    text = str(exc)
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


# -- the shared codec -------------------------------------------------------------------------


@functools.cache
def default_codec() -> AvroCodec:
    """The codec over the schemas shipped with the package, built on first use."""
    return AvroCodec()


def encode_event(envelope: EventEnvelope) -> bytes:
    """Encode one event envelope with :func:`default_codec`."""
    return default_codec().encode_event(envelope)


def decode_event(data: bytes) -> EventEnvelope:
    """Decode one event envelope with :func:`default_codec`."""
    return default_codec().decode_event(data)


def event_head(data: bytes) -> tuple[str, int, str] | None:
    """:meth:`AvroCodec.event_head` with :func:`default_codec`."""
    return default_codec().event_head(data)


def encode_message(message: CommandMessage | DeadLetter | CommandOutcome) -> bytes:
    """Encode a command message, a dead letter or an outcome with :func:`default_codec`."""
    return default_codec().encode_message(message)


@overload
def decode_command(data: bytes) -> CommandMessage: ...


@overload
def decode_command(data: bytes, expected: type[M]) -> M: ...


def decode_command(data: bytes, expected: type[BaseModel] | None = None) -> Any:
    """Decode a command message with :func:`default_codec`."""
    if expected is None:
        return default_codec().decode_command(data)
    return default_codec().decode_command(data, expected)


def decode_dead_letter(data: bytes) -> DeadLetter:
    """Decode a dead letter with :func:`default_codec`."""
    return default_codec().decode_dead_letter(data)


def decode_outcome(data: bytes) -> CommandOutcome:
    """Decode a command outcome with :func:`default_codec`."""
    return default_codec().decode_outcome(data)
