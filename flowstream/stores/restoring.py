"""``Restoring``: the runs a ``PartitionStore`` restored without a projection, read back from
RocksDB, and ``finish_restore``, which builds their indexes (a mixin: the store has the database).

A run restored from the events topic is marked unfinished (``u<run>``, beside its last sequence
``r<run>``) until ``finish_restore`` reads its history once. Memory does not grow with the runs
restored: the store remembers the recent ones (``Restored``) and reads the others back from their
marks; ``finish_restore`` walks the marks a chunk at a time and keeps no projection. A processor
calls it a slice at a time (``finish_restore_slice``), so a partition of a million runs does not
hold its loop for minutes.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

from rocksdict import WriteBatch

from flowstream.errors import FlowError
from flowstream.model.snapshot import StepStatus
from flowstream.replay.decide import is_suspended
from flowstream.replay.state import RunState
from flowstream.stores.base import Clock
from flowstream.stores.rocksdb import wakeup_key
from flowstream.stores.statuses import PROVISIONAL, StatusCounts

__all__ = ["Restored", "Restoring", "has_running_step", "needs_driving"]

#: Runs ``finish_restore`` builds per write (their u-marks, wakeups and status moves together).
_FINISH_CHUNK = 5_000


class Restored:
    """A run restored without a projection: its last sequence and event type (``None`` when
    only known to be unfinished), whether RocksDB holds its u-mark, and the status it counts
    under in the committed counts (``None``: not counted yet)."""

    __slots__ = ("counted", "kind", "last", "marked")

    def __init__(self, last: int, kind: str | None, marked: bool) -> None:
        self.last = last
        self.kind = kind
        self.marked = marked
        self.counted: str | None = PROVISIONAL if marked else None


def has_running_step(state: RunState) -> bool:
    return not state.is_terminal and any(
        state.steps[s].status is StepStatus.RUNNING for s in state.active_steps
    )


def needs_driving(state: RunState, now: datetime) -> bool:
    """A live run that waits on nothing durable: only a decision moves it on. A failed workflow
    task with no automatic retry left counts: the new owner retries it once."""
    exhausted = state.task_failure is not None and state.task_failure.retry_at is None
    return not state.is_terminal and (exhausted or not is_suspended(state, now))


class Restoring:
    """Restored runs read back from their marks, and the build of their indexes."""

    _db: Any
    _write_options: Any
    _restored: dict[str, Restored]
    _restaged: set[str]
    _states: dict[str, RunState]
    _staged_runs: set[str]
    _sealed_runs: set[str]
    _statuses: StatusCounts
    to_drive: list[str]
    _clock: Clock
    #: Where a sliced ``finish_restore`` goes on (``None``: none under way).
    _finish_from: bytes | None
    if TYPE_CHECKING:  # the store's own, which must not be shadowed at run time

        def _state_or_none(self, run_id: str) -> RunState | None: ...

        def _scan(
            self, prefix: bytes, end: bytes | None = None
        ) -> Iterator[tuple[bytes, bytes]]: ...

    def _unindexed(self, run_id: str) -> Restored | None:
        """A run restored earlier without a projection (its u-mark is in RocksDB), read back
        and remembered again; ``None`` for any other run."""
        key = run_id.encode()
        if self._db.get(b"u" + key) is None:
            return None
        raw = self._db.get(b"r" + key)
        last = 0 if raw is None else int.from_bytes(bytes(raw), "big")
        held = self._restored[run_id] = Restored(last, None, True)
        return held

    def finish_restore(self) -> list[tuple[str, FlowError]]:
        """Build the wakeup and running-step entries of every restored run that is not finished
        (call after the last ``commit_local`` of a restore), in one call: the slices of
        ``finish_restore_slice`` until it is done. Returns the runs whose history does not
        validate, with the error; they stay readable and report it."""
        failures: list[tuple[str, FlowError]] = []
        while True:
            found, done = self.finish_restore_slice(None)
            failures.extend(found)
            if done:
                return failures

    @property
    def finishing(self) -> bool:
        """A sliced ``finish_restore`` has begun and not ended."""
        return self._finish_from is not None

    def finish_restore_slice(
        self, deadline: float | None
    ) -> tuple[list[tuple[str, FlowError]], bool]:
        """One slice of ``finish_restore``, until ``deadline`` (``time.monotonic``; at least
        one run) or ``_FINISH_CHUNK`` runs: the u-marked runs from where the last slice stopped,
        read from RocksDB and written with their status moves. Returns the runs whose history
        does not validate, and whether every run is built (``to_drive`` is then complete)."""
        if self._finish_from is None:
            assert not self._restaged, "commit_local the restored records first"
            self._restored.clear()
            self._finish_from = b"u"
        failures: list[tuple[str, FlowError]] = []
        chunk = self._marked_runs(self._finish_from)
        if not chunk:
            return failures, self._finished()
        whole = len(chunk) < _FINISH_CHUNK
        batch = WriteBatch(raw_mode=True)
        moves: Counter[str] = Counter()
        for at, run_id in enumerate(chunk):
            if at and deadline is not None and time.monotonic() >= deadline:
                chunk, whole = chunk[:at], False
                break
            key = run_id.encode()
            batch.delete(b"u" + key)
            self._states.pop(run_id, None)
            try:
                state = self._state_or_none(run_id)
            except FlowError as exc:
                failures.append((run_id, exc))
                continue
            if state is None:
                continue
            self._statuses.move(PROVISIONAL, state.public_status().value, moves)
            for wakeup in state.wakeups():
                batch.put(wakeup_key(wakeup), b"")
            if has_running_step(state):
                batch.put(b"x" + key, b"")
            elif needs_driving(state, self._clock()):
                # Marked, not only remembered: if the partition goes before the last slice,
                # its next owner's restore still finds the run to drive (its u-mark is gone).
                batch.put(b"d" + key, b"")
            if run_id not in self._staged_runs and run_id not in self._sealed_runs:
                self._states.pop(run_id, None)  # a run waiting costs disk, not memory
        self._statuses.write(moves, batch)
        self._db.write(batch, self._write_options)
        # On from the next key: the u-marks just deleted are not walked again.
        self._finish_from = b"u" + chunk[-1].encode() + b"\0"
        return failures, whole and self._finished()

    def _finished(self) -> bool:
        """Every u-mark is built: the runs to drive are those marked so (the marks go)."""
        batch = WriteBatch(raw_mode=True)
        self.to_drive = []
        for key, _ in self._scan(b"d"):
            self.to_drive.append(key[1:].decode())
            batch.delete(key)
        if self.to_drive:
            self._db.write(batch, self._write_options)
        self._finish_from = None
        return True

    def _marked_runs(self, start: bytes) -> list[str]:
        """Up to ``_FINISH_CHUNK`` u-marked runs, by run id, from the key ``start``."""
        found: list[str] = []
        for raw_key in self._db.keys(from_key=start):
            key = bytes(raw_key)
            if not key.startswith(b"u") or len(found) >= _FINISH_CHUNK:
                break
            found.append(key[1:].decode())
        return found
