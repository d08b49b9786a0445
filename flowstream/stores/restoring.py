"""``Restoring``: the runs a ``PartitionStore`` restored without a projection, read back from
RocksDB, and ``finish_restore``, which builds their indexes (a mixin: the store has the database).

A run restored from the events topic is marked unfinished (``u<run>``, beside its last sequence
``r<run>``) until ``finish_restore`` reads its history once. Memory does not grow with the runs
restored: the store remembers the recent ones (``Restored``) and reads the others back from their
marks; ``finish_restore`` walks the marks a chunk at a time and keeps no projection.
"""

from __future__ import annotations

from collections import Counter
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
    if TYPE_CHECKING:  # the store's own, which must not be shadowed at run time

        def _state_or_none(self, run_id: str) -> RunState | None: ...

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
        (call after the last ``commit_local`` of a restore): the u-marked runs, read from
        RocksDB ``_FINISH_CHUNK`` at a time, each chunk written with its status moves. Returns
        the runs whose history does not validate, with the error; they stay readable and
        report it."""
        assert not self._restaged, "commit_local the restored records first"
        failures: list[tuple[str, FlowError]] = []
        self.to_drive = []
        self._restored.clear()
        start = b"u"
        while chunk := self._marked_runs(start):
            batch = WriteBatch(raw_mode=True)
            moves: Counter[str] = Counter()
            for run_id in chunk:
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
                    self.to_drive.append(run_id)
                if run_id not in self._staged_runs and run_id not in self._sealed_runs:
                    self._states.pop(run_id, None)  # a run waiting costs disk, not memory
            self._statuses.write(moves, batch)
            self._db.write(batch, self._write_options)
            start = b"u" + chunk[-1].encode() + b"\0"
        return failures

    def _marked_runs(self, start: bytes) -> list[str]:
        """Up to ``_FINISH_CHUNK`` u-marked runs, by run id, from the key ``start``."""
        found: list[str] = []
        for raw_key in self._db.keys(from_key=start):
            key = bytes(raw_key)
            if not key.startswith(b"u") or len(found) >= _FINISH_CHUNK:
                break
            found.append(key[1:].decode())
        return found
