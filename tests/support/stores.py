"""The store fixtures: every store-facing test runs against each backend in ``STORE_KINDS``.

``StoreFactory.open()`` makes a fresh store, ``reopen(store)`` closes a durable store and opens
it again from disk (a process restart), and ``write_raw_history`` plants a history directly in a
backend's storage, bypassing every check, to prove reads validate what they load.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from flowstream.model.events import EventEnvelope
from flowstream.stores.base import Clock, EventStore, utc_now
from flowstream.stores.memory import MemoryEventStore
from tests.support import FakeClock

__all__ = ["STORE_KINDS", "StoreFactory", "clock", "store", "stores"]

STORE_KINDS = ("memory", "rocksdb")


class StoreFactory:
    """Opens stores of one kind under one temporary directory."""

    def __init__(self, kind: str, root: Path) -> None:
        self.kind = kind
        self.root = root
        self._open: list[EventStore] = []
        self._paths: dict[int, Path] = {}
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
        return self.open(clock=clock, path=path)

    def write_raw_history(
        self, store: EventStore, run_id: str, envelopes: Sequence[EventEnvelope]
    ) -> None:
        """Plant ``envelopes`` as the stored history of ``run_id``, bypassing validation."""
        if self.kind == "memory":
            assert isinstance(store, MemoryEventStore)
            store._histories[run_id] = list(envelopes)
        elif self.kind == "rocksdb":
            # Records are keyed by their position, so a record may claim another sequence.
            self.write_raw_bytes(
                store,
                run_id,
                [(i, e.model_dump_json().encode()) for i, e in enumerate(envelopes, start=1)],
            )
        store._states.pop(run_id, None)

    def write_raw_bytes(
        self, store: EventStore, run_id: str, records: Sequence[tuple[int, bytes]]
    ) -> None:
        """Durable kinds: plant raw event records (sequence, bytes) using the documented key
        layout of ``flowstream/stores/rocksdb.py``."""
        if self.kind != "rocksdb":
            pytest.skip(f"the {self.kind} store holds no bytes")
        db = store._db  # type: ignore[attr-defined]
        run_key = run_id.encode()
        for sequence, data in records:
            db[b"e" + run_key + b"\0" + sequence.to_bytes(8, "big")] = data
        last = max(sequence for sequence, _ in records)
        db[b"r" + run_key] = last.to_bytes(8, "big")
        store._states.pop(run_id, None)

    def close_all(self) -> None:
        for store in self._open:
            store.close()
        self._open.clear()


@pytest.fixture(params=STORE_KINDS)
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    factory = StoreFactory(request.param, tmp_path)
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
