"""``Pump``: copies records of old partitions to the partitions of their keys under the new
count, in consume-produce transactions that commit the old partitions' positions with them.

One transactional producer (the move's id) and one ``read_committed`` consumer (assigned, never
subscribed) of the move's group. Each transaction holds the copies of one batch and the
positions after it, so a copy is committed exactly when its source's position moves past it;
a stopped move's next producer aborts what it left open (``init_transactions``). The positions
are the consumer's, which pass transaction markers and aborted records; every source's position
is sent with every transaction (never an empty offsets list: that would be a silent no-op).

:func:`route` is the one routing rule, which the audit applies too: a record goes to the
partition of its key (``partition_for``); an ``anchor`` (no key, no value) is left out; a record
with another key that is not text keeps its partition number modulo the new count (such a
command is dead-lettered by whichever processor reads it, as before).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flowstream import wire
from flowstream.kafka import clients
from flowstream.partitioning import partition_for
from flowstream.repartition.plan import MoveError, MovePlan, Source

__all__ = ["COPIED_HEADER", "Pump", "copied_from", "route"]

LOG = logging.getLogger("flowstream.repartition")

#: Names the record a copy was made from: ``<topic>:<partition>:<offset>``.
COPIED_HEADER = "flowstream-copied-from"
#: One transaction copies at most this many records, read in about this long.
_BATCH_RECORDS = 5000
_BATCH_S = 0.25
#: Each transactional call waits at most this long.
_CALL_S = 30.0
#: Records the copies may be: an event of 1 MiB plus its envelope, a parked command...
_MAX_RECORD_BYTES = 8 * 1024 * 1024


_NOT_CARRIED = (wire.RecordKind.ANCHOR, wire.RecordKind.POSITIONS)


def route(message: Any, partitions: int) -> int | None:
    """The new partition of a consumed record, ``None`` for one that is not carried over."""
    key = message.key()
    if not key:
        # Anchors, and positions of the old command partitions, mean nothing in the new topics.
        if not message.value() or wire.kind_of(message) in _NOT_CARRIED:
            return None
        return int(message.partition()) % partitions
    try:
        text = bytes(key).decode()
    except UnicodeDecodeError:
        return int(message.partition()) % partitions
    return partition_for(text, partitions)


def copied_from(message: Any) -> tuple[str, int, int] | None:
    """``(topic, partition, offset)`` of the record a copy was made from; ``None`` otherwise."""
    found = wire.header_of(message, COPIED_HEADER)
    if found is None:
        return None
    try:
        topic, partition, offset = found.decode().rsplit(":", 2)
        return topic, int(partition), int(offset)
    except (UnicodeDecodeError, ValueError):
        return None


#: Headers a copy does not carry over: the one it adds, and the positions of the old command
#: partitions (which mean nothing in the new topics, like a ``positions`` record).
_NOT_COPIED = frozenset({COPIED_HEADER, wire.POSITIONS_HEADER})


def original_headers(message: Any) -> list[tuple[str, bytes]]:
    """A record's headers without the one a copy adds and the positions it leaves behind."""
    return [
        (key, bytes(value) if value is not None else b"")
        for key, value in message.headers() or ()
        if key not in _NOT_COPIED
    ]


class Pump:
    """Copies and forwards for one move."""

    def __init__(self, plan: MovePlan) -> None:
        self.plan = plan
        self.producer = clients.new_transactional_producer(
            plan.bootstrap,
            plan.move_id,
            {
                "transaction.timeout.ms": 60_000,
                "message.max.bytes": _MAX_RECORD_BYTES,
                # It sends positions to its group (``send_offsets_to_transaction``).
                **clients.OFFSET_SENDER_OVERRIDES,
            },
        )
        self.consumer = clients.new_consumer(
            plan.bootstrap,
            plan.move_id,
            {"fetch.wait.max.ms": 50, "max.partition.fetch.bytes": _MAX_RECORD_BYTES},
        )
        self._routes: dict[tuple[bytes, int], int] = {}
        try:
            # Aborts what a stopped run of this move left open, and fences it.
            self.producer.init_transactions(_CALL_S)
        except clients.KafkaException as exc:
            raise MoveError(f"the move's producer could not start: {exc}") from None

    def commit(self, sources: Sequence[Source]) -> None:
        """Commit the positions of ``sources`` alone (the start of a move, a phase's end)."""
        self._transaction(sources, [])

    def run(
        self,
        sources: Sequence[Source],
        *,
        targets: Mapping[tuple[str, int], int] | None,
        stop: Callable[[], bool],
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Copy from ``sources`` until each reaches its target (``None``: until ``stop()``),
        or ``stop()`` says so; how many records were copied."""
        by_tp = {(s.topic, s.partition): s for s in sources}
        self.consumer.assign(
            [clients.TopicPartition(s.topic, s.partition, s.position) for s in sources]
        )
        copied = 0
        try:
            while True:
                if targets is not None and all(
                    s.position >= targets[(s.topic, s.partition)] for s in sources
                ):
                    break
                if stop():
                    break
                wanted, moved = self._advance(sources, by_tp, self._batch())
                if moved:
                    count = self._transaction(sources, wanted)
                    copied += count
                    if progress is not None and count:
                        progress(copied)
        finally:
            self.consumer.unassign()
        return copied

    def _batch(self) -> list[Any]:
        first = self.consumer.poll(0.1)
        if first is None:
            return []
        messages = [first]
        deadline = time.monotonic() + _BATCH_S
        while len(messages) < _BATCH_RECORDS and time.monotonic() < deadline:
            more = self.consumer.consume(min(1000, _BATCH_RECORDS - len(messages)), timeout=0.02)
            if not more:
                break
            messages.extend(more)
        return messages

    def _advance(
        self,
        sources: Sequence[Source],
        by_tp: Mapping[tuple[str, int], Source],
        messages: list[Any],
    ) -> tuple[list[tuple[Source, Any]], bool]:
        """The records of ``messages`` to copy, each with its source, and whether any source's
        position moved (past records, or past transaction markers alone)."""
        wanted: list[tuple[Source, Any]] = []
        moved = False
        for message in messages:
            error = message.error()
            if error is not None:
                if error.fatal():
                    raise MoveError(f"the move's consumer failed: {error}")
                continue
            source = by_tp.get((message.topic(), int(message.partition())))
            offset = int(message.offset())
            if source is None or offset < source.position:
                continue  # fetched before an assignment changed
            source.position = offset + 1
            moved = True
            if source.only is not None and wire.kind_of(message) is not source.only:
                continue
            origin = copied_from(message)
            if origin is None or origin[0] != source.dest:  # a copy of the target: skip it
                wanted.append((source, message))
        tps = [clients.TopicPartition(s.topic, s.partition) for s in sources]
        for tp in self.consumer.position(tps):
            source = by_tp[(tp.topic, tp.partition)]
            if tp.offset > source.position:
                source.position = tp.offset
                moved = True
        return wanted, moved

    def _transaction(self, sources: Sequence[Source], wanted: list[tuple[Source, Any]]) -> int:
        """One transaction: the copies of ``wanted`` and every source's position."""
        copied = 0
        counts: dict[int, int] = {}
        try:
            self.producer.begin_transaction()
            for source, message in wanted:
                partition = self._route(message, source.dest_partitions)
                if partition is None:
                    continue
                counts[id(source)] = counts.get(id(source), 0) + 1
                kind, at_ms = message.timestamp()
                here = f"{source.topic}:{source.partition}:{message.offset()}"
                self.producer.produce(
                    source.dest,
                    value=message.value(),
                    key=message.key(),
                    partition=partition,
                    headers=[*original_headers(message), (COPIED_HEADER, here.encode())],
                    **({"timestamp": at_ms} if kind else {}),
                )
                copied += 1
                if copied % 1000 == 0:
                    self.producer.poll(0)
            offsets = [
                clients.TopicPartition(
                    s.topic, s.partition, s.position, metadata=self.plan.metadata(s)
                )
                for s in sources
            ]
            self.producer.send_offsets_to_transaction(
                offsets, self.consumer.consumer_group_metadata(), _CALL_S
            )
            self.producer.commit_transaction(_CALL_S)
            for source in sources:
                source.moved += counts.get(id(source), 0)
        except (clients.KafkaException, BufferError) as exc:
            with contextlib.suppress(clients.KafkaException):
                self.producer.abort_transaction(_CALL_S)
            raise MoveError(
                f"the move stopped ({exc}); run the same command again to resume it from what "
                "was committed"
            ) from None
        return copied

    def _route(self, message: Any, partitions: int) -> int | None:
        key = message.key()
        if key:
            cached = self._routes.get((key, partitions))
            if cached is not None:
                return cached
        partition = route(message, partitions)
        if key and partition is not None:
            if len(self._routes) > 200_000:
                self._routes.clear()
            self._routes[(key, partitions)] = partition
        return partition

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.consumer.close()
        self.producer.flush(_CALL_S)
