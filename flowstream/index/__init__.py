"""The run index: a materialized view of every run, kept current as its events commit.

* ``RunRow``, ``RunQuery``, ``RunPage`` and the ``RunIndex`` protocol (``query``, ``get``,
  ``counts``) are what every index answers (:mod:`flowstream.index.rows`);
* embedded, the store keeps the index in the same atomic write as the events it follows
  (``RunTable`` in :mod:`flowstream.index.table`): ``engine.run_index()`` or
  ``store.run_index()``;
* over Kafka, ``KafkaRunIndex`` keeps a local index directory current from the events topic,
  read ``read_committed`` (:mod:`flowstream.index.kafka`, imported on first use).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flowstream.index.rows import (
    MAX_LIMIT,
    OpenItem,
    RunIndex,
    RunPage,
    RunQuery,
    RunRow,
    row_of,
    waiting_for,
)
from flowstream.index.table import RunTable

if TYPE_CHECKING:
    from flowstream.index.kafka import KafkaRunIndex

__all__ = [
    "MAX_LIMIT",
    "KafkaRunIndex",
    "OpenItem",
    "RunIndex",
    "RunPage",
    "RunQuery",
    "RunRow",
    "RunTable",
    "row_of",
    "waiting_for",
]


def __getattr__(name: str) -> Any:
    # The Kafka index needs the Kafka client and the stores, which need the rows: importing it
    # with this package would make every store import Kafka.
    if name == "KafkaRunIndex":
        from flowstream.index.kafka import KafkaRunIndex

        return KafkaRunIndex
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
