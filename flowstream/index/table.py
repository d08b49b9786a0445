"""``RunTable``: the run index as keys of an ordered key-value store, kept and queried.

The store that keeps it (RocksDB, or a dict for the memory store) writes the table's changes in
the same atomic write as the events they follow, so the index never disagrees with the
histories. Keys (raw bytes, all under ``v``)::

    vr<run_id>                                  the run's row (a JSON array, ``_ROW_FIELDS``)
    vs<status>\\0<newest><run_id>                by status, by update time
    vw<len:2><workflow><status>\\0<newest><run_id>  by workflow and status, by update time
    vp<run_id>                                  the run's open suspensions (JSON), while it has any
    vc                                          counters: runs by status, open suspensions by kind
                                                (a JSON array, ``_COUNTER_NAMES``)

``<newest>`` is 8 big-endian bytes that grow as the update time falls, so a forward scan meets
the most recently updated run first; its bytes and the run id after them form the *sort key*
that pages carry as their cursor. A query scans one key range per (workflow, status) pair it
asks for (every status, for a query that filters nothing) and merges them by sort key: a page
costs its rows, never the number of runs. The counters are absolute values, rewritten by each
change that moves them (the writer holds them in memory), so ``counts`` is one read.

Every append rewrites its run's row and moves its keys to the new update time in the same write
as its events, so the table's bytes are most of what an append writes: rows and counters are
arrays without field names, and no key lists every run (the statuses' keys together do). A store
whose table was written in another layout (``STALE_BUILT_KEYS``) has it built again on open.
"""

from __future__ import annotations

import base64
import binascii
import functools
import heapq
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, nullcontext
from datetime import UTC, datetime, timedelta
from typing import Protocol

import orjson

from flowstream.errors import FlowError
from flowstream.index.rows import (
    ROW_FIELDS,
    OpenItem,
    RunFacts,
    RunPage,
    RunQuery,
    RunRow,
    facts_of,
    micros,
    row_fields,
)
from flowstream.model.snapshot import RunStatus
from flowstream.replay.state import RunState

__all__ = [
    "BUILT_KEY",
    "STALE_BUILT_KEYS",
    "SUSPENSION_COUNTERS",
    "Change",
    "KeyValues",
    "MemoryKeyValues",
    "RunTable",
    "Writes",
    "write_changes",
]

#: Marks a store whose run index is built in this layout (a store written before it existed, or
#: in another layout, gets it built on open).
BUILT_KEY = b"m/run_index/2"
#: The marks of earlier layouts (the first had JSON objects for rows and counters, and a key per
#: run by update time), deleted when the table is built again.
STALE_BUILT_KEYS = (b"m/run_index",)
PREFIX = b"v"
_ROW = b"vr"
_BY_STATUS = b"vs"
_BY_WORKFLOW = b"vw"
_OPEN = b"vp"
_COUNTERS = b"vc"

#: The summary's counter of each kind of open suspension.
SUSPENSION_COUNTERS = {
    "wait": "open_waits",
    "hook": "active_hooks",
    "retry": "pending_retries",
    "child": "open_children",
    "signal": "open_signal_waits",
}
_STATUSES = tuple(status.value for status in RunStatus)
#: The counters' order in their stored array.
_COUNTER_NAMES = (*_STATUSES, *SUSPENSION_COUNTERS.values())
#: The row's fields in its stored array (the run id is the key's).
_ROW_FIELDS = ROW_FIELDS[1:]
_CREATED = ROW_FIELDS.index("created_at")
_UPDATED = ROW_FIELDS.index("updated_at")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: Runs whose last written facts the table keeps (the store's projection cache holds as many).
_HELD_RUNS = 2_000
_NEWEST = (1 << 64) - 1
#: A change to one key: the new value, or ``None`` to delete it.
Change = tuple[bytes, bytes | None]


class KeyValues(Protocol):
    """Ordered reads of the store that holds the table."""

    def get(self, key: bytes) -> bytes | None: ...

    def scan(self, start: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Every key at or after ``start``, in order, with its value (the caller stops)."""
        ...


class Writes(Protocol):
    """An atomic write the table's changes join."""

    def put(self, key: bytes, value: bytes) -> None: ...

    def delete(self, key: bytes) -> None: ...


class MemoryKeyValues:
    """A dict, with its keys sorted again when a scan follows a change (the memory store's)."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self._keys: list[bytes] | None = []

    def get(self, key: bytes) -> bytes | None:
        return self.data.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        if key not in self.data:
            self._keys = None
        self.data[key] = value

    def delete(self, key: bytes) -> None:
        if self.data.pop(key, None) is not None:
            self._keys = None

    def scan(self, start: bytes) -> Iterator[tuple[bytes, bytes]]:
        if self._keys is None:
            self._keys = sorted(self.data)
        keys = self._keys
        lo, hi = 0, len(keys)
        while lo < hi:
            mid = (lo + hi) // 2
            if keys[mid] < start:
                lo = mid + 1
            else:
                hi = mid
        for key in keys[lo:]:
            value = self.data.get(key)
            if value is not None:
                yield key, value


# -- keys ---------------------------------------------------------------------------------------


def _newest(moment: datetime) -> bytes:
    return (_NEWEST - micros(moment)).to_bytes(8, "big")


@functools.lru_cache(maxsize=4096)
def _workflow_prefix(workflow: str, status: str) -> bytes:
    """(``status``: a ``RunStatus`` or its value, which hash alike.)"""
    name = workflow.encode()
    return _BY_WORKFLOW + len(name).to_bytes(2, "big") + name + str(status).encode() + b"\0"


_STATUS_PREFIX = {status: _BY_STATUS + status.value.encode() + b"\0" for status in RunStatus}


def _secondary(run_key: bytes, workflow: str, facts: RunFacts) -> tuple[bytes, bytes]:
    sort_key = (_NEWEST - facts.micros).to_bytes(8, "big") + run_key
    status = facts.status
    return (
        _STATUS_PREFIX[status] + sort_key,
        _workflow_prefix(workflow, status) + sort_key,
    )


def _row_value(state: RunState, facts: RunFacts) -> bytes:
    """The run's row (``row_fields``) as stored: ``_ROW_FIELDS``' values, times in
    microseconds."""
    values = list(row_fields(state))
    values[_CREATED] = micros(values[_CREATED])
    values[_UPDATED] = facts.micros
    return orjson.dumps(values[1:])


def _row_of(run_id: str, raw: bytes) -> RunRow:
    values = dict(zip(_ROW_FIELDS, orjson.loads(raw), strict=True))
    values["created_at"] = _EPOCH + timedelta(microseconds=values["created_at"])
    values["updated_at"] = _EPOCH + timedelta(microseconds=values["updated_at"])
    return RunRow(run_id=run_id, **values)


def _items_value(items: tuple[OpenItem, ...]) -> bytes:
    return orjson.dumps(
        [[i.kind, i.subject_id, None if i.due is None else i.due.isoformat()] for i in items]
    )


def _items_of(raw: bytes) -> tuple[OpenItem, ...]:
    return tuple(
        OpenItem(kind, subject, None if due is None else datetime.fromisoformat(due))
        for kind, subject, due in orjson.loads(raw)
    )


def encode_cursor(sort_key: bytes) -> str:
    return base64.urlsafe_b64encode(sort_key).decode().rstrip("=")


def decode_cursor(cursor: str) -> bytes:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) < 9:
        raise FlowError(f"invalid cursor {cursor!r}: pass a page's next_cursor unchanged")
    return raw


def write_changes(writes: Writes, changes: Iterable[Change]) -> None:
    """Add the table's key changes to an atomic write."""
    for key, value in changes:
        if value is None:
            writes.delete(key)
        else:
            writes.put(key, value)


def _empty_counters() -> dict[str, int]:
    return dict.fromkeys(_COUNTER_NAMES, 0)


def _counters_value(counters: dict[str, int]) -> bytes:
    return orjson.dumps([counters[name] for name in _COUNTER_NAMES])


# -- the table ----------------------------------------------------------------------------------


class RunTable:
    """Keeps the run index in ``reader``'s store and answers ``RunIndex`` queries from it.

    The writer calls ``change`` for each append (with the run's facts before it, ``None`` for
    a new run) and writes what it returns in the append's atomic write; the counters it holds
    follow each change, so after a failed write it calls ``reload``.

    A writer that groups appends into one write *stages* them instead: ``stage`` after each
    append (with the facts the store holds for the run, taken before the first append of the
    group advanced its state), then ``take`` once, into the group's write. A run appended to
    several times in one group gets its keys and the counters written once, from its newest
    state. Staged runs hold their state object, which the appends advance in place: after an
    append that failed half-way, ``restage`` the state the store still holds.
    """

    def __init__(
        self, reader: KeyValues, *, lock: AbstractContextManager[object] | None = None
    ) -> None:
        self._reader = reader
        self._lock: AbstractContextManager[object] = lock if lock is not None else nullcontext()
        self._counters = self._read_counters()
        #: The counters as the store holds them: a change that leaves them so writes none.
        self._stored = dict(self._counters)
        #: Staged runs: the facts the store holds for each (``None``: new), and its state now.
        self._staged: dict[str, tuple[RunFacts | None, RunState]] = {}
        #: The facts last written for the runs last changed (``held_facts`` need not derive
        #: them again from the run's state), the oldest first.
        self._held: OrderedDict[str, RunFacts] = OrderedDict()

    def _read_counters(self) -> dict[str, int]:
        counters = _empty_counters()
        raw = self._reader.get(_COUNTERS)
        if raw is not None:
            counters.update(zip(_COUNTER_NAMES, orjson.loads(raw), strict=True))
        return counters

    def reload(self) -> None:
        """Read the counters from the store again (a write the table counted failed)."""
        with self._lock:
            self._staged.clear()
            self._held.clear()
            self._counters = self._read_counters()
            self._stored = dict(self._counters)

    # -- keeping it -----------------------------------------------------------------------

    def change(self, before: RunFacts | None, state: RunState) -> list[Change]:
        """The key changes that bring the run's entries from ``before`` to ``state``."""
        found = self._changes(before, state)
        found.extend(self._counter_change())
        return found

    def _counter_change(self) -> list[Change]:
        """The counters' key, when they differ from what the store holds (most appends move no
        run to another status and open or close nothing: in a write of its own, as with
        ``sync="always"``, the counters were a quarter of the index's bytes)."""
        if self._counters == self._stored:
            return []
        self._stored = dict(self._counters)
        return [(_COUNTERS, _counters_value(self._counters))]

    def _changes(self, before: RunFacts | None, state: RunState) -> list[Change]:
        after = facts_of(state)
        run_key = state.run_id.encode()
        found: list[Change] = []
        if before is None or before.micros != after.micros or before.status is not after.status:
            workflow = state.spec.name
            if before is not None:  # every key moves: its update time or its status changed
                for key in _secondary(run_key, workflow, before):
                    found.append((key, None))
            for key in _secondary(run_key, workflow, after):
                found.append((key, b""))
        found.append((_ROW + run_key, _row_value(state, after)))
        if before is None or before.items != after.items:
            found.append((_OPEN + run_key, _items_value(after.items) if after.items else None))
            self._count(before, -1)
            self._count(after, 1)
        elif before.status is not after.status:
            counters = self._counters
            counters[before.status] -= 1  # a status counts under its value, which it equals
            counters[after.status] += 1
        self._held[state.run_id] = after
        self._held.move_to_end(state.run_id)
        return found

    def staged(self, run_id: str) -> bool:
        """Whether an append to ``run_id`` is staged and not yet taken."""
        return run_id in self._staged

    def held_facts(self, run_id: str, state: RunState | None) -> RunFacts | None:
        """What ``stage`` needs of a run before an append advances ``state`` (the store's):
        its facts, or ``None`` for a new run or one already staged (its first facts count)."""
        if state is None or run_id in self._staged:
            return None
        held = self._held.get(run_id)
        return facts_of(state) if held is None else held

    def stage(self, run_id: str, before: RunFacts | None, state: RunState) -> None:
        """An append to ``run_id`` joins the group; ``before`` (the facts the store holds for
        the run, ``None`` for a new run) counts only for its first append in the group."""
        held = self._staged.get(run_id)
        self._staged[run_id] = (before if held is None else held[0], state)

    def restage(self, run_id: str, state: RunState | None) -> None:
        """An append to a staged run failed after it advanced the run's state: ``state`` is
        the one the store still holds (``None``: the run is new and holds nothing)."""
        held = self._staged.pop(run_id, None)
        if held is not None and state is not None:
            self._staged[run_id] = (held[0], state)

    def take(self) -> list[Change]:
        """The key changes of every staged run and the counters after them, if they moved (none
        when nothing is staged); the group is empty again."""
        if not self._staged:
            return []
        staged, self._staged = self._staged, {}
        found: list[Change] = []
        for before, state in staged.values():
            found.extend(self._changes(before, state))
        held = self._held
        while len(held) > _HELD_RUNS:
            held.popitem(last=False)
        found.extend(self._counter_change())
        return found

    def _count(self, facts: RunFacts | None, sign: int) -> None:
        if facts is None:
            return
        counters = self._counters
        counters[facts.status] += sign
        for item in facts.items:
            counters[SUSPENSION_COUNTERS[item.kind]] += sign

    def build(self, states: Iterable[RunState], write: Callable[[list[Change]], None]) -> int:
        """Index every run of ``states`` from nothing (the table must be empty); hands the
        changes to ``write`` in chunks, the counters with the last. Returns the runs indexed."""
        self._counters = _empty_counters()
        self._held.clear()
        pending: list[Change] = []
        runs = 0
        for state in states:
            pending.extend(self._changes(None, state))
            runs += 1
            if len(pending) >= 20_000:
                write(pending)
                pending = []
        pending.append((_COUNTERS, _counters_value(self._counters)))
        write(pending)
        self._stored = dict(self._counters)
        return runs

    # -- reading it -----------------------------------------------------------------------

    def get(self, run_id: str) -> RunRow | None:
        with self._lock:
            raw = self._reader.get(_ROW + run_id.encode())
        return None if raw is None else _row_of(run_id, raw)

    def counts(self) -> dict[str, int]:
        totals = self.totals()
        return {status: totals[status] for status in _STATUSES}

    def totals(self) -> dict[str, int]:
        """Runs by status and open suspensions by counter name (``SUSPENSION_COUNTERS``)."""
        with self._lock:
            return self._read_counters()

    def open_items(self, run_id: str) -> tuple[OpenItem, ...]:
        """The open suspensions of one run (none for an ended or unknown run)."""
        with self._lock:
            raw = self._reader.get(_OPEN + run_id.encode())
        return () if raw is None else _items_of(raw)

    def runs_with_open_items(self) -> Iterator[tuple[str, tuple[OpenItem, ...]]]:
        """Every run that has open suspensions, by run id, with them."""
        after = _OPEN
        while True:
            with self._lock:
                chunk = []
                for key, value in self._reader.scan(after):
                    if not key.startswith(_OPEN):
                        break
                    chunk.append((key, value))
                    if len(chunk) >= 1000:
                        break
            for key, value in chunk:
                yield key[len(_OPEN) :].decode(), _items_of(value)
            if len(chunk) < 1000:
                return
            after = chunk[-1][0] + b"\0"

    def query(self, query: RunQuery) -> RunPage:
        """One page of the runs ``query`` selects, most recently updated first."""
        start = b""
        if query.updated_before is not None:
            start = (int.from_bytes(_newest(query.updated_before), "big") + 1).to_bytes(8, "big")
        if query.cursor is not None:
            start = max(start, decode_cursor(query.cursor) + b"\0")
        stop = None if query.updated_after is None else _newest(query.updated_after)
        with self._lock:
            streams = [self._stream(prefix, start, stop) for prefix in _prefixes(query)]
            sort_keys: list[bytes] = []
            for sort_key in heapq.merge(*streams):
                sort_keys.append(sort_key)
                if len(sort_keys) > query.limit:
                    break
            more = len(sort_keys) > query.limit
            del sort_keys[query.limit :]
            raws = [self._reader.get(_ROW + key[8:]) for key in sort_keys]
        rows = tuple(
            _row_of(key[8:].decode(), raw)
            for key, raw in zip(sort_keys, raws, strict=True)
            if raw is not None
        )
        cursor = encode_cursor(sort_keys[-1]) if more else None
        return RunPage(rows=rows, next_cursor=cursor)

    def _stream(self, prefix: bytes, start: bytes, stop: bytes | None) -> Iterator[bytes]:
        for key, _ in self._reader.scan(prefix + start):
            if not key.startswith(prefix):
                return
            sort_key = key[len(prefix) :]
            if stop is not None and sort_key[:8] > stop:
                return
            yield sort_key


def _prefixes(query: RunQuery) -> list[bytes]:
    statuses = sorted(query.status) if query.status is not None else None
    if query.workflow is None:
        if statuses is None:
            return list(_STATUS_PREFIX.values())
        return [_BY_STATUS + s.value.encode() + b"\0" for s in statuses]
    return [
        _workflow_prefix(workflow, status)
        for workflow in sorted(query.workflow)
        for status in (_STATUSES if statuses is None else [s.value for s in statuses])
    ]
