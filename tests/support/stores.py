"""The store fixtures: every store-facing test runs against each backend in ``STORE_KINDS``.

``StoreFactory.open()`` makes a fresh store, ``reopen(store)`` closes a durable store and opens
it again (a process restart), and ``write_raw_history`` plants a history directly in a backend's
storage, bypassing every check, to prove reads validate what they load.

The ``kafka`` kind (marked ``kafka``: it needs the broker of the ``kafka_bootstrap`` fixture) is a
``KafkaEventStore``. Each ``open()`` without a path is a new, independent store: its own events
topic under the test's unique prefix and its own state directory. ``reopen`` opens the same topic
with the same transactional id but an *empty* state directory, so every restart rebuilds the
store from the topic; ``write_raw_*`` plant records in the run's partition RocksDB, the cache that
reads load from, using the layout (and, for histories, the Avro encoding) it stores.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from flowstream import codec
from flowstream.model.events import EventEnvelope
from flowstream.stores.base import Clock, EventStore, utc_now
from flowstream.stores.memory import MemoryEventStore
from tests.support import FakeClock

__all__ = [
    "STORE_KINDS",
    "StoreFactory",
    "TopicRecord",
    "clock",
    "factory_for",
    "read_events_topic",
    "store",
    "stores",
]

STORE_KINDS = ("memory", "rocksdb", "kafka")
_PARAMS = [
    pytest.param(kind, marks=pytest.mark.kafka) if kind == "kafka" else kind for kind in STORE_KINDS
]


class StoreFactory:
    """Opens stores of one kind under one temporary directory."""

    def __init__(
        self, kind: str, root: Path, *, bootstrap: str | None = None, prefix: str | None = None
    ) -> None:
        self.kind = kind
        self.root = root
        self.bootstrap = bootstrap
        self.prefix = prefix
        self._open: list[EventStore] = []
        self._paths: dict[int, Path] = {}
        self._logs: dict[Path, str] = {}  # kafka: state directory -> topic prefix
        self._count = 0

    @property
    def durable(self) -> bool:
        return self.kind != "memory"

    def open(self, *, clock: Clock = utc_now, path: Path | None = None) -> EventStore:
        if self.kind == "memory":
            store: EventStore = MemoryEventStore(clock=clock)
        elif self.kind == "rocksdb":
            from flowstream.stores.rocksdb import RocksDBEventStore

            if path is None:
                self._count += 1
                path = self.root / f"db{self._count}"
            store = RocksDBEventStore(path, clock=clock)
            self._paths[id(store)] = path
        elif self.kind == "kafka":
            if path is None:
                self._count += 1
                path = self.root / f"state{self._count}"
                self._logs[path] = self._new_log(f"{self.prefix}-{self._count}")
            store = self._open_kafka(self._logs[path], path, clock)
            self._paths[id(store)] = path
        else:  # pragma: no cover - a new backend must be wired here
            raise ValueError(self.kind)
        self._open.append(store)
        return store

    def reopen(self, store: EventStore, *, clock: Clock = utc_now) -> EventStore:
        """Close ``store`` and open its directory again (durable kinds only)."""
        if not self.durable:
            pytest.skip(f"the {self.kind} store is not durable")
        path = self._paths[id(store)]
        store.close()
        if self.kind == "kafka":
            self._count += 1
            fresh = self.root / f"state{self._count}"
            self._logs[fresh] = self._logs[path]
            path = fresh
        return self.open(clock=clock, path=path)

    def write_raw_history(
        self, store: EventStore, run_id: str, envelopes: Sequence[EventEnvelope]
    ) -> None:
        """Plant ``envelopes`` as the stored history of ``run_id``, bypassing validation."""
        if self.kind == "memory":
            assert isinstance(store, MemoryEventStore)
            store._histories[run_id] = list(envelopes)
        else:
            encode = codec.encode_event if self.kind == "kafka" else _json
            # Records are keyed by their position, so a record may claim another sequence.
            self.write_raw_bytes(
                store, run_id, [(i, encode(e)) for i, e in enumerate(envelopes, start=1)]
            )
        store._states.pop(run_id, None)

    def write_raw_bytes(
        self, store: EventStore, run_id: str, records: Sequence[tuple[int, bytes]]
    ) -> None:
        """Durable kinds: plant raw event records (sequence, bytes) using the documented key
        layout of ``flowstream/stores/rocksdb.py``."""
        if not self.durable:
            pytest.skip(f"the {self.kind} store holds no bytes")
        target = self._local(store, run_id)
        db = target._db  # type: ignore[attr-defined]
        run_key = run_id.encode()
        for sequence, data in records:
            db[b"e" + run_key + b"\0" + sequence.to_bytes(8, "big")] = data
        last = max(sequence for sequence, _ in records)
        db[b"r" + run_key] = last.to_bytes(8, "big")
        target._states.pop(run_id, None)

    def stored_bytes(self, store: EventStore) -> bytes:
        """Durable kinds: every key and value the store keeps (for kafka, every partition's
        RocksDB and every record of its events topic)."""
        if not self.durable:
            pytest.skip(f"the {self.kind} store holds no bytes")
        if self.kind == "rocksdb":
            dbs: list[Any] = [store._db]  # type: ignore[attr-defined]
            records = b""
        else:
            from flowstream.stores.kafka import KafkaEventStore

            assert isinstance(store, KafkaEventStore)
            dbs = [partition._db for partition in store._partitions]
            records = b"".join(
                r.key + b"".join(r.headers.values()) + r.value for r in read_events_topic(store)
            )
        return b"".join(bytes(k) + bytes(v) for db in dbs for k, v in db.items()) + records

    def _local(self, store: EventStore, run_id: str) -> EventStore:
        """The store whose RocksDB holds ``run_id`` (kafka: the run's partition store)."""
        if self.kind == "kafka":
            from flowstream.stores.kafka import KafkaEventStore

            assert isinstance(store, KafkaEventStore)
            return store._partition_of(run_id)
        return store

    def _new_log(self, prefix: str) -> str:
        """kafka: create the events topic of a new store under ``prefix``."""
        from flowstream.topology import EVENTS, load_topology
        from tests.conftest import create_topic

        assert self.bootstrap is not None
        spec = load_topology().topic(EVENTS)
        create_topic(
            self.bootstrap,
            spec.name(prefix),
            partitions=spec.partitions,
            config=spec.configs(1),
        )
        return prefix

    def _open_kafka(self, prefix: str, path: Path, clock: Clock) -> EventStore:
        from flowstream.stores.kafka import KafkaEventStore

        assert self.bootstrap is not None
        return KafkaEventStore(
            self.bootstrap,
            prefix=prefix,
            state_dir=path,
            transactional_id=f"{prefix}.store",
            clock=clock,
        )

    def close_all(self) -> None:
        for store in self._open:
            store.close()
        self._open.clear()


def _json(envelope: EventEnvelope) -> bytes:
    return envelope.model_dump_json().encode()


@dataclass(frozen=True)
class TopicRecord:
    """One committed record of an events topic."""

    partition: int
    offset: int
    key: bytes
    headers: dict[str, bytes]
    value: bytes


def read_events_topic(store: Any) -> list[TopicRecord]:
    """Every committed record on a ``KafkaEventStore``'s topic, by partition and offset."""
    from flowstream.kafka import clients

    consumer = clients.new_consumer(store.bootstrap, f"{store.topic}.test-reader-unused")
    try:
        ends = {}
        for partition in range(store.topology.run_partitions):
            tp = clients.TopicPartition(store.topic, partition)
            ends[partition] = consumer.get_watermark_offsets(tp, timeout=10, cached=False)[1]
        pending = {p for p, end in ends.items() if end}
        consumer.assign([clients.TopicPartition(store.topic, p, 0) for p in pending])
        records: list[TopicRecord] = []
        deadline = time.monotonic() + 30
        while pending and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=500, timeout=0.2):
                if message.error() is None:
                    records.append(
                        TopicRecord(
                            message.partition() or 0,
                            message.offset() or 0,
                            message.key() or b"",
                            {k: v or b"" for k, v in message.headers() or ()},
                            message.value() or b"",
                        )
                    )
            for tp in consumer.position([clients.TopicPartition(store.topic, p) for p in pending]):
                if tp.offset >= ends[tp.partition]:
                    pending.discard(tp.partition)
        assert not pending, f"could not read {store.topic} to its end"
        return sorted(records, key=lambda r: (r.partition, r.offset))
    finally:
        consumer.close()


def factory_for(request: pytest.FixtureRequest, kind: str, root: Path) -> StoreFactory:
    """A ``StoreFactory`` of ``kind`` for the test of ``request`` (the kafka kind on the
    session's broker, under the test's unique prefix)."""
    if kind == "kafka":
        return StoreFactory(
            "kafka",
            root,
            bootstrap=request.getfixturevalue("kafka_bootstrap"),
            prefix=request.getfixturevalue("unique_prefix"),
        )
    return StoreFactory(kind, root)


@pytest.fixture(params=_PARAMS)
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    factory = factory_for(request, request.param, tmp_path)
    try:
        yield factory
    finally:
        factory.close_all()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(stores: StoreFactory, clock: Clock) -> EventStore:
    return stores.open(clock=clock)
