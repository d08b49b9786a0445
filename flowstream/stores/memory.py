"""``MemoryEventStore``: the executable specification of the store contract, in one process."""

from __future__ import annotations

import bisect
from datetime import datetime

from flowstream.index.table import MemoryKeyValues, RunTable, write_changes
from flowstream.model.events import EventEnvelope
from flowstream.replay.state import Wakeup
from flowstream.stores.base import Clock, EventStore, IndexChanges, utc_now

__all__ = ["MemoryEventStore"]


def _key(wakeup: Wakeup) -> tuple[datetime, str, str, str]:
    return (wakeup.due, wakeup.run_id, wakeup.kind, wakeup.subject_id)


class MemoryEventStore(EventStore):
    """Histories, the wakeup, hook-token and run indexes in dicts and sorted lists."""

    def __init__(self, *, clock: Clock = utc_now) -> None:
        super().__init__(clock=clock)
        self._histories: dict[str, list[EventEnvelope]] = {}
        self._wakeups: list[tuple[datetime, str, str, str]] = []
        self._hooks: dict[str, tuple[str, str]] = {}
        self._open: list[str] = []  # sorted
        self._index = MemoryKeyValues()
        self._run_table = RunTable(self._index, lock=self._lock)

    def list_runs(self) -> list[str]:
        with self._lock:
            return sorted(self._histories)

    def open_runs(self, after: str | None, limit: int) -> list[str]:
        with self._lock:
            start = 0 if after is None else bisect.bisect_right(self._open, after)
            return self._open[start : start + limit]

    def due_wakeups(self, now: datetime) -> list[Wakeup]:
        with self._lock:
            end = bisect.bisect_right(self._wakeups, (now, "\uffff", "", ""))
            return [Wakeup(*key) for key in self._wakeups[:end]]

    def next_wakeup(self) -> Wakeup | None:
        with self._lock:
            return Wakeup(*self._wakeups[0]) if self._wakeups else None

    def _load(self, run_id: str) -> list[EventEnvelope] | None:
        return self._histories.get(run_id)

    def _persist(
        self,
        run_id: str,
        envelopes: list[EventEnvelope],
        encoded: list[bytes],
        changes: IndexChanges,
    ) -> None:
        self._histories.setdefault(run_id, []).extend(envelopes)
        for wakeup in changes.removed_wakeups:
            key = _key(wakeup)
            index = bisect.bisect_left(self._wakeups, key)
            if index < len(self._wakeups) and self._wakeups[index] == key:
                del self._wakeups[index]
        for wakeup in changes.added_wakeups:
            bisect.insort(self._wakeups, _key(wakeup))
        for digest, owner_run, hook_id in changes.claimed_hooks:
            self._hooks[digest] = (owner_run, hook_id)
        write_changes(self._index, changes.run_index)
        if changes.run_open is not None:
            index = bisect.bisect_left(self._open, run_id)
            present = index < len(self._open) and self._open[index] == run_id
            if changes.run_open and not present:
                self._open.insert(index, run_id)
            elif not changes.run_open and present:
                del self._open[index]

    def _hook_owner(self, token_digest: str) -> tuple[str, str] | None:
        return self._hooks.get(token_digest)
