"""The section-by-section pass over the reference semantics runs on both embedded stores.

The rules are the engine's, not a backend's, so the pass runs on the memory store (the
executable specification) and on RocksDB; the Kafka store proves the same store contract in
``tests/stores``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from flowstream.stores.base import EventStore
from tests.support import FakeClock
from tests.support.stores import StoreFactory, clock

__all__ = ["clock", "store", "stores"]


@pytest.fixture(params=["memory", "rocksdb"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    factory = StoreFactory(request.param, tmp_path)
    try:
        yield factory
    finally:
        factory.close_all()


@pytest.fixture
def store(stores: StoreFactory, clock: FakeClock) -> EventStore:
    return stores.open(clock=clock)
