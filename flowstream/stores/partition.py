"""``PartitionStore``: the RocksDB state of one owned partition, a cache of its events partition.

The owner is the sequence authority for every run of the partition: ``append_if_sequence`` is
checked against this state. Appends are *staged*: the envelopes go to the open Kafka transaction
(through ``sink``) and into a pending ``WriteBatch``; RocksDB is written only after the
transaction commits, in one batch with the events offset it reflects (``commit_local``). An abort
throws the staged batch and every cached run it touched away (``discard``).

Extra keys beside the ``RocksDBEventStore`` layout:

``m/events_offset``               next events-topic offset to restore from (8 BE)
``m/positions``                   the command positions recorded up to it (a ``positions``
                                   record's value, ``wire.positions_value``)
``x<run_id>``                      the run has a step started but not settled
``i<run_id>\\0<inbox id>``         a command parked until its run exists or its build is served
``c``, ``n``, ``t<token digest>…``   hook-token claims of this partition's keyspace (``tokens``)
``u<run_id>``                      restored events of a live run whose wakeups and running-step
                                   entries are not built yet (``finish_restore`` builds them)
``d<run_id>``                      a restored run found waiting on nothing (only a decision moves
                                   it): ``finish_restore`` gathers them in ``to_drive`` at its end
``o<run_id>``                      the run is not terminal (the open-runs index, as embedded)
``q<run_id>``                      the run is quarantined: its history cannot be read completely
                                   (the value says why); it is never advanced
``m/status/<status>``              how many runs are in that status (``statuses``)

Restore is the one path that takes events without building them: records on the events topic
were validated by the processor that wrote them, so ``restore_event`` reads only the run id,
sequence and event type from the bytes (``codec.event_head``), checks the run's sequence and
lifecycle (created first, contiguous, nothing after a terminal event), and stores the bytes.
The indexes that need a projection are built once per unfinished run at the end
(``finish_restore``). A run's history is still fully decoded and validated whenever it is read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import TypeVar

from rocksdict import WriteBatch

from flowstream import codec, wire
from flowstream.errors import FlowError, InvalidTransitionError, PayloadTooLargeError
from flowstream.model.events import EventEnvelope, HookCreated
from flowstream.replay.decide import is_suspended
from flowstream.replay.state import RunState
from flowstream.stores.base import MAX_EVENT_BYTES, Clock, IndexChanges, utc_now
from flowstream.stores.quarantine import Quarantine
from flowstream.stores.restoring import Restored, Restoring, has_running_step
from flowstream.stores.rocksdb import (
    TERMINAL_EVENTS,
    RocksDBEventStore,
    put_append,
)
from flowstream.stores.statuses import PROVISIONAL, TERMINAL_STATUS, StatusIndex
from flowstream.stores.tokens import Owner, TokenIndex

__all__ = ["PartitionStore"]

_OFFSET_KEY = b"m/events_offset"
_POSITIONS_KEY = b"m/positions"

K = TypeVar("K")
V = TypeVar("V")
#: The staged hook, inbox and token entries of a sealed batch.
_Overlays = tuple[dict[str, Owner], dict[bytes, bytes | None], dict[bytes, Owner | None]]

#: Receives each staged append: (run id, envelopes, encoded envelopes).
Sink = Callable[[str, list[EventEnvelope], list[bytes]], None]


#: Events after which a run's timers or delayed retries may differ.
_WAKEUP_EVENTS = TERMINAL_EVENTS | {
    "wait_created",
    "wait_completed",
    "step_retrying",
    "step_started",
    "step_cancelled",
    "run_cancellation_requested",
}
#: Events after which a run may have a running step, or stop having one.
_RUNNING_EVENTS = TERMINAL_EVENTS | {
    "step_started",
    "step_completed",
    "step_retrying",
    "step_failed",
    "step_non_retryable",
    "step_cancelled",
    "run_cancellation_requested",
}


#: Restored runs remembered in memory between slices; past this many they are let go (the
#: u-mark and last sequence of an unfinished one are in RocksDB, read back when it next has a
#: record), so a restore's memory does not grow with the runs it restores.
_RESTORED_KEPT = 10_000
#: Projections one partition keeps in memory: the runs being driven (``_forget_idle`` lets the
#: others go at their commit; they are read from disk when an input or a deadline arrives).
PARTITION_CACHE_RUNS = 1_000


class _Transactions:
    """What the open transaction (staged) and the one being committed (sealed) hold."""

    _batch: WriteBatch | None
    _sealed: WriteBatch | None
    _open_since: dict[str, int]

    @property
    def has_staged(self) -> bool:
        return self._batch is not None

    @property
    def has_sealed(self) -> bool:
        return self._sealed is not None

    def open_since(self, run_id: str) -> int | None:
        """The last sequence ``run_id`` had before the open transaction first appended to it;
        ``None`` when the open transaction has appended nothing to it (what it holds is
        committed, or in the transaction being committed)."""
        return self._open_since.get(run_id)


class PartitionStore(
    _Transactions, Quarantine, StatusIndex, TokenIndex, Restoring, RocksDBEventStore
):
    """State of partition ``partition``; appends are staged for the open transaction
    (``local_token_claims``: see ``TokenIndex``)."""

    keeps_run_index = False
    counts_statuses = True

    def __init__(
        self,
        partition: int,
        path: str | Path,
        sink: Sink,
        *,
        clock: Clock = utc_now,
        local_token_claims: bool = True,
    ) -> None:
        super().__init__(path, clock=clock, sync=False, cache_runs=PARTITION_CACHE_RUNS)
        self.partition = partition
        self._local_token_claims = local_token_claims
        self._sink = sink
        self._batch: WriteBatch | None = None
        self._sealed: WriteBatch | None = None
        self._staged_runs: set[str] = set()
        self._staged_hooks: dict[str, tuple[str, str]] = {}
        self._staged_inbox: dict[bytes, bytes | None] = {}
        self._staged_tokens: dict[bytes, Owner | None] = {}
        self._staged_wakeups = False
        # Each run the open transaction appended to: its last sequence before the first append.
        self._open_since: dict[str, int] = {}
        # What the sealed batch (the transaction being committed) staged.
        self._sealed_runs: set[str] = set()
        self._sealed_wakeups = False
        self._sealed_overlays: _Overlays = ({}, {}, {})
        #: The command positions last written (``m/positions``), to write them only as they move.
        self._positions_written: dict[str, int] | None = None
        # How many commands wait in the inbox, so the common case (none) costs no scan.
        self._parked_count = sum(1 for _ in self._scan(b"i"))
        # Runs restored without a projection (the recent ones: the others are read back from
        # their u-marks), and those of them in the staged batch.
        self._restored: dict[str, Restored] = {}
        self._event_head = codec.default_codec().event_head
        self._restaged: set[str] = set()
        self._finish_from: bytes | None = None
        #: Runs the last ``finish_restore`` found waiting on nothing: only a decision moves them
        #: on, and their last owner may have stopped right before it (its code raised, say).
        self.to_drive: list[str] = []
        self._quarantined = {
            key[1:].decode(): bytes(value).decode() for key, value in self._scan(b"q")
        }
        self._statuses = self._open_statuses(WriteBatch(raw_mode=True))

    # -- encoding: Avro single-object, the same bytes as on the events topic --------------------

    def _encode(self, envelope: EventEnvelope) -> bytes:
        data = codec.encode_event(envelope)
        if len(data) > MAX_EVENT_BYTES:
            raise PayloadTooLargeError(envelope.run_id, len(data), MAX_EVENT_BYTES)
        return data

    def _decode(self, run_id: str, raw: bytes) -> EventEnvelope:
        return codec.decode_event(raw)

    def _event_type(self, raw: bytes) -> str:
        try:
            head = codec.default_codec().event_head(raw)
            return head[2] if head is not None else codec.decode_event(raw).event.type
        except FlowError:
            return ""

    # -- staging ----------------------------------------------------------------------------

    def _stage(self) -> WriteBatch:
        if self._batch is None:
            self._batch = WriteBatch(raw_mode=True)
        return self._batch

    def _persist(
        self,
        run_id: str,
        envelopes: list[EventEnvelope],
        encoded: list[bytes],
        changes: IndexChanges,
    ) -> None:
        # Staged first: a failure there produces nothing the local state would not hold.
        self._stage_write(run_id, envelopes, encoded, changes)
        self._open_since.setdefault(run_id, envelopes[0].sequence - 1)
        self._sink(run_id, envelopes, encoded)

    def _stage_write(
        self,
        run_id: str,
        envelopes: list[EventEnvelope],
        encoded: list[bytes],
        changes: IndexChanges,
        *,
        running: bool = True,
    ) -> None:
        """Stage envelopes and index changes; ``running=False`` skips the running-step index
        (for events that cannot change it)."""
        batch = self._stage()
        run_key = run_id.encode()
        put_append(batch, run_id, envelopes, encoded, changes)
        if changes.status is not None:
            self._statuses.move(*changes.status)
        if changes.added_wakeups or changes.removed_wakeups:
            self._staged_wakeups = True
        for digest, owner_run, hook_id in changes.claimed_hooks:
            self._staged_hooks[digest] = (owner_run, hook_id)
        self._staged_runs.add(run_id)
        if not running:
            return
        state = self._states.get(run_id)
        if state is not None and has_running_step(state):
            batch.put(b"x" + run_key, b"")
        else:
            batch.delete(b"x" + run_key)

    def seal(self) -> None:
        """The open transaction is being committed: later appends stage into a new batch.

        The sealed batch is written by ``commit_sealed`` once the commit succeeded; an abort
        discards it together with whatever was staged after it (it was decided on top of it).
        The overlays (staged hooks, inbox entries, tokens) keep serving both generations; the
        entries the sealed one set are dropped when it is written, unless staged again since.
        """
        assert self._sealed is None, "a sealed batch is still waiting for its commit"
        self._sealed = self._stage()
        self._batch = None
        self._open_since = {}
        self._sealed_runs = self._staged_runs
        self._staged_runs = set()
        self._sealed_wakeups = self._staged_wakeups
        self._staged_wakeups = False
        self._statuses.seal()
        self._sealed_overlays = (
            dict(self._staged_hooks),
            dict(self._staged_inbox),
            dict(self._staged_tokens),
        )

    def commit_sealed(
        self, events_offset: int | None, positions: dict[str, int] | None = None
    ) -> None:
        """After the sealed transaction committed: write its batch with the events offset and
        the command positions it recorded."""
        if self._sealed is None and events_offset is None and not self._sealed_runs:
            return  # the transaction wrote nothing of this partition: nothing to write
        batch = self._sealed if self._sealed is not None else WriteBatch(raw_mode=True)
        self._sealed = None
        self._statuses.commit_sealed(batch)
        self._write(batch, events_offset, positions, wakeups_changed=self._sealed_wakeups)
        hooks, inbox, tokens = self._sealed_overlays
        _drop_sealed(self._staged_hooks, hooks)
        _drop_sealed(self._staged_inbox, inbox)
        _drop_sealed(self._staged_tokens, tokens)
        _forget_idle(self._states, self._sealed_runs - self._staged_runs, self._clock)
        self._sealed_runs = set()
        self._sealed_wakeups = False
        self._sealed_overlays = ({}, {}, {})

    def commit_local(
        self, events_offset: int | None, positions: dict[str, int] | None = None
    ) -> None:
        """Write the staged batch with the events offset and the command positions recorded up
        to it (restore, and unpipelined commits)."""
        assert self._sealed is None, "a sealed batch is still waiting for its commit"
        batch = self._stage()
        if self._restaged:
            self._stage_restored(batch)
        self._statuses.commit_staged(batch)
        self._batch = None
        self._open_since = {}
        self._write(batch, events_offset, positions, wakeups_changed=self._staged_wakeups)
        self._staged_wakeups = False
        _forget_idle(self._states, self._staged_runs, self._clock)
        self._staged_runs.clear()
        self._staged_hooks.clear()
        self._staged_inbox.clear()
        self._staged_tokens.clear()

    def _write(
        self,
        batch: WriteBatch,
        events_offset: int | None,
        positions: dict[str, int] | None = None,
        *,
        wakeups_changed: bool,
    ) -> None:
        """Write a committed batch with the events offset and positions it reflects."""
        if events_offset is not None:
            batch.put(_OFFSET_KEY, events_offset.to_bytes(8, "big"))
        if positions and positions != self._positions_written:
            batch.put(_POSITIONS_KEY, wire.positions_value("", positions))
            self._positions_written = dict(positions)
        self._db.write(batch, self._write_options)
        if wakeups_changed:
            self._forget_earliest()

    def discard(self) -> set[str]:
        """After an abort: forget staged writes and every run state they touched; returns
        those runs."""
        touched = self._staged_runs | self._sealed_runs
        self._batch = None
        self._sealed = None
        self._open_since = {}
        self._staged_wakeups = self._sealed_wakeups = False
        self._statuses.discard()
        if self._restaged:
            self._restaged.clear()
            self._restored = {}  # read back from RocksDB's u-marks when needed
        self._parked_count = sum(1 for _ in self._scan(b"i"))
        for run_id in self._staged_runs | self._sealed_runs:
            self._states.pop(run_id, None)
        self._staged_runs.clear()
        self._sealed_runs = set()
        self._sealed_overlays = ({}, {}, {})
        self._staged_hooks.clear()
        self._staged_inbox.clear()
        self._staged_tokens.clear()
        return touched

    def _hook_owner(self, token_digest: str) -> tuple[str, str] | None:
        staged = self._staged_hooks.get(token_digest)
        return staged if staged is not None else super()._hook_owner(token_digest)

    def _remember(self, run_id: str, state: RunState) -> None:
        """The newest; when full the oldest tenth leaves, but not runs with unwritten events."""
        self._states.pop(run_id, None)
        if len(self._states) >= self._cache_runs:
            for candidate in list(self._states)[: len(self._states) // 10 + 1]:
                if candidate not in self._staged_runs and candidate not in self._sealed_runs:
                    self._states.pop(candidate)
        self._states[run_id] = state

    # -- restore ----------------------------------------------------------------------------

    @property
    def positions(self) -> dict[str, int]:
        """The command positions recorded up to ``events_offset`` (empty: none known)."""
        raw = self._db.get(_POSITIONS_KEY)
        return {} if raw is None else wire.split_positions(bytes(raw))[1]

    @property
    def events_offset(self) -> int:
        raw = self._db.get(_OFFSET_KEY)
        return 0 if raw is None else int.from_bytes(bytes(raw), "big")

    def restore_event(self, raw: bytes) -> bool:
        """Take one committed event read back from the events topic; False if already held.

        A record that is not a legal next event of its run raises (``SerializationError``,
        ``InvalidTransitionError``) and changes nothing.
        """
        head = self._event_head(raw)
        envelope: EventEnvelope | None = None
        if head is None:  # another writer schema: the full decode
            envelope = codec.decode_event(raw)
            head = (envelope.run_id, envelope.sequence, envelope.event.type)
        run_id, sequence, kind = head
        if run_id in self._quarantined:
            return False  # its history stays where it broke
        held = self._restored.get(run_id)
        if held is None:
            held = self._unindexed(run_id)
        if held is None:
            if run_id in self._states or self._db.get(b"r" + run_id.encode()) is not None:
                # A run this store held before the restore: advance its projection.
                return self._restore_applied(envelope or codec.decode_event(raw), raw)
            if sequence != 1 or kind != "run_created":
                raise InvalidTransitionError(
                    "a history must start with run_created at sequence 1", run_id=run_id
                )
            held = self._restored[run_id] = Restored(0, kind, False)
        elif sequence <= held.last:
            return False
        elif sequence != held.last + 1:
            raise InvalidTransitionError(
                f"sequence {sequence} does not follow {held.last}", run_id=run_id
            )
        elif held.kind in TERMINAL_EVENTS:
            raise InvalidTransitionError(f"{kind} after the run's {held.kind}", run_id=run_id)
        elif kind == "run_created":
            raise InvalidTransitionError(
                "run_created cannot appear after the first event", run_id=run_id
            )
        batch = self._stage()
        if kind == "hook_created":
            event = (envelope or codec.decode_event(raw)).event
            assert isinstance(event, HookCreated)
            batch.put(b"h" + event.token_digest.encode(), f"{run_id}\0{event.hook_id}".encode())
            self._staged_hooks[event.token_digest] = (run_id, event.hook_id)
        batch.put(b"e" + run_id.encode() + b"\0" + sequence.to_bytes(8, "big"), raw)
        held.last = sequence
        held.kind = kind
        self._restaged.add(run_id)
        return True

    def _restore_applied(self, envelope: EventEnvelope, raw: bytes) -> bool:
        """Restore one event of a run that has a projection: apply it and diff its indexes."""
        state = self._state_or_none(envelope.run_id)
        if state is not None and envelope.sequence <= state.last_sequence:
            return False
        changes = IndexChanges()
        kind = envelope.event.type
        # Only some events can move a wakeup or a step's running state: the others skip the
        # index work.
        timed = state is not None and kind in _WAKEUP_EVENTS
        before = state.wakeups() if timed and state is not None else []
        was = None if state is None else state.public_status().value
        if state is None:
            state = RunState.first(envelope)
            self._remember(envelope.run_id, state)
            changes.run_open = True
        else:
            state.apply(envelope)
        if state.is_terminal:
            changes.run_open = False
        changes.status = (was, state.public_status().value)
        if isinstance(envelope.event, HookCreated):
            changes.claimed_hooks.append(
                (envelope.event.token_digest, envelope.run_id, envelope.event.hook_id)
            )
        if timed:
            after = state.wakeups()
            changes.removed_wakeups = [w for w in before if w not in after]
            changes.added_wakeups = [w for w in after if w not in before]
        self._stage_write(
            envelope.run_id, [envelope], [raw], changes, running=kind in _RUNNING_EVENTS
        )
        return True

    def _stage_restored(self, batch: WriteBatch) -> None:
        """Last sequences and u-marks of the runs restored into this batch."""
        for run_id in self._restaged:
            held = self._restored[run_id]
            key = run_id.encode()
            batch.put(b"r" + key, held.last.to_bytes(8, "big"))
            self._states.pop(run_id, None)  # a read during the restore cached less
            counted = TERMINAL_STATUS.get(held.kind or "", PROVISIONAL)
            self._statuses.move(held.counted, counted)
            held.counted = counted
            if held.kind in TERMINAL_EVENTS:
                batch.delete(b"o" + key)
                if held.marked:
                    batch.delete(b"u" + key)
                    held.marked = False
            else:
                batch.put(b"o" + key, b"")
                if not held.marked:
                    batch.put(b"u" + key, b"")
                    held.marked = True
        self._restaged.clear()
        if len(self._restored) > _RESTORED_KEPT:
            # All of them are in RocksDB now: an unfinished run is read back from its u-mark,
            # a finished one takes the slow path.
            self._restored = {}

    # -- inbox: commands parked until their run exists or their build is served ---------------

    def has_parked(self) -> bool:
        return self._parked_count > 0

    def park(self, run_id: str, inbox_id: str, raw_command: bytes) -> None:
        key = b"i" + run_id.encode() + b"\0" + inbox_id.encode()
        self._stage().put(key, raw_command)
        self._staged_inbox[key] = raw_command
        self._parked_count += 1

    def unpark(self, run_id: str, inbox_id: str) -> None:
        key = b"i" + run_id.encode() + b"\0" + inbox_id.encode()
        self._stage().delete(key)
        self._staged_inbox[key] = None
        self._parked_count = max(0, self._parked_count - 1)

    def parked(self, run_id: str | None = None) -> Iterator[tuple[str, str, bytes]]:
        """Parked commands (run id, inbox id, bytes), of one run or the whole partition."""
        prefix = b"i" if run_id is None else b"i" + run_id.encode() + b"\0"
        seen: set[bytes] = set()
        for key, value in list(self._scan(prefix)):
            seen.add(key)
            staged: bytes | None = self._staged_inbox.get(key, value)
            if staged is not None:
                yield (*_inbox_parts(key), staged)
        for key, pending in list(self._staged_inbox.items()):
            if key not in seen and pending is not None and key.startswith(prefix):
                yield (*_inbox_parts(key), pending)

    def running_runs(self) -> list[str]:
        """Runs to drive after a takeover: those with a started, unsettled step (their attempts
        are re-run), and those that waited on nothing when the last owner left them (its
        workflow code raised, say)."""
        return [key[1:].decode() for key, _ in self._scan(b"x")]

    def mark_to_drive(self, run_id: str) -> None:
        """Drive ``run_id`` after the next takeover (its decision failed and may pass then)."""
        self._stage().put(b"x" + run_id.encode(), b"")


def _forget_idle(states: dict[str, RunState], runs: set[str], clock: Clock) -> None:
    """Committed runs that ended, or wait on an input or a deadline with no step running, leave
    the cache (a later read loads them): the runs held in memory are the ones being driven.
    A run with a step running stays, so it is tested first (and the clock read once, if at all)."""
    now: datetime | None = None
    for run_id in runs:
        state = states.get(run_id)
        if state is None:
            continue
        if not state.is_terminal:
            if has_running_step(state):
                continue
            now = now or clock()
            if not is_suspended(state, now):
                continue
        del states[run_id]


def _drop_sealed(overlay: dict[K, V], sealed: dict[K, V]) -> None:
    """Drop the overlay entries a written batch set, unless staged again since."""
    for key, value in sealed.items():
        if key in overlay and overlay[key] is value:
            del overlay[key]


def _inbox_parts(key: bytes) -> tuple[str, str]:
    run_id, inbox_id = key[1:].decode().split("\0", 1)
    return run_id, inbox_id
