"""``Inspection``: read-only views of the store's runs (snapshots, suspensions, a summary).

The fleet views read the store's run index (``run_index()``, kept in the same writes as the
events): ``summary`` reads its counters and ``list_open_suspensions`` the open suspensions it
keeps per run, so neither reads a history. Views of named runs read their states.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime

from flowstream.engine.cycle import ReplayCycle
from flowstream.index.rows import OpenItem, open_items
from flowstream.index.table import SUSPENSION_COUNTERS, RunTable
from flowstream.model.events import EventEnvelope
from flowstream.model.snapshot import RunStatus, WorkflowRunSnapshot, WorkflowRunSummary

__all__ = ["Inspection", "Suspension"]


@dataclass(frozen=True, slots=True)
class Suspension:
    """One open suspension of a non-terminal run."""

    run_id: str
    kind: str  # wait | retry | hook | signal | child
    subject_id: str
    due: datetime | None = None
    is_due: bool = False


class Inspection(ReplayCycle):
    """What the runs look like now; nothing here appends or drives."""

    def snapshot(self, run_id: str) -> WorkflowRunSnapshot:
        return self.store.state(run_id).snapshot()

    def history(self, run_id: str) -> list[EventEnvelope]:
        return self.store.read(run_id)

    def list_runs(self) -> list[str]:
        return self.store.list_runs()

    def run_index(self) -> RunTable:
        """The store's run index: rows filtered and paged (``query``), ``get``, ``counts``."""
        return self.store.run_index()

    def list_open_suspensions(
        self, now: datetime | None = None, *, run_ids: Iterable[str] | None = None
    ) -> list[Suspension]:
        """Open waits, retries, hooks, signal waits and children of non-terminal runs (of
        ``run_ids``, default every run), by run id."""
        pairs: Iterable[tuple[str, tuple[OpenItem, ...]]]
        if run_ids is None:
            pairs = self.store.run_index().runs_with_open_items()
        else:
            pairs = ((run_id, open_items(self.store.state(run_id))) for run_id in run_ids)
        found = [
            Suspension(run_id, item.kind, item.subject_id, item.due)
            for run_id, items in pairs
            for item in items
        ]
        if now is not None:
            found = [replace(s, is_due=s.due is not None and s.due <= now) for s in found]
        return found

    def summary(self) -> WorkflowRunSummary:
        """Runs by status and open suspensions by kind, from the run index's counters."""
        totals = self.store.run_index().totals()
        by_status = {status: totals[status.value] for status in RunStatus if totals[status.value]}
        counts = {name: totals[name] for name in SUSPENSION_COUNTERS.values()}
        return WorkflowRunSummary(total_runs=sum(by_status.values()), by_status=by_status, **counts)
