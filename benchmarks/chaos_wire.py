"""How the chaos auditor reads Kafka, with no flowstream code: a plain confluent-kafka consumer
and fastavro over the ``.avsc`` files of ``schemas/``.

A value is Avro in the single-object encoding, ``C3 01 | 8-byte CRC-64-AVRO fingerprint of the
writer schema's canonical form | body``; every current and historical schema file is registered
by its fingerprint. On the events topic a record whose ``flowstream-record`` header is absent or
``event`` holds an event envelope; the other kinds (``anchor``, ``inbox``, ``inbox-done``,
``hook-token``) are the processors' bookkeeping and are kept as raw records only.
"""

from __future__ import annotations

import io
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, IsolationLevel, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from fastavro import schemaless_reader
from fastavro.schema import fingerprint, load_schema, to_parsing_canonical_form

__all__ = [
    "Decoder",
    "Event",
    "Record",
    "load_schemas",
    "read_dead_letters",
    "read_view",
    "stable_ends",
    "topic_partitions",
]

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "schemas"
MARKER = b"\xc3\x01"
RECORD_HEADER = "flowstream-record"
WRITER_HEADER = "flowstream-writer"
POSITIONS_HEADER = "flowstream-positions"


@dataclass(frozen=True)
class Event:
    """One decoded event record and where it lies."""

    run_id: str
    sequence: int
    event_id: str
    type: str  # the record name's last part, e.g. StepCompleted
    body: dict[str, Any]
    timestamp: datetime
    partition: int
    offset: int
    writer: str

    def brief(self) -> str:
        subject = next(
            (
                self.body[k]
                for k in ("step_id", "wait_id", "signal_id", "hook_id")
                if k in self.body
            ),
            "",
        )
        attempt = self.body.get("attempt")
        extra = f"({subject}{'' if attempt is None else f'#{attempt}'})" if subject else ""
        return f"{self.sequence}:{self.type}{extra}@{self.partition}/{self.offset}[{self.writer}]"


# -- decoding -------------------------------------------------------------------------------


def load_schemas(directory: Path = SCHEMA_DIR) -> dict[bytes, Any]:
    """Every writer schema of ``schemas/`` (and its ``history/``) by its 8-byte fingerprint."""
    schemas: dict[bytes, Any] = {}
    for path in sorted([*directory.glob("*.avsc"), *directory.glob("history/*.avsc")]):
        schema = load_schema(str(path))
        canonical = to_parsing_canonical_form(schema)
        schemas[bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO"))] = schema
    return schemas


class Decoder:
    """Decodes single-object-encoded values with the schemas of ``schemas/``."""

    def __init__(self, directory: Path = SCHEMA_DIR) -> None:
        self.schemas = load_schemas(directory)

    def decode(self, value: bytes) -> tuple[str, dict[str, Any]]:
        """(record name, datum); raises ``ValueError`` for anything that does not decode whole."""
        if value[:2] != MARKER:
            raise ValueError("no single-object marker")
        schema = self.schemas.get(value[2:10])
        if schema is None:
            raise ValueError(f"unknown fingerprint {value[2:10].hex()}")
        body = io.BytesIO(value[10:])
        datum = schemaless_reader(
            body, schema, None, return_record_name=True, return_record_name_override=True
        )
        if body.tell() != len(value) - 10:
            raise ValueError("trailing bytes after the record")
        return str(schema["name"]), datum

    def event(self, record: Record) -> Event:
        name, datum = self.decode(record.value)
        if name != "flowstream.EventEnvelope":
            raise ValueError(f"a {name} where an event envelope belongs")
        branch, body = datum["event"]
        return Event(
            run_id=datum["run_id"],
            sequence=datum["sequence"],
            event_id=datum["event_id"],
            type=branch.rsplit(".", 1)[-1],
            body=body,
            timestamp=datum["timestamp"],
            partition=record.partition,
            offset=record.offset,
            writer=record.writer,
        )


# -- reading --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    kind: str  # the flowstream-record header, "event" when absent
    writer: str
    value: bytes
    #: It carries its transaction's positions of the partition (``flowstream-positions``).
    positions: bool = False


def _headers(message: Any) -> dict[str, bytes]:
    return {key: value or b"" for key, value in message.headers() or ()}


def topic_partitions(admin: AdminClient, topic: str) -> int:
    metadata = admin.list_topics(topic=topic, timeout=30)
    found = metadata.topics.get(topic)
    if found is None or found.error is not None:
        raise SystemExit(f"topic {topic} not found")
    return len(found.partitions)


def _offsets(admin: AdminClient, topic: str, partitions: int, level: IsolationLevel) -> list[int]:
    wanted = {TopicPartition(topic, p): OffsetSpec.latest() for p in range(partitions)}
    futures = admin.list_offsets(wanted, isolation_level=level, request_timeout=15)
    return [int(futures[TopicPartition(topic, p)].result().offset) for p in range(partitions)]


def stable_ends(
    admin: AdminClient, topic: str, partitions: int, timeout: float
) -> tuple[list[int], list[int]]:
    """Each partition's high watermark once its last stable offset reached it (no transaction
    open), and the partitions where that did not happen within ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            stable = _offsets(admin, topic, partitions, IsolationLevel.READ_COMMITTED)
            high = _offsets(admin, topic, partitions, IsolationLevel.READ_UNCOMMITTED)
        except Exception:  # a leader moving: ask again
            if time.monotonic() > deadline:
                raise
            time.sleep(1)
            continue
        open_ = [p for p in range(partitions) if stable[p] < high[p]]
        if not open_ or time.monotonic() > deadline:
            return high, open_
        time.sleep(0.5)


def read_view(
    bootstrap: str, topic: str, ends: list[int], isolation: str, timeout: float = 300
) -> dict[tuple[int, int], Record]:
    """Every record of ``topic`` below ``ends`` that a consumer with ``isolation`` sees."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"chaos-audit-{uuid.uuid4().hex[:8]}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    partitions = len(ends)
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    records: dict[tuple[int, int], Record] = {}
    done = {p for p in range(partitions) if ends[p] == 0}
    deadline = time.monotonic() + timeout
    try:
        while len(done) < partitions:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} {isolation} did not reach its end")
            for message in consumer.consume(1000, 0.5):
                error = message.error()
                if error is not None:
                    at_end = message.offset() >= ends[message.partition()]
                    if error.code() == KafkaError._PARTITION_EOF and at_end:
                        done.add(message.partition())
                    continue
                partition, offset = message.partition(), message.offset()
                if offset >= ends[partition]:
                    done.add(partition)
                    continue
                headers = _headers(message)
                records[(partition, offset)] = Record(
                    partition,
                    offset,
                    headers.get(RECORD_HEADER, b"event").decode(),
                    headers.get(WRITER_HEADER, b"").decode(),
                    message.value() or b"",
                    POSITIONS_HEADER in headers,
                )
            positions = consumer.position([TopicPartition(topic, p) for p in range(partitions)])
            done |= {tp.partition for tp in positions if tp.offset >= ends[tp.partition]}
    finally:
        consumer.close()
    return records


def read_dead_letters(bootstrap: str, topic: str, decoder: Decoder) -> Counter[str]:
    """Dead letters by source topic and the first words of their reason."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    partitions = topic_partitions(admin, topic)
    ends = _offsets(admin, topic, partitions, IsolationLevel.READ_COMMITTED)
    reasons: Counter[str] = Counter()
    for record in read_view(bootstrap, topic, ends, "read_committed").values():
        try:
            _, letter = decoder.decode(record.value)
            source = str(letter.get("source_topic", "?")).rsplit(".", 1)[-1]
            reasons[f"{source}: {str(letter.get('reason', ''))[:70]}"] += 1
        except ValueError as exc:
            reasons[f"undecodable dead letter ({exc})"] += 1
    return reasons
