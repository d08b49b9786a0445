"""``RunTable``: the run index as keys of an ordered key-value store, kept and queried.

The store that keeps it (RocksDB, or a dict for the memory store) writes the table's changes in
the same atomic write as the events they follow, so the index never disagrees with the
histories. Keys (raw bytes, all under ``v`` but the row's)::

    r<run_id>                                   the run's last sequence (8 bytes, big-endian)
                                                and its row (a JSON array, ``_ROW_FIELDS``)
    vw<len:2><workflow><status>\\0<newest><run_id>  by workflow and status, by update time
    vn<workflow>                                a workflow that has runs (written with its first)
    vp<run_id>                                  the run's open suspensions (JSON), while it has any
    vc                                          counters: runs by status, open suspensions by kind
                                                (a JSON array, ``_COUNTER_NAMES``)

``<newest>`` is 8 big-endian bytes that grow as the update time falls, so a forward scan meets
the most recently updated run first; its bytes and the run id after them form the *sort key*
that pages carry as their cursor. A query scans one key range per (workflow, status) pair it
asks for (a query without a workflow filter asks for every workflow the ``vn`` keys name, one
short scan; without a status filter, for every status) and merges them by sort key: a page
costs its rows and those ranges, never the number of runs. The counters are absolute values,
rewritten by each change that moves them (the writer holds them in memory), so ``counts`` is
one read.

Every append rewrites its run's row and moves its one ``vw`` key to the new update time in the
same write as its events, so the table's keys are most of what an append writes: the row rides
in the key the RocksDB store writes for every append anyway (``r<run_id>``, the run's last
sequence; the table writes it whole, the sequence first), so an append writes two keys of the
index's own (the old ``vw`` key deleted, the new one put); rows and counters are arrays without
field names, and no key lists every run (the ``vw`` keys together do). A store whose table was
written in another layout (``STALE_BUILT_KEYS``) has it built again on open.
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
    RunPage,
    RunQuery,
    RunRow,
    last_error,
    micros,
    open_items,
    waiting_for,
)
from flowstream.model.snapshot import RunStatus
from flowstream.replay.state import RunState

__all__ = [
    "BUILT_KEY",
    "STALE_BUILT_KEYS",
    "SUSPENSION_COUNTERS",
    "Change",
    "Held",
    "KeyValues",
    "MemoryKeyValues",
    "RunTable",
    "Writes",
    "write_changes",
]

#: Marks a store whose run index is built in this layout (a store written before it existed, or
#: in another layout, gets it built on open).
BUILT_KEY = b"m/run_index/4"
#: The marks of earlier layouts, deleted when the table is built again: the first had JSON
#: objects for rows and counters and a key per run by update time; the second a key per run by
#: status (``vs<status>\0<newest><run_id>``) beside the one by workflow; the third the row in a
#: key of its own (``vr<run_id>``).
STALE_BUILT_KEYS = (b"m/run_index", b"m/run_index/2", b"m/run_index/3")
PREFIX = b"v"
#: The run's row follows its last sequence in the store's key of the run.
_ROW = b"r"
_BY_WORKFLOW = b"vw"
_WORKFLOW = b"vn"
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
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: Runs whose last written entries the table keeps (the store's projection cache holds as many).
_HELD_RUNS = 2_000
_NEWEST = (1 << 64) - 1
#: A change to one key: the new value, or ``None`` to delete it.
Change = tuple[bytes, bytes | None]
#: What the table wrote for a run, which its next change starts from: the run's public status,
#: its update time in microseconds, its open suspensions, its ``vw`` key, its creation time in
#: microseconds, that key's prefix (workflow and status), the run id's bytes, its ``r`` key,
#: its workflow and its runtime build (a plain tuple, made on every append: the next append
#: reuses the keys, and the fields the row repeats, instead of working them out again).
Held = tuple[RunStatus, int, tuple[OpenItem, ...], bytes, int, bytes, bytes, bytes, str, str | None]


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


def _held_of(state: RunState) -> Held:
    """What the table wrote for ``state`` (a run it no longer holds: the store read it back)."""
    status = state.public_status()
    created = micros(state.created_at)
    updated = created if state.updated_at is None else micros(state.updated_at)
    spec = state.spec
    prefix = _workflow_prefix(spec.name, status)
    run_key = state.run_id.encode()
    key = prefix + (_NEWEST - updated).to_bytes(8, "big") + run_key
    return (
        status,
        updated,
        open_items(state),
        key,
        created,
        prefix,
        run_key,
        _ROW + run_key,
        spec.name,
        spec.runtime_build_id,
    )


# -- the table ----------------------------------------------------------------------------------


class RunTable:
    """Keeps the run index in ``reader``'s store and answers ``RunIndex`` queries from it.

    The writer asks ``held_facts`` before an append advances the run's state, then calls
    ``change`` with them and the advanced state, and writes what it returns in the append's
    atomic write; the counters it holds follow each change, so after a failed write it calls
    ``reload``.

    A writer that groups appends into one write *stages* them instead: ``stage`` after each
    append (with ``held_facts`` taken before the first append of the group advanced the run's
    state), then ``take`` once, into the group's write. A run appended to several times in one
    group gets its keys and the counters written once, from its newest state. Staged runs hold
    their state object, which the appends advance in place: after an append that failed
    half-way, ``restage`` the state the store still holds.
    """

    def __init__(
        self, reader: KeyValues, *, lock: AbstractContextManager[object] | None = None
    ) -> None:
        self._reader = reader
        self._lock: AbstractContextManager[object] = lock if lock is not None else nullcontext()
        self._counters = self._read_counters()
        #: Whether the counters moved since the store last got them (most appends move no run
        #: to another status and open or close nothing: they leave the counters' key alone).
        self._moved = False
        #: The workflows the store has a ``vn`` key for.
        self._workflows = set(self._read_workflows())
        #: Staged runs: what the store holds for each (``None``: new), and its state now.
        self._staged: dict[str, tuple[Held | None, RunState]] = {}
        #: What was last written for the runs last changed (``held_facts`` need not derive it
        #: again from the run's state), the oldest first.
        self._held: OrderedDict[str, Held] = OrderedDict()

    def _read_counters(self) -> dict[str, int]:
        counters = _empty_counters()
        raw = self._reader.get(_COUNTERS)
        if raw is not None:
            counters.update(zip(_COUNTER_NAMES, orjson.loads(raw), strict=True))
        return counters

    def _read_workflows(self) -> list[str]:
        found = []
        for key, _ in self._reader.scan(_WORKFLOW):
            if not key.startswith(_WORKFLOW):
                break
            found.append(key[len(_WORKFLOW) :].decode())
        return found

    def reload(self) -> None:
        """Read the counters from the store again (a write the table counted failed)."""
        with self._lock:
            self._staged.clear()
            self._held.clear()
            self._counters = self._read_counters()
            self._moved = False
            self._workflows = set(self._read_workflows())

    # -- keeping it -----------------------------------------------------------------------

    def change(self, before: Held | None, state: RunState) -> list[Change]:
        """The key changes that bring the run's entries from ``before`` (``held_facts``, taken
        before the append; ``None`` for a new run) to ``state``, with the counters if they
        moved."""
        found = self._changes(before, state)
        if len(self._held) > _HELD_RUNS:
            self._held.popitem(last=False)
        if self._moved:
            self._moved = False
            found.append((_COUNTERS, _counters_value(self._counters)))
        return found

    def _changes(self, before: Held | None, state: RunState) -> list[Change]:
        # Every append comes here. The common one (a run the table holds, nothing open, its
        # status kept) reuses what the table holds and works out the update time and the row.
        if (
            state.open_waits
            or state.delayed_steps
            or state.active_hooks
            or state.waiting_signal_waits
            or state.open_children
        ):
            status = state.public_status()
            items = open_items(state)
        else:  # most appends: nothing is open, so the public status is the run's
            status = state.status
            items = ()
        moment = state.updated_at
        found: list[Change]
        if before is None:
            run_key = state.run_id.encode()
            row_key = _ROW + run_key
            spec = state.spec
            workflow = spec.name
            build = spec.runtime_build_id
            created = micros(state.created_at)
            updated = created if moment is None or moment is state.created_at else micros(moment)
            prefix = _workflow_prefix(workflow, status)
            key = prefix + (_NEWEST - updated).to_bytes(8, "big") + run_key
            found = [(key, b"")]
            if workflow not in self._workflows:
                self._workflows.add(workflow)
                found.append((_WORKFLOW + workflow.encode(), b""))
        else:
            was, was_updated, was_items, key, created, prefix, run_key, row_key, workflow, build = (
                before
            )
            if moment is None or moment is state.created_at:
                updated = created
            else:  # ``micros``, inline
                since = moment - _EPOCH
                updated = (since.days * 86_400 + since.seconds) * 1_000_000 + since.microseconds
            if status is not was:  # the key moves to the new status (and update time)
                prefix = _workflow_prefix(workflow, status)
                moved = key
                key = prefix + (_NEWEST - updated).to_bytes(8, "big") + run_key
                found = [(moved, None), (key, b"")]
            elif was_updated != updated:  # the key moves to the new update time
                moved = key
                key = prefix + (_NEWEST - updated).to_bytes(8, "big") + run_key
                found = [(moved, None), (key, b"")]
            else:
                found = []
        # The row, as stored: the values of ``row_fields`` after the run id, its times in
        # microseconds, made straight into the array that is written (``row_fields`` is the
        # one definition of a row; the tests check that the two agree for every run indexed).
        parent = state.parent
        outcome = state.outcome
        sequence = state.last_sequence
        row = orjson.dumps(
            [
                workflow,
                status,
                build,
                created,
                updated,
                waiting_for(state),
                last_error(state),
                None if parent is None else parent.run_id,
                None if outcome is None else outcome.successor_run_id,
                sequence,
            ]
        )
        found.append((row_key, sequence.to_bytes(8, "big") + row))
        if before is None:
            if items:  # a new run has no key of open suspensions to delete
                found.append((_OPEN + run_key, _items_value(items)))
            self._count(status, items, 1)
        elif was_items != items:
            found.append((_OPEN + run_key, _items_value(items) if items else None))
            self._count(was, was_items, -1)
            self._count(status, items, 1)
        elif status is not was:
            counters = self._counters
            counters[was] -= 1  # a status counts under its value, which it equals
            counters[status] += 1
            self._moved = True
        held = self._held
        run_id = state.run_id
        held[run_id] = (
            status,
            updated,
            items,
            key,
            created,
            prefix,
            run_key,
            row_key,
            workflow,
            build,
        )
        held.move_to_end(run_id)
        return found

    def staged(self, run_id: str) -> bool:
        """Whether an append to ``run_id`` is staged and not yet taken."""
        return run_id in self._staged

    def held_facts(self, run_id: str, state: RunState | None) -> Held | None:
        """What ``change`` or ``stage`` needs of a run before an append advances ``state``
        (the store's): what the table wrote for it, or ``None`` for a new run or one already
        staged (its first entries count)."""
        if state is None or run_id in self._staged:
            return None
        held = self._held.get(run_id)
        return _held_of(state) if held is None else held

    def stage(self, run_id: str, before: Held | None, state: RunState) -> None:
        """An append to ``run_id`` joins the group; ``before`` (``held_facts``, ``None`` for a
        new run) counts only for its first append in the group."""
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
        if self._moved:
            self._moved = False
            found.append((_COUNTERS, _counters_value(self._counters)))
        return found

    def _count(self, status: RunStatus, items: tuple[OpenItem, ...], sign: int) -> None:
        counters = self._counters
        counters[status] += sign
        for item in items:
            counters[SUSPENSION_COUNTERS[item.kind]] += sign
        self._moved = True

    def build(self, states: Iterable[RunState], write: Callable[[list[Change]], None]) -> int:
        """Index every run of ``states`` from nothing (the table must be empty); hands the
        changes to ``write`` in chunks, the counters with the last. Returns the runs indexed."""
        self._counters = _empty_counters()
        self._workflows = set()
        self._held.clear()
        pending: list[Change] = []
        runs = 0
        for state in states:
            pending.extend(self._changes(None, state))
            runs += 1
            if len(pending) >= 20_000:
                write(pending)
                pending = []
            if len(self._held) > _HELD_RUNS:
                self._held.popitem(last=False)
        pending.append((_COUNTERS, _counters_value(self._counters)))
        write(pending)
        self._moved = False
        return runs

    # -- reading it -----------------------------------------------------------------------

    def get(self, run_id: str) -> RunRow | None:
        with self._lock:
            raw = self._reader.get(_ROW + run_id.encode())
        # (Only a sequence: a run whose history does not validate is left out of the index.)
        return None if raw is None or len(raw) <= 8 else _row_of(run_id, raw[8:])

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
        statuses = _STATUSES if query.status is None else sorted(s.value for s in query.status)
        with self._lock:
            workflows = self._read_workflows() if query.workflow is None else sorted(query.workflow)
            streams = [
                self._stream(_workflow_prefix(workflow, status), start, stop)
                for workflow in workflows
                for status in statuses
            ]
            sort_keys: list[bytes] = []
            for sort_key in heapq.merge(*streams):
                sort_keys.append(sort_key)
                if len(sort_keys) > query.limit:
                    break
            more = len(sort_keys) > query.limit
            del sort_keys[query.limit :]
            raws = [self._reader.get(_ROW + key[8:]) for key in sort_keys]
        rows = tuple(
            _row_of(key[8:].decode(), raw[8:])
            for key, raw in zip(sort_keys, raws, strict=True)
            if raw is not None and len(raw) > 8
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
