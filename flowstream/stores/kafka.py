"""``KafkaEventStore``: an event store whose durable log is the Kafka events topic.

One process owns every partition of the events topic; there is no consumer group. This is the
store for running embedded over Kafka, and the one the conformance and engine suites prove against
a real broker. Each partition keeps the processor's own state store
(:class:`~flowstream.stores.partition.PartitionStore`, a local RocksDB that caches its events
partition), and that store is the sequence authority for the partition's runs, exactly as in a
processor. The store sits beside the processor's code rather than below it because it reuses that
state store; nothing in ``processor`` imports this module.

Opening, in order:

1. open every partition's RocksDB under ``state_dir`` (a second opener of the same directory
   fails here with ``StoreLockedError``, before it can fence the first);
2. ``init_transactions``: fences every earlier store with this ``transactional_id`` and aborts
   its open transaction, so nothing holds the restore below back;
3. check that the events topic exists with the topology's partition count;
4. restore each partition from the offset its RocksDB reflects (from the start when the local
   state is missing) up to the high watermark read ``read_uncommitted`` with ``cached=False``: the
   true end of the partition, not the last stable offset. A record the state machine rejects
   stops the open with ``CorruptHistoryError`` naming its offset.

Each ``append_if_sequence``, in order (the whole of it under the store's lock):

1. tokens claimed in *other* partitions are checked (rule 5 spans the whole store);
2. the run's partition store validates the batch (rules 1–5) and stages it: ``_persist``
   produces the envelopes, key = run id, into a new transaction, and the store keeps them in a
   pending ``WriteBatch``;
3. commit the transaction, which first flushes it (every event is acknowledged, and its
   delivery report gives its offset): the events are durable in Kafka before the call returns;
4. ``commit_local``: RocksDB gets the staged batch with the events offset it now reflects;
5. listeners see the batch.

The store never calls ``Producer.flush()``: confluent-kafka 2.16 turns a fatal error (such as
being fenced) served inside ``flush`` into a broken exception that no ``except`` clause catches,
while ``commit_transaction`` reports the same error as a ``KafkaException``.

Any Kafka error aborts the transaction, discards the staged batch and every cached state it
touched, and raises ``FlowError``. Once another store opens with the same ``transactional_id``,
this one is fenced: its next append, and every later one, raises ``StoreLockedError``. Reads keep
answering from the local state.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from flowstream.errors import CorruptHistoryError, FlowError, StoreLockedError
from flowstream.kafka import clients
from flowstream.model.events import EventEnvelope, FlowEvent, HookCreated
from flowstream.model.snapshot import HookStatus
from flowstream.partitioning import partition_for
from flowstream.replay.state import RunState, Wakeup
from flowstream.stores.base import (
    MAX_EVENT_BYTES,
    AppendResult,
    Clock,
    EventStore,
    IndexChanges,
    utc_now,
)
from flowstream.stores.partition import PartitionStore
from flowstream.topology import EVENTS, Topology, TopologyError, load_topology
from flowstream.wire import RecordKind, event_headers, kind_of

__all__ = ["KafkaEventStore"]

_PRODUCER_OVERRIDES: dict[str, Any] = {
    # Every append is one transaction, flushed at once: lingering only adds latency.
    "linger.ms": 0,
    # Back-to-back transactions: the next AddPartitionsToTxn meets CONCURRENT_TRANSACTIONS while
    # the previous commit's markers are written, and librdkafka asks again after
    # retry.backoff.ms (100 ms by default, which would dominate every append).
    "retry.backoff.ms": 10,
    # Rule 4 is the limit on an event, not librdkafka's default of 1 000 000 bytes a message.
    # (The broker's own limit, the topic's max.message.bytes, is the topology's to declare.)
    "message.max.bytes": MAX_EVENT_BYTES + 64 * 1024,
}
_FENCED = frozenset(
    {
        clients.KafkaError._FENCED,
        clients.KafkaError.PRODUCER_FENCED,
        clients.KafkaError.INVALID_PRODUCER_EPOCH,
    }
)

T = TypeVar("T")
_NEVER = datetime.min.replace(tzinfo=UTC)


def _wakeup_order(wakeup: Wakeup) -> tuple[datetime, str, str, str]:
    return (wakeup.due, wakeup.run_id, wakeup.kind, wakeup.subject_id)


def _check_topic(metadata: clients.ClusterMetadata, name: str, partitions: int) -> None:
    """Refuse to open unless the events topic ``name`` exists with ``partitions`` partitions."""
    topic = metadata.topics.get(name)
    if topic is None or topic.error is not None:
        raise TopologyError(
            f"topic {name} is missing (create it with `flowstream topics apply` and this prefix)"
        )
    if len(topic.partitions) != partitions:
        raise TopologyError(
            f"topic {name} has {len(topic.partitions)} partitions, expected {partitions}"
        )


class KafkaEventStore(EventStore):
    """Histories on the Kafka events topic, cached per partition in local RocksDB stores.

    ``prefix`` names the topics (``<prefix>.events``); ``state_dir`` holds one RocksDB per
    partition; ``transactional_id`` identifies this writer, and the latest store opened with it
    fences the others; ``timeout`` bounds each Kafka call, and a restore that makes no progress.
    """

    def __init__(
        self,
        bootstrap: str,
        *,
        prefix: str,
        state_dir: str | Path,
        transactional_id: str,
        topology: Topology | None = None,
        clock: Clock = utc_now,
        timeout: float = 30.0,
    ) -> None:
        super().__init__(clock=clock)
        self.bootstrap = bootstrap
        self.topology = topology or load_topology()
        self.topic = self.topology.name(EVENTS, prefix)
        self.state_dir = Path(state_dir)
        self.transactional_id = transactional_id
        self._timeout = timeout
        # The writer header names the store's transactional id.
        self._headers = event_headers(transactional_id)
        self._partitions: list[PartitionStore] = []
        self._producer: clients.Producer | None = None
        self._txn_open = False
        self._ends: dict[int, int] = {}
        self._failure: FlowError | None = None
        self._closed = False
        try:
            for partition in range(self.topology.run_partitions):
                self._partitions.append(
                    PartitionStore(
                        partition,
                        self.state_dir / f"p{partition:04d}",
                        self._sink,
                        clock=clock,
                    )
                )
            self._producer = clients.new_transactional_producer(
                bootstrap,
                transactional_id,
                {**_PRODUCER_OVERRIDES, "on_delivery": self._delivered},
            )
            # Metadata first: it checks the topic and connects the producer, which otherwise
            # waits half a second for its first coordinator query in ``init_transactions``.
            # (All topics are asked for: a request naming a missing topic may create it.)
            metadata = self._call("read metadata", self._producer.list_topics, None, timeout)
            _check_topic(metadata, self.topic, self.topology.run_partitions)
            self._call("start transactions", self._producer.init_transactions, timeout)
            self._restore()
        except BaseException:
            self.close()
            raise

    # -- the contract ----------------------------------------------------------------------

    def append_if_sequence(
        self, run_id: str, expected_sequence: int, events: Sequence[FlowEvent]
    ) -> AppendResult:
        """Append ``events`` in one Kafka transaction after ``expected_sequence``, or raise."""
        store = self._partition_of(run_id)
        with self._lock:
            if self._failure is not None:
                raise self._failure
            self._require_producer()
            state = store._state_or_none(run_id)
            if events and (0 if state is None else state.last_sequence) == expected_sequence:
                # The partition store knows only its own tokens; a token may live anywhere.
                self._check_hook_claims(run_id, events, IndexChanges())
            try:
                envelopes = store.append_if_sequence(run_id, expected_sequence, events)
                if envelopes:
                    self._commit(run_id)
            except BaseException as exc:
                store.discard()
                if self._txn_open:
                    self._abort(run_id)
                if isinstance(exc, clients.KafkaException):
                    raise self._kafka_error(exc, "append", run_id) from exc
                raise
            if envelopes:
                store.commit_local(self._ends.get(store.partition))
                self._notify(envelopes)
            return envelopes

    def list_runs(self) -> list[str]:
        with self._lock:
            return sorted(run for store in self._partitions for run in store.list_runs())

    def open_runs(self, after: str | None, limit: int) -> list[str]:
        with self._lock:
            found = [r for store in self._partitions for r in store.open_runs(after, limit)]
            return sorted(found)[:limit]

    def due_wakeups(self, now: datetime) -> list[Wakeup]:
        with self._lock:
            due = [w for store in self._partitions for w in store.due_wakeups(now)]
            return sorted(due, key=_wakeup_order)

    def next_wakeup(self) -> Wakeup | None:
        with self._lock:
            first = [w for store in self._partitions if (w := store.next_wakeup()) is not None]
            return min(first, key=_wakeup_order, default=None)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._txn_open:
                self._abort(None)
            producer, self._producer = self._producer, None
            if producer is not None and self._failure is None:
                with contextlib.suppress(clients.KafkaException):
                    producer.close()
            # A failed producer is not closed: close() would abort and flush it, which can only
            # fail; dropping the last reference destroys it.
            for store in self._partitions:
                store.close()
            self._states.clear()

    def __enter__(self) -> KafkaEventStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what the base class asks of a backend --------------------------------------------------

    def _state_or_none(self, run_id: str) -> RunState | None:
        return self._partition_of(run_id)._state_or_none(run_id)

    def _load(self, run_id: str) -> list[EventEnvelope] | None:
        return self._partition_of(run_id)._load(run_id)

    def _persist(
        self,
        run_id: str,
        envelopes: list[EventEnvelope],
        encoded: list[bytes],
        changes: IndexChanges | None = None,
    ) -> None:
        """Produce the encoded envelopes into the open transaction (opening one if needed).

        The partition store calls this as its sink before it stages the batch and its index
        changes, so a failure here leaves nothing staged.
        """
        producer = self._require_producer()
        if not self._txn_open:
            producer.begin_transaction()
            self._txn_open = True
            self._ends.clear()
        partition = partition_for(run_id, self.topology.run_partitions)
        for data in encoded:
            while True:
                try:
                    producer.produce(
                        self.topic,
                        value=data,
                        key=run_id.encode(),
                        partition=partition,
                        headers=self._headers,
                    )
                    break
                except BufferError:
                    producer.poll(0.05)

    def _hook_owner(self, token_digest: str) -> tuple[str, str] | None:
        """The owner of a token across partitions: an active hook first, else the latest claim."""
        owners = [
            owner
            for store in self._partitions
            if (owner := store._hook_owner(token_digest)) is not None
        ]
        if len(owners) <= 1:
            return owners[0] if owners else None
        return max(owners, key=self._claim_rank)

    # -- Kafka ---------------------------------------------------------------------------------

    def _sink(self, run_id: str, envelopes: list[EventEnvelope], encoded: list[bytes]) -> None:
        # Looked up per call, so a replaced ``_persist`` (a subclass, a test) takes effect.
        self._persist(run_id, envelopes, encoded)

    def _delivered(self, err: Any, message: Any) -> None:
        # A failed delivery needs no bookkeeping: it makes the commit fail.
        if err is None:
            partition = message.partition()
            self._ends[partition] = max(self._ends.get(partition, 0), message.offset() + 1)

    def _commit(self, run_id: str) -> None:
        producer = self._require_producer()
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                producer.commit_transaction(max(1.0, deadline - time.monotonic()))
                break
            except clients.KafkaException as exc:
                if not exc.args[0].retriable() or time.monotonic() >= deadline:
                    raise
        self._txn_open = False

    def _abort(self, run_id: str | None) -> None:
        """Abort the open transaction; when even that fails, no later append is accepted."""
        self._txn_open = False
        producer = self._producer
        if producer is None:
            return
        try:
            producer.abort_transaction(self._timeout)
        except clients.KafkaException as exc:
            failure = self._kafka_error(exc, "abort", run_id)
            if self._failure is None:
                # The transaction may have committed, so the local state can no longer be the
                # sequence authority; reopening restores it from the topic.
                self._failure = FlowError(
                    f"the outcome of the last append to {self.topic} is unknown ({failure}); "
                    "close and reopen the store to restore it from the topic",
                    run_id=run_id,
                )

    def _kafka_error(
        self, exc: clients.KafkaException, action: str, run_id: str | None
    ) -> FlowError:
        error = exc.args[0] if exc.args else None
        code = error.code() if isinstance(error, clients.KafkaError) else None
        if code in _FENCED:
            self._failure = StoreLockedError(
                f"another store opened {self.topic} with transactional id "
                f"{self.transactional_id!r} and fenced this one, which accepts no more appends; "
                "close it (its committed events are safe on the topic)",
                run_id=run_id,
            )
            return self._failure
        if self._failure is not None:
            return self._failure
        if isinstance(error, clients.KafkaError) and error.fatal():
            self._failure = FlowError(
                f"the Kafka producer of {self.topic} failed fatally ({error}); "
                "close and reopen the store",
                run_id=run_id,
            )
            return self._failure
        subject = f"run {run_id}" if run_id else "the store"
        return FlowError(
            f"Kafka failed to {action} {subject} on {self.topic}: {error}; nothing was "
            "appended, retry when the brokers are reachable",
            run_id=run_id,
        )

    def _call(self, action: str, call: Callable[..., T], *args: Any) -> T:
        try:
            return call(*args)
        except clients.KafkaException as exc:
            raise FlowError(
                f"could not {action} for {self.topic} at {self.bootstrap}: {exc.args[0]}; "
                "check that the brokers are reachable"
            ) from exc

    def _require_producer(self) -> clients.Producer:
        if self._producer is None:
            raise FlowError(f"the store of {self.topic} is closed")
        return self._producer

    # -- restore ---------------------------------------------------------------------------------

    def _restore(self) -> None:
        """Bring every partition's RocksDB up to the end of its events partition."""
        watermarks = clients.new_consumer(
            self.bootstrap,
            f"{self.transactional_id}.watermarks-unused",
            {"isolation.level": "read_uncommitted"},
        )
        try:
            targets: dict[int, tuple[int, int]] = {}
            for store in self._partitions:
                tp = clients.TopicPartition(self.topic, store.partition)
                _, high = self._call(
                    "read the end of the events topic",
                    watermarks.get_watermark_offsets,
                    tp,
                    self._timeout,
                    False,
                )
                start = store.events_offset
                if start > high:
                    raise FlowError(
                        f"{store.path} reflects offset {start} of {self.topic}[{store.partition}]"
                        f" but the partition ends at {high}: the state belongs to another topic; "
                        "delete the directory to rebuild it from the topic"
                    )
                if start < high:
                    targets[store.partition] = (start, high)
        finally:
            watermarks.close()
        if targets:
            self._read(targets)
        for store in self._partitions:
            failures = store.finish_restore()
            if failures:
                run_id, exc = failures[0]
                raise CorruptHistoryError(
                    f"run {run_id} restored from {self.topic}[{store.partition}] does not "
                    f"validate: {exc}; audit the topic with `flowstream audit`",
                    run_id=run_id,
                ) from exc

    def _read(self, targets: dict[int, tuple[int, int]]) -> None:
        """Read committed records from each partition's start offset to its target end."""
        restorer = clients.new_consumer(self.bootstrap, f"{self.transactional_id}.restore-unused")
        positions = {partition: start for partition, (start, _) in targets.items()}
        pending = set(targets)
        try:
            restorer.assign(
                [clients.TopicPartition(self.topic, p, start) for p, (start, _) in targets.items()]
            )
            stalled_since = time.monotonic()
            while pending:
                for message in restorer.consume(num_messages=2000, timeout=0.1):
                    error = message.error()
                    if error is not None:
                        if error.fatal():
                            raise FlowError(f"restoring {self.topic} failed: {error}")
                        continue
                    partition = message.partition()
                    assert partition is not None  # consumed records carry their partition
                    self._restore_record(self._partitions[partition], message)
                    positions[partition] = int(message.offset() or 0) + 1
                reported = restorer.position(
                    [clients.TopicPartition(self.topic, p) for p in pending]
                )
                # Commit and abort markers occupy offsets: the position, not the last record,
                # says how far a partition was read.
                for tp in reported:
                    positions[tp.partition] = max(positions[tp.partition], tp.offset)
                for partition in sorted(pending):
                    store = self._partitions[partition]
                    if store.has_staged or positions[partition] >= targets[partition][1]:
                        store.commit_local(positions[partition])
                        stalled_since = time.monotonic()
                    if positions[partition] >= targets[partition][1]:
                        pending.discard(partition)
                if pending and time.monotonic() - stalled_since > self._timeout:
                    behind = ", ".join(
                        f"[{p}] at {positions[p]} of {targets[p][1]}" for p in sorted(pending)
                    )
                    raise FlowError(
                        f"restoring {self.topic} made no progress for {self._timeout:.0f} s: "
                        f"{behind}; check the brokers"
                    )
        finally:
            restorer.close()

    def _restore_record(self, store: PartitionStore, message: Any) -> None:
        if kind_of(message) is not RecordKind.EVENT:
            return  # a processor's bookkeeping (inbox, hook token): not part of any history
        try:
            store.restore_event(message.value() or b"")
        except FlowError as exc:
            raise CorruptHistoryError(
                f"{self.topic}[{message.partition()}]@{message.offset()} cannot be restored: "
                f"{exc}; audit the topic with `flowstream audit`",
                run_id=exc.run_id,
            ) from exc

    # -- routing ---------------------------------------------------------------------------------

    def _partition_of(self, run_id: str) -> PartitionStore:
        return self._partitions[partition_for(run_id, self.topology.run_partitions)]

    def _claim_rank(self, owner: tuple[str, str]) -> tuple[bool, datetime, int]:
        run_id, hook_id = owner
        state = self._state_or_none(run_id)
        if state is None:
            return (False, _NEVER, 0)
        hook = state.hooks.get(hook_id)
        active = not state.is_terminal and hook is not None and hook.status is HookStatus.ACTIVE
        claimed = [
            (e.timestamp, e.sequence)
            for e in state.history
            if isinstance(e.event, HookCreated) and e.event.hook_id == hook_id
        ]
        latest = max(claimed, default=(_NEVER, 0))
        return (active, *latest)
