"""Event stores: the contract, the in-memory specification and RocksDB."""

from flowstream.stores.base import MAX_EVENT_BYTES, EventStore
from flowstream.stores.memory import MemoryEventStore

__all__ = ["MAX_EVENT_BYTES", "EventStore", "MemoryEventStore"]
