"""``Inspection``: read-only views of the store's runs (snapshots, suspensions, a summary)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime

from flowstream.engine.cycle import ReplayCycle
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

    def list_open_suspensions(
        self, now: datetime | None = None, *, run_ids: Iterable[str] | None = None
    ) -> list[Suspension]:
        """Open waits, hooks, retries, signal waits and children of non-terminal runs (of
        ``run_ids``, default every run)."""
        found: list[Suspension] = []
        for run_id in self.store.list_runs() if run_ids is None else run_ids:
            state = self.store.state(run_id)
            if state.is_terminal:
                continue
            for wait_id in sorted(state.open_waits):
                found.append(Suspension(run_id, "wait", wait_id, state.waits[wait_id].resume_at))
            for step_id in sorted(state.delayed_steps):
                found.append(Suspension(run_id, "retry", step_id, state.steps[step_id].retry_after))
            for hook_id in sorted(state.active_hooks):
                found.append(Suspension(run_id, "hook", hook_id))
            for queue in state.waiting_signal_waits.values():
                for wait_id in queue:
                    found.append(Suspension(run_id, "signal", wait_id))
            for child_id in sorted(state.open_children):
                found.append(Suspension(run_id, "child", child_id))
        if now is not None:
            found = [replace(s, is_due=s.due is not None and s.due <= now) for s in found]
        return found

    def summary(self) -> WorkflowRunSummary:
        by_status: dict[RunStatus, int] = {}
        counts = {
            "open_waits": 0,
            "active_hooks": 0,
            "pending_retries": 0,
            "open_children": 0,
            "open_signal_waits": 0,
        }
        runs = self.store.list_runs()
        for run_id in runs:
            state = self.store.state(run_id)
            status = state.public_status()
            by_status[status] = by_status.get(status, 0) + 1
            if state.is_terminal:
                continue
            counts["open_waits"] += len(state.open_waits)
            counts["active_hooks"] += len(state.active_hooks)
            counts["pending_retries"] += len(state.delayed_steps)
            counts["open_children"] += len(state.open_children)
            counts["open_signal_waits"] += sum(len(q) for q in state.waiting_signal_waits.values())
        return WorkflowRunSummary(total_runs=len(runs), by_status=by_status, **counts)
