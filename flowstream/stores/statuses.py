"""``StatusCounts``: how many runs of one partition store are in each status, kept with its
appends so that a metric of runs by status never scans runs.

Each append that moves a run from one status to another (``IndexChanges.status``) moves one
count. The counts follow the store's transactions: moves staged for the open transaction, moves
sealed with the one being committed, and the committed counts, written in the same RocksDB batch
as the events they count (``m/status/<status>``, 8 bytes, signed big-endian). An abort drops the
staged and sealed moves with the events.

A run restored from the events topic without a projection counts as ``running`` until the end of
the restore reads its state (``finish_restore``); a finished one counts by its last event.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from flowstream.errors import FlowError
from flowstream.model.snapshot import RunStatus
from flowstream.replay.state import RunState

__all__ = ["BUILT_KEY", "PROVISIONAL", "TERMINAL_STATUS", "StatusCounts", "StatusIndex", "key_of"]

_PREFIX = b"m/status/"
#: Present once the counts cover every run of the store (one written before them is counted
#: once when opened).
BUILT_KEY = b"m/status_counts"
#: The status a restored run counts under until its state is read.
PROVISIONAL = RunStatus.RUNNING.value
#: The status a run's terminal event gives it.
TERMINAL_STATUS = {
    "run_completed": RunStatus.COMPLETED.value,
    "run_failed": RunStatus.FAILED.value,
    "run_timed_out": RunStatus.FAILED.value,
    "run_retry_exhausted": RunStatus.FAILED.value,
    "run_cancelled": RunStatus.CANCELLED.value,
    "run_continued_as_new": RunStatus.CONTINUED_AS_NEW.value,
}


def key_of(status: str) -> bytes:
    return _PREFIX + status.encode()


class StatusCounts:
    """Committed counts by status, and the moves of the open and the sealed transaction."""

    __slots__ = ("committed", "sealed", "staged")

    def __init__(self, committed: dict[str, int] | None = None) -> None:
        self.committed: dict[str, int] = dict(committed or {})
        self.staged: Counter[str] = Counter()
        self.sealed: Counter[str] = Counter()

    @classmethod
    def read(cls, items: Any) -> StatusCounts:
        """The committed counts from the ``m/status/`` entries (key, value) of a store."""
        committed = {
            bytes(key)[len(_PREFIX) :].decode(): int.from_bytes(bytes(value), "big", signed=True)
            for key, value in items
        }
        return cls({status: count for status, count in committed.items() if count})

    def move(self, before: str | None, after: str | None, into: Counter[str] | None = None) -> None:
        """One run goes from ``before`` (``None``: it is new) to ``after``, in the open
        transaction unless ``into`` is given."""
        if before == after:
            return
        moves = self.staged if into is None else into
        if before is not None:
            moves[before] -= 1
        if after is not None:
            moves[after] += 1

    def seal(self) -> None:
        """The open transaction is being committed: its moves wait for the commit."""
        self.sealed, self.staged = self.staged, Counter()

    def commit_sealed(self, batch: Any) -> None:
        self.write(self.sealed, batch)
        self.sealed = Counter()

    def commit_staged(self, batch: Any) -> None:
        self.write(self.staged, batch)
        self.staged = Counter()

    def write(self, moves: Counter[str], batch: Any) -> None:
        """Apply ``moves`` to the committed counts and put the counts they change in ``batch``."""
        for status, delta in moves.items():
            if not delta:
                continue
            count = self.committed.get(status, 0) + delta
            batch.put(key_of(status), count.to_bytes(8, "big", signed=True))
            if count:
                self.committed[status] = count
            else:
                self.committed.pop(status, None)

    def discard(self) -> None:
        """After an abort: the moves of the transactions thrown away go with them."""
        self.staged = Counter()
        self.sealed = Counter()


class StatusIndex:
    """The counts of a partition store (a mixin: the store has the database)."""

    _db: Any
    _write_options: Any
    _statuses: StatusCounts
    if TYPE_CHECKING:  # the store's own, which must not be shadowed at run time

        def _scan(
            self, prefix: bytes, end: bytes | None = None
        ) -> Iterator[tuple[bytes, bytes]]: ...

        def _event_type(self, raw: bytes) -> str: ...

        def state(self, run_id: str) -> RunState: ...

    def status_counts(self) -> dict[str, int]:
        """How many runs are in each status, as committed (callable from any thread)."""
        return dict(self._statuses.committed)

    def _open_statuses(self, batch: Any) -> StatusCounts:
        """The committed counts; a store written before them is counted once (through
        ``batch``), each run by its last event, or by its state when that event does not end
        it (a run an interrupted restore left without a projection counts as provisional)."""
        if self._db.get(BUILT_KEY) is not None:
            return StatusCounts.read(self._scan(_PREFIX))
        counts = StatusCounts()
        moves: Counter[str] = Counter()
        for key, value in self._scan(b"r"):
            run_id = key[1:].decode()
            last = self._db.get(b"e" + key[1:] + b"\0" + bytes(value))
            status = TERMINAL_STATUS.get(self._event_type(bytes(last))) if last else None
            if status is None and self._db.get(b"u" + key[1:]) is None:  # not u-marked
                try:
                    status = self.state(run_id).public_status().value
                except FlowError:
                    status = None
            counts.move(None, status or PROVISIONAL, moves)
        counts.write(moves, batch)
        batch.put(BUILT_KEY, b"")
        self._db.write(batch, self._write_options)
        return counts
