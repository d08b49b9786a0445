"""``RocksDBEventStore``: the embedded, durable store (one process at a time).

Key layout (one RocksDB, raw bytes):

``e<run_id>\\0<seq:8 BE>``      the event envelope, as JSON
``r<run_id>``                   the run's last sequence (8 BE), for ``list_runs`` and conflicts;
                                in a store that keeps the run index, the run's row after it
``w<due µs:8 BE>\\0<run>\\0<kind>\\0<subject>``   the wakeup index, scanned by due time
``h<token digest>``             ``<run_id>\\0<hook_id>`` of the hook that claimed the token
``o<run_id>``                   the run is not terminal (the open-runs index of the liveness scan)
``m/open_index``                the open-runs index is built (a store written before it existed
                                gets it built once, from each run's last event, when opened)
``v…``                          the run index: keys by workflow, status and update time,
                                workflows, open suspensions, counters (``flowstream.index.table``)
``m/run_index/4``               the run index is built in its current layout (a store written
                                before it existed, or in an earlier layout, ``m/run_index/3``,
                                ``/2`` or ``m/run_index``, gets it built once, from every
                                history, when opened read-write; a read-only open of such a
                                store builds it in memory)

An append and every index change it causes go in one ``WriteBatch``. With ``sync="group"`` (the
default) the appends made until the next ``wait_durable`` collect in one batch, written before
that fsync (or before any read of the database), so all the runs that wait together share one
write and one fsync (group commit); ``sync="always"`` writes and fsyncs every append's batch.
Only this module imports ``rocksdict``.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeVar

import orjson
from rocksdict import (
    AccessType,
    BlockBasedIndexType,
    BlockBasedOptions,
    Cache,
    Options,
    Rdict,
    WriteBatch,
    WriteBufferManager,
    WriteOptions,
)

from flowstream.errors import (
    SerializationError,
    StoreCorruptError,
    StoreLockedError,
    StoreNotFoundError,
)
from flowstream.index.table import (
    BUILT_KEY,
    PREFIX,
    STALE_BUILT_KEYS,
    Change,
    MemoryKeyValues,
    RunTable,
    write_changes,
)
from flowstream.model.events import EventEnvelope
from flowstream.replay.state import RunState, Wakeup
from flowstream.stores.base import Clock, EventStore, IndexChanges, build_run_table, utc_now

__all__ = [
    "TERMINAL_EVENTS",
    "RocksDBEventStore",
    "put_append",
    "rocksdb_memory",
    "store_options",
    "wakeup_key",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_OPEN_INDEX_KEY = b"m/open_index"
#: The event types that end a run (it leaves the open-runs index with them).
TERMINAL_EVENTS = frozenset(
    {
        "run_completed",
        "run_failed",
        "run_cancelled",
        "run_timed_out",
        "run_retry_exhausted",
        "run_continued_as_new",
    }
)
_OFFSET = 1 << 63

#: RocksDB's memory in one process, shared by every store it opens (a worker opens one per owned
#: partition): one block cache, which holds the index and filter blocks too, and the write
#: buffers (memtables) of every store, charged to that cache and flushed once they reach
#: ``WRITE_BUFFERS_BYTES`` together. Left to its defaults, each store had its own cache and up
#: to two 64 MiB memtables.
BLOCK_CACHE_BYTES = 64 << 20
WRITE_BUFFERS_BYTES = 32 << 20
#: One memtable of one store.
_MEMTABLE_BYTES = 8 << 20

_shared: tuple[Cache, WriteBufferManager] | None = None


def _shared_memory() -> tuple[Cache, WriteBufferManager]:
    global _shared
    if _shared is None:
        cache = Cache(BLOCK_CACHE_BYTES)
        buffers = WriteBufferManager.new_write_buffer_manager_with_cache(
            WRITE_BUFFERS_BYTES, False, cache
        )
        _shared = (cache, buffers)
    return _shared


def _forget_shared() -> None:
    global _shared
    _shared = None


os.register_at_fork(after_in_child=_forget_shared)  # a child opens stores of its own


def store_options(*, create: bool) -> Options:
    """The options of every store of this process (raw keys), drawing on its shared memory."""
    cache, buffers = _shared_memory()
    table = BlockBasedOptions()
    table.set_block_cache(cache)
    table.set_cache_index_and_filter_blocks(True)
    table.set_pin_l0_filter_and_index_blocks_in_cache(True)
    table.set_bloom_filter(10, False)  # point reads of runs a store does not hold
    # Index and filter in 4 KiB partitions, cached like data blocks, with only their top level
    # pinned: a whole-file index or filter grows with the runs a file holds, and past a shard of
    # the cache (1 MiB) it was read from the file again on every point lookup.
    table.set_index_type(BlockBasedIndexType.two_level_index_search())
    table.set_partition_filters(True)
    table.set_metadata_block_size(4096)
    table.set_pin_top_level_index_and_filter(True)
    options = Options(raw_mode=True)
    options.create_if_missing(create)
    options.set_block_based_table_factory(table)
    options.set_write_buffer_manager(buffers)
    options.set_write_buffer_size(_MEMTABLE_BYTES)
    options.set_max_write_buffer_number(2)
    return options


#: Projections a store keeps in memory (the runs last appended to or read); a run that is not
#: among them is read from its history on disk when it is next needed.
CACHE_RUNS = 2_000


def rocksdb_memory() -> dict[str, int]:
    """What RocksDB holds in this process: the shared cache (blocks and the memtables charged to
    it) and the memtables alone, in bytes."""
    cache, buffers = _shared_memory()
    return {"cache_bytes": cache.get_usage(), "memtable_bytes": buffers.get_usage()}


def _micros(moment: datetime) -> bytes:
    value = (moment - _EPOCH) // timedelta(microseconds=1) + _OFFSET
    return value.to_bytes(8, "big")


def _from_micros(raw: bytes) -> datetime:
    return _EPOCH + timedelta(microseconds=int.from_bytes(raw, "big") - _OFFSET)


def wakeup_key(wakeup: Wakeup) -> bytes:
    """The key of ``wakeup`` in the wakeup index."""
    return (
        b"w"
        + _micros(wakeup.due)
        + b"\0"
        + "\0".join((wakeup.run_id, wakeup.kind, wakeup.subject_id)).encode()
    )


def put_append(
    batch: WriteBatch,
    run_id: str,
    envelopes: list[EventEnvelope],
    encoded: list[bytes],
    changes: IndexChanges,
) -> None:
    """Add one append (events, last sequence, wakeup and hook index changes) to ``batch``."""
    run_key = run_id.encode()
    events = b"e" + run_key + b"\0"
    for envelope, data in zip(envelopes, encoded, strict=True):
        batch.put(events + envelope.sequence.to_bytes(8, "big"), data)
    if not changes.run_index:  # else the run index writes the key, with the run's row after it
        batch.put(b"r" + run_key, envelopes[-1].sequence.to_bytes(8, "big"))
    for wakeup in changes.removed_wakeups:
        batch.delete(wakeup_key(wakeup))
    for wakeup in changes.added_wakeups:
        batch.put(wakeup_key(wakeup), b"")
    for digest, owner_run, hook_id in changes.claimed_hooks:
        batch.put(b"h" + digest.encode(), f"{owner_run}\0{hook_id}".encode())
    if changes.run_open is not None:
        if changes.run_open:
            batch.put(b"o" + run_key, b"")
        else:
            batch.delete(b"o" + run_key)
    for key, value in changes.run_index:  # ``write_changes``, inline: every append has some
        if value is None:
            batch.delete(key)
        else:
            batch.put(key, value)


class _Unknown:
    """The earliest wakeup has to be read from the index again."""


_UNKNOWN = _Unknown()


def _parse_wakeup(key: bytes) -> Wakeup:
    run_id, kind, subject = key[10:].decode().split("\0", 2)
    return Wakeup(_from_micros(key[1:9]), run_id, kind, subject)


_T = TypeVar("_T")

#: RocksDB's words for a store another process holds ("While lock file: ...LOCK"); a whole word,
#: since a corrupt SST's "block checksum mismatch" contains "lock" too.
_LOCKED = re.compile(r"\block\b|lock hold")


def corrupt_store(path: Path, exc: Exception) -> Exception:
    """RocksDB's ``Corruption: ...`` (which names the damaged file) as a ``StoreCorruptError``;
    any other error as it is."""
    text = str(exc)
    if not text.startswith("Corruption:"):
        return exc
    detail = " ".join(text.removeprefix("Corruption:").split())
    return StoreCorruptError(f"the store at {path} is corrupt: {detail}")


class _Reads:
    """The store's database as the run index reads it (pending appends written first)."""

    def __init__(self, store: RocksDBEventStore) -> None:
        self._store = store

    def get(self, key: bytes) -> bytes | None:
        self._store._write_pending()
        raw = self._store._db.get(key)
        return None if raw is None else bytes(raw)

    def scan(self, start: bytes) -> Iterator[tuple[bytes, bytes]]:
        self._store._write_pending()
        for key, value in self._store._db.items(from_key=start):
            yield bytes(key), bytes(value)  # type: ignore[arg-type]  # raw mode yields bytes


class RocksDBEventStore(EventStore):
    """Durable histories and indexes in a local RocksDB directory."""

    #: Whether this store keeps the run index (the processor's partition stores do not: the
    #: run index of a Kafka deployment follows the events topic).
    keeps_run_index = True
    #: With group commit the run index's changes wait for the group's write (``RunTable.stage``);
    #: an attribute, not the base class's property: every append asks.
    _groups_index = True

    def __init__(
        self,
        path: str | Path,
        *,
        clock: Clock = utc_now,
        sync: str | bool = "group",
        cache_runs: int = CACHE_RUNS,
        create: bool = True,
        read_only: bool = False,
    ) -> None:
        """Open the store at ``path``; ``create=False`` refuses a path that holds no store
        (``StoreNotFoundError``), ``read_only`` opens it beside the process that has it open
        (a view as of the open; nothing may be appended)."""
        super().__init__(clock=clock)
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise StoreNotFoundError(f"{self.path} is a file, not a store directory")
        if not (create and not read_only) and not (self.path / "CURRENT").is_file():
            raise StoreNotFoundError(
                f"no store at {self.path} (check --data; only demo and start create one)"
            )
        self.path.mkdir(parents=True, exist_ok=True)
        options = store_options(create=create and not read_only)
        access = AccessType.read_only() if read_only else AccessType.read_write()
        self._db = self._open(options, access)
        if sync not in ("group", "always", True, False):
            raise ValueError('sync must be "group" or "always"')
        self._write_options = WriteOptions()
        self._write_options.sync = sync in ("always", True)
        #: Whether every append's write is fsynced (else group commit), read on every append:
        #: a plain attribute, not RocksDB's option read back through rocksdict.
        self._sync_each = sync in ("always", True)
        self._groups_index = not self._sync_each
        self._written = 0
        self._synced = 0
        self._pending: WriteBatch | None = None
        #: The runs with appends in ``_pending`` (a read of any other run need not write it).
        self._pending_runs: set[str] = set()
        self._earliest: Wakeup | _Unknown | None = _UNKNOWN
        self._cache_runs = cache_runs
        self._closed = False
        if not read_only and self._guard(lambda: self._db.get(_OPEN_INDEX_KEY)) is None:
            self._guard(self._build_open_index)
        if self.keeps_run_index:
            self._guard(lambda: self._open_run_index(read_only=read_only))

    def _open(self, options: Options, access: AccessType) -> Rdict:
        try:
            # The default column family named with the options: else an existing store is
            # opened with the options its OPTIONS file records, without this process's cache,
            # write buffers or bloom filter (an 8 MiB cache of its own).
            return Rdict(
                str(self.path),
                options=options,
                column_families={"default": options},
                access_type=access,
            )
        except Exception as exc:
            if _LOCKED.search(str(exc).lower()):
                raise StoreLockedError(
                    f"the store at {self.path} is open in another process; stop it or use "
                    "another directory"
                ) from exc
            raise corrupt_store(self.path, exc) from exc

    def _guard(self, work: Callable[[], _T]) -> _T:
        try:
            return work()
        except Exception as exc:
            raise corrupt_store(self.path, exc) from exc

    # -- reads ---------------------------------------------------------------------------------

    def _scan(self, prefix: bytes, end: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        self._write_pending()
        return self._range(prefix, end)

    def _range(self, prefix: bytes, end: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """The keys under ``prefix`` (up to ``end``) as the database holds them now."""
        for raw_key, value in self._db.items(from_key=prefix):
            key = bytes(raw_key)  # type: ignore[arg-type]  # raw mode yields bytes
            if not key.startswith(prefix) or (end is not None and key > end):
                return
            yield key, value

    def list_runs(self) -> list[str]:
        with self._lock:
            return [key[1:].decode() for key, _ in self._scan(b"r")]

    def open_runs(self, after: str | None, limit: int) -> list[str]:
        with self._lock:
            self._write_pending()
            start = b"o" if after is None else b"o" + after.encode() + b"\0"
            found: list[str] = []
            if limit <= 0:
                return found
            for raw_key in self._db.keys(from_key=start):
                key = bytes(raw_key)  # type: ignore[arg-type]  # raw mode yields bytes
                if not key.startswith(b"o"):
                    break
                found.append(key[1:].decode())
                if len(found) >= limit:
                    break
            return found

    def _build_open_index(self) -> None:
        """Index the open runs of a store written before the index existed (once)."""
        batch = WriteBatch(raw_mode=True)
        for key, value in self._scan(b"r"):
            last = self._db.get(b"e" + key[1:] + b"\0" + bytes(value)[:8])
            if last is None or self._event_type(bytes(last)) not in TERMINAL_EVENTS:
                batch.put(b"o" + key[1:], b"")
        batch.put(_OPEN_INDEX_KEY, b"")
        self._db.write(batch, self._write_options)

    def _open_run_index(self, *, read_only: bool) -> None:
        """Keep the run index; build it first for a store written before it existed."""
        if self._db.get(BUILT_KEY) is not None:
            self._run_table = RunTable(_Reads(self), lock=self._lock)
        elif read_only:
            self._run_table = build_run_table(self, MemoryKeyValues())
        else:
            self._db.delete_range(PREFIX, bytes([PREFIX[0] + 1]))  # what a cut-off build left
            self._run_table = RunTable(_Reads(self), lock=self._lock)

            def write(changes: list[Change]) -> None:
                batch = WriteBatch(raw_mode=True)
                write_changes(batch, changes)
                self._db.write(batch, self._write_options)

            self._run_table.build(self._states_for_index(), write)
            for stale in STALE_BUILT_KEYS:
                self._db.delete(stale, self._write_options)
            self._db.put(BUILT_KEY, b"1", self._write_options)

    def _event_type(self, raw: bytes) -> str:
        """The type of one stored event, read without validating it."""
        try:
            kind = orjson.loads(raw)["event"]["type"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return ""
        return str(kind)

    def due_wakeups(self, now: datetime) -> list[Wakeup]:
        with self._lock:
            end = b"w" + _micros(now) + b"\xff"
            return [_parse_wakeup(key) for key, _ in self._scan(b"w", end)]

    def next_wakeup(self) -> Wakeup | None:
        """The earliest wakeup; remembered until a write changes the index (hosts ask often)."""
        with self._lock:
            if self._earliest is _UNKNOWN:
                self._earliest = next((_parse_wakeup(key) for key, _ in self._scan(b"w")), None)
            assert not isinstance(self._earliest, _Unknown)
            return self._earliest

    def _forget_earliest(self) -> None:
        """The wakeup index changed: read the earliest wakeup again when asked."""
        self._earliest = _UNKNOWN

    def _load(self, run_id: str) -> list[EventEnvelope] | None:
        run_key = run_id.encode()
        if run_id in self._pending_runs:
            self._write_pending()
        if self._db.get(b"r" + run_key) is None:  # a point lookup is cheaper than a scan
            return None
        prefix = b"e" + run_key + b"\0"
        history: list[EventEnvelope] = []
        for _, value in self._range(prefix):
            history.append(self._decode(run_id, value))
        return history or None

    def histories(self) -> Iterator[tuple[str, list[EventEnvelope]]]:
        """Every run's history, by run id, read from disk one run at a time (nothing is cached:
        an audit of the whole store holds one history in memory)."""
        run_key: bytes | None = None
        history: list[EventEnvelope] = []
        for key, value in self._scan(b"e"):
            this = key[1:-9]  # e<run_id>\0<seq:8 BE>
            if this != run_key:
                if run_key is not None:
                    yield run_key.decode(), history
                run_key, history = this, []
            history.append(self._decode(this.decode(), value))
        if run_key is not None:
            yield run_key.decode(), history

    def _decode(self, run_id: str, raw: bytes) -> EventEnvelope:
        try:
            return EventEnvelope.model_validate_json(raw)
        except ValueError as exc:
            raise SerializationError(
                f"run {run_id}: a stored event does not decode: {exc}"
            ) from exc

    def _hook_owner(self, token_digest: str) -> tuple[str, str] | None:
        self._write_pending()
        raw = self._db.get(b"h" + token_digest.encode())
        if raw is None:
            return None
        run_id, hook_id = bytes(raw).decode().split("\0", 1)
        return run_id, hook_id

    # -- writes --------------------------------------------------------------------------------

    def _persist(
        self,
        run_id: str,
        envelopes: list[EventEnvelope],
        encoded: list[bytes],
        changes: IndexChanges,
    ) -> None:
        if self._sync_each:
            batch = WriteBatch(raw_mode=True)
            put_append(batch, run_id, envelopes, encoded, changes)
            self._db.write(batch, self._write_options)
        else:
            # Group commit: the appends that will share an fsync share one write as well; it
            # happens before the fsync, or before any read of the database.
            if self._pending is None:
                self._pending = WriteBatch(raw_mode=True)
            put_append(self._pending, run_id, envelopes, encoded, changes)
            self._pending_runs.add(run_id)
        if changes.added_wakeups or changes.removed_wakeups:
            self._forget_earliest()
        self._written += 1
        if self._sync_each:
            self._synced = self._written

    def _stage_put(self, key: bytes, value: bytes) -> None:
        """Add one key to the next group-commit write (written with the appends staged with it)."""
        with self._lock:
            if self._pending is None:
                self._pending = WriteBatch(raw_mode=True)
            self._pending.put(key, value)

    def _write_pending(self) -> None:
        """Write the appends held for the next group commit (not yet fsynced). Under the
        store's lock: another thread may be appending to the batch."""
        if self._pending is None:
            return
        with self._lock:
            pending, self._pending = self._pending, None
            if pending is None:
                return
            self._pending_runs.clear()
            try:
                if self._run_table is not None:
                    write_changes(pending, self._run_table.take())
                self._db.write(pending, self._write_options)
            except BaseException:
                # The cached projections are ahead of the disk: read every run from it again.
                self._states.clear()
                self._forget_earliest()
                if self._run_table is not None:
                    self._run_table.reload()
                raise

    async def wait_durable(self) -> None:
        """Group commit: one fsync of the write-ahead log covers every append made before it.

        The caller first yields once, so every task that is ready to run appends before the
        fsync and shares it; the fsync then runs on the loop thread. (Handing it to a thread
        costs more than the fsync on a fast disk: a wake-up each way and a fight for the GIL.)
        """
        if self._synced >= self._written:
            return
        target = self._written
        await asyncio.sleep(0)
        if self._synced < target and not self._closed:
            covered = self._written
            self._write_pending()
            self._db.flush_wal(True)
            self._synced = max(self._synced, covered)

    def _remember(self, run_id: str, state: RunState) -> None:
        """Keep ``state`` as the newest of the cached projections (the oldest leaves when the
        cache holds ``cache_runs``)."""
        states = self._states
        states.pop(run_id, None)
        if len(states) >= self._cache_runs:
            states.pop(next(iter(states)))
        states[run_id] = state

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._states.clear()
                if self._synced < self._written:
                    self._write_pending()
                    self._db.flush_wal(True)
                self._db.close()

    def __enter__(self) -> RocksDBEventStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
