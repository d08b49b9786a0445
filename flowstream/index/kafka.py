"""``KafkaRunIndex``: a deployment's run index, kept in a local directory from the events topic.

The directory is a RocksDB store of its own (never a processor's state): it holds each run's
history as read from the events topic (the topic's own bytes), the run index of
:mod:`flowstream.index.table` maintained event by event, and the next offset of each events
partition, all three in the same write. So the index never disagrees with the histories it
holds, and after a crash it goes on from the offsets that write recorded.

Following the topic, in order:

1. open the directory (a second process on the same directory fails: ``StoreLockedError``);
2. check the events topic (its partition count, its topic id): a directory written from another
   topic of that name (deleted and created again), or one that reflects offsets beyond the
   topic's end, is deleted and rebuilt from offset 0, as is a missing directory;
3. ``catch_up`` reads every partition ``read_committed`` from its stored offset up to its last
   stable offset at the call (the end of what is committed: aborted records and open
   transactions are never seen), applies each event to its run's state (``RunState.apply``
   validates it) and writes the events, the index changes and the new offsets in one batch per
   chunk read. A record of another kind (a processor's inbox, hook-token bookkeeping) is skipped.
   A run whose next event does not apply (its history on the topic is corrupt) keeps the row
   of what applied and is left behind, with a warning; ``flowstream audit`` says why.

Queries (``query``, ``get``, ``counts``, ``state``) first catch up, at most once every
``refresh`` seconds (``refresh=None``: never; call ``catch_up`` yourself), so a long-running
gateway answers from an index at most that far behind the topic. ``rebuild`` deletes the
directory and reads the topic again from offset 0.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
import uuid
from pathlib import Path

from flowstream import codec, wire
from flowstream.errors import FlowError
from flowstream.index.rows import RunPage, RunQuery, RunRow
from flowstream.index.table import RunTable
from flowstream.kafka import clients
from flowstream.model.events import EventEnvelope
from flowstream.outcomes import high_watermark
from flowstream.replay.state import RunState
from flowstream.settings import Settings
from flowstream.stores.base import IndexChanges
from flowstream.stores.rocksdb import RocksDBEventStore
from flowstream.topology import EVENTS, Topology, load_topology

__all__ = ["KafkaRunIndex"]

LOG = logging.getLogger("flowstream.index")

_TOPIC_KEY = b"m/index/topic"
_TOPIC_ID_KEY = b"m/index/topic_id"
_OFFSET_KEY = b"m/index/offset/"
_BROKEN = b"m/index/broken/"
#: A read_committed fetch that finds nothing waits this long on the broker (default 500 ms).
_FETCH_WAIT_MS = 10


class _IndexStore(RocksDBEventStore):
    """The index directory: histories in the topic's bytes, the run index, the offsets."""

    def __init__(self, path: Path) -> None:
        # Few states are cached: events of a run mostly follow each other closely on the topic.
        super().__init__(path, sync="group", cache_runs=2_000)
        self.broken = {
            key[len(_BROKEN) :].decode(): value.decode() for key, value in self._scan(_BROKEN)
        }

    def _encode(self, envelope: EventEnvelope) -> bytes:
        return codec.encode_event(envelope)

    def _decode(self, run_id: str, raw: bytes) -> EventEnvelope:
        return codec.decode_event(raw)

    def _event_type(self, raw: bytes) -> str:
        return codec.decode_event(raw).event.type

    def meta(self, key: bytes) -> bytes | None:
        self._write_pending()
        raw = self._db.get(key)
        return None if raw is None else bytes(raw)

    def put_meta(self, key: bytes, value: bytes) -> None:
        self._stage_put(key, value)

    def take(self, envelope: EventEnvelope, raw: bytes) -> None:
        """Apply one event read from the topic to its run, staging its writes; an event the
        run already holds is skipped, one that does not apply leaves the run behind."""
        run_id = envelope.run_id
        if run_id in self.broken:
            return
        table = self._run_table
        assert table is not None
        with self._lock:
            state: RunState | None = None
            kept = 0
            try:
                state = self._state_or_none(run_id)
                if state is not None and envelope.sequence <= state.last_sequence:
                    return
                before = table.held_facts(run_id, state)
                if state is None:
                    state = RunState.first(envelope)
                else:
                    kept = state.last_sequence
                    state.apply(envelope)
            except FlowError as exc:
                self._forget_failed(run_id, state, kept)
                self._break(run_id, f"{envelope.sequence}: {exc}")
                return
            # The run's index keys are written once per commit, from its newest state.
            table.stage(run_id, before, state)
            self._persist(run_id, [envelope], [raw], IndexChanges())
            self._remember(run_id, state)

    def _break(self, run_id: str, reason: str) -> None:
        LOG.warning("run %s: the run index stops following it at event %s", run_id, reason)
        self.broken[run_id] = reason
        self._stage_put(_BROKEN + run_id.encode(), reason.encode())

    def commit(self) -> None:
        """Write what was staged (events, index changes, offsets) in one batch."""
        self._write_pending()


class KafkaRunIndex:
    """The run index of the deployment behind ``settings``, kept in ``directory``."""

    def __init__(
        self,
        settings: Settings,
        directory: str | Path,
        *,
        topology: Topology | None = None,
        timeout: float = 30.0,
        refresh: float | None = 1.0,
    ) -> None:
        self.settings = settings
        self.directory = Path(directory)
        self.topology = topology if topology is not None else load_topology()
        self.topic = self.topology.name(EVENTS, settings.topic_prefix)
        self.partitions = self.topology.run_partitions
        self.timeout = timeout
        self.refresh = refresh
        self._lock = threading.RLock()
        self._caught_up_at: float | None = None
        self._topic_id = self._read_topic_id()
        self._consumer = clients.new_consumer(
            settings.bootstrap,
            f"{settings.group}-run-index-{uuid.uuid4().hex[:8]}",
            {"fetch.wait.max.ms": _FETCH_WAIT_MS},
        )
        try:
            self._store = self._open()
        except BaseException:
            self._consumer.close()
            raise

    # -- the directory ------------------------------------------------------------------------

    def _read_topic_id(self) -> str | None:
        admin = clients.new_admin(self.settings.bootstrap)
        try:
            described = admin.describe_topics(clients.TopicCollection([self.topic]))
            topic = described[self.topic].result(self.timeout)
        except clients.KafkaException as exc:
            raise FlowError(
                f"the events topic {self.topic} cannot be read at {self.settings.bootstrap}: "
                f"{exc}; check --bootstrap and --prefix, or create the topics with "
                "`flowstream topics apply`"
            ) from None
        if len(topic.partitions) != self.partitions:
            raise FlowError(
                f"topic {self.topic} has {len(topic.partitions)} partitions but the topology "
                f"declares {self.partitions} (check --topology)"
            )
        return None if topic.topic_id is None else str(topic.topic_id)

    def _open(self) -> _IndexStore:
        """Open the directory, deleting it first when it follows another topic."""
        store = _IndexStore(self.directory)
        topic = store.meta(_TOPIC_KEY)
        topic_id = store.meta(_TOPIC_ID_KEY)
        foreign = None
        if topic is not None and topic.decode() != self.topic:
            foreign = f"it follows {topic.decode()}"
        elif topic_id is not None and self._topic_id and topic_id.decode() != self._topic_id:
            foreign = "it was written from another topic of that name (deleted and created again)"
        if foreign is not None:
            LOG.warning("rebuilding the run index in %s: %s", self.directory, foreign)
            store.close()
            shutil.rmtree(self.directory)
            store = _IndexStore(self.directory)
        store.put_meta(_TOPIC_KEY, self.topic.encode())
        if self._topic_id:
            store.put_meta(_TOPIC_ID_KEY, self._topic_id.encode())
        store.commit()
        offsets = [self._offset(store, p) for p in range(self.partitions)]
        self._consumer.assign(
            [clients.TopicPartition(self.topic, p, offsets[p]) for p in range(self.partitions)]
        )
        return store

    def _offset(self, store: _IndexStore, partition: int) -> int:
        raw = store.meta(_OFFSET_KEY + partition.to_bytes(4, "big"))
        return 0 if raw is None else int.from_bytes(raw, "big")

    def rebuild(self) -> int:
        """Delete the directory and index the topic again from offset 0; returns the events
        read."""
        with self._lock:
            self._store.close()
            shutil.rmtree(self.directory, ignore_errors=True)
            self._store = self._open()
            return self.catch_up()

    # -- following the topic ------------------------------------------------------------------

    def catch_up(self, timeout: float | None = None) -> int:
        """Read every partition up to its last stable offset now; returns the events taken.

        Raises ``FlowError`` when a partition makes no progress for ``timeout`` seconds
        (default: the index's timeout), and rebuilds from offset 0 first when the stored
        offsets lie beyond the topic's end (the topic was emptied or created again).
        """
        patience = self.timeout if timeout is None else timeout
        with self._lock:
            deadline = time.monotonic() + patience
            ends = {
                p: high_watermark(self._consumer, self.topic, p, deadline)
                for p in range(self.partitions)
            }
            positions = {p: self._offset(self._store, p) for p in range(self.partitions)}
            if any(positions[p] > ends[p] for p in ends):
                LOG.warning(
                    "rebuilding the run index in %s: the topic ends earlier", self.directory
                )
                self._store.close()
                shutil.rmtree(self.directory, ignore_errors=True)
                self._store = self._open()
                positions = dict.fromkeys(ends, 0)
            taken = self._read(positions, ends, patience)
            self._caught_up_at = time.monotonic()
            return taken

    def _read(self, positions: dict[int, int], ends: dict[int, int], patience: float) -> int:
        pending = {p for p in ends if positions[p] < ends[p]}
        taken = 0
        progress_at = time.monotonic()
        while pending:
            messages = self._consumer.consume(num_messages=2000, timeout=0.1)
            for message, envelope in wire.event_records(messages):
                self._store.take(envelope, message.value() or b"")
                taken += 1
            reported = self._consumer.position(
                [clients.TopicPartition(self.topic, p) for p in pending]
            )
            moved = False
            for tp in reported:
                # Commit markers occupy offsets: the position says how far a partition is read.
                if tp.offset > positions[tp.partition]:
                    positions[tp.partition] = tp.offset
                    self._store.put_meta(
                        _OFFSET_KEY + tp.partition.to_bytes(4, "big"),
                        tp.offset.to_bytes(8, "big"),
                    )
                    moved = True
                if positions[tp.partition] >= ends[tp.partition]:
                    pending.discard(tp.partition)
            self._store.commit()
            if moved:
                progress_at = time.monotonic()
            elif pending and time.monotonic() - progress_at > patience:
                behind = ", ".join(f"[{p}] at {positions[p]} of {ends[p]}" for p in sorted(pending))
                raise FlowError(
                    f"the run index made no progress reading {self.topic} for {patience:g} s: "
                    f"{behind}; check the brokers"
                )
        return taken

    def _fresh(self) -> RunTable:
        if self.refresh is not None and (
            self._caught_up_at is None or time.monotonic() - self._caught_up_at >= self.refresh
        ):
            self.catch_up()
        return self._store.run_index()

    # -- RunIndex -----------------------------------------------------------------------------

    def query(self, query: RunQuery) -> RunPage:
        with self._lock:
            return self._fresh().query(query)

    def get(self, run_id: str) -> RunRow | None:
        with self._lock:
            return self._fresh().get(run_id)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return self._fresh().counts()

    def totals(self) -> dict[str, int]:
        """Runs by status and open suspensions by kind (``RunTable.totals``)."""
        with self._lock:
            return self._fresh().totals()

    def state(self, run_id: str) -> RunState:
        """The run's state as the index holds it (``RunNotFoundError`` when it holds none)."""
        with self._lock:
            self._fresh()
            return self._store.state(run_id)

    @property
    def broken(self) -> dict[str, str]:
        """Runs the index stopped following (their next event did not apply), with why."""
        return dict(self._store.broken)

    def close(self) -> None:
        with self._lock:
            self._store.close()
            self._consumer.close()

    def __enter__(self) -> KafkaRunIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
