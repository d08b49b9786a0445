"""``Sweeper``: the runs a partition must drive after its restore or an abort, and its inbox
retried after the restore, a budget of them per loop iteration (so no sweep holds a
transaction open past its timeout, and commands keep flowing meanwhile).

It also runs the liveness scan (``scan``): every ``SCAN_INTERVAL_S`` each active partition
whose sweep is done looks at the next ``SCAN_BUDGET`` of its open runs (a cursor through the
store's open-runs index, from the start again at the end) and queues the stalled ones, the runs
nothing will move unless driven; each such drive that goes through counts in
``flowstream_runs_repaired``. A repair whose drive raised is not tried again by the scan until
its run has changed (its code fails on it; the next input or owner tries it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from flowstream.model.snapshot import StepStatus
from flowstream.processor.boundary import FailureBoundary
from flowstream.processor.context import Context
from flowstream.processor.inbox import Inbox
from flowstream.processor.steps import StepRunner
from flowstream.processor.tasks import PartitionTask, TaskManager
from flowstream.replay.decide import is_suspended

__all__ = ["Sweeper"]

#: Runs driven (or parked commands retried) per iteration, and the time that may take.
RUN_BUDGET = 200
TIME_BUDGET_S = 0.05
#: How often a partition's open runs are scanned for stalled ones, and how many per scan.
SCAN_INTERVAL_S = 5.0
SCAN_BUDGET = 200


@dataclass(eq=False, slots=True)
class _Scan:
    """Where the liveness scan of one owned partition stands."""

    task: PartitionTask
    due: float
    cursor: str | None = None
    #: Runs the scan queued, not driven yet.
    queued: set[str] = field(default_factory=set)
    #: Runs whose repair raised, with the last sequence they had then.
    failed: dict[str, int] = field(default_factory=dict)


class Sweeper:
    """Drives what activation and aborts left to drive."""

    def __init__(
        self,
        ctx: Context,
        tasks: TaskManager,
        boundary: FailureBoundary,
        inbox: Inbox,
        steps: StepRunner,
    ) -> None:
        self.ctx = ctx
        self.steps = steps
        self.tasks = tasks
        self.boundary = boundary
        self.inbox = inbox
        self._scans: dict[int, _Scan] = {}
        # The partitions the last scan looked at, and when the first of them is due: until
        # then, with the same partitions active, a scan has nothing to do (it runs every loop
        # iteration).
        self._scanned: list[PartitionTask] = []
        self._next_due = 0.0

    def scan(self) -> None:
        """Queue the stalled runs among the next open runs of each partition that is due."""
        now = time.monotonic()
        active = self.tasks.active()
        if now < self._next_due and active == self._scanned:
            return
        self._scanned = active
        self._next_due = self._scan(now, active)

    def _scan(self, now: float, active: list[PartitionTask]) -> float:
        """``scan`` over ``active``; returns when the first partition is due."""
        for partition in set(self._scans) - {t.partition for t in active}:
            del self._scans[partition]
        for task in active:
            scan = self._scans.get(task.partition)
            if scan is None or scan.task is not task:  # newly owned: its restore sweep first
                self._scans[task.partition] = _Scan(task, now + SCAN_INTERVAL_S)
                continue
            if now < scan.due or task.to_drive or task.to_retry:
                continue
            scan.due = now + SCAN_INTERVAL_S
            found = task.engine.find_stalled(
                after=scan.cursor, budget_runs=SCAN_BUDGET, now=self.ctx.clock()
            )
            scan.cursor = found.cursor
            store = task.store
            if found.cursor is None:  # a lap ended: forget the failures of runs moved since
                scan.failed = {
                    r: last
                    for r, last in scan.failed.items()
                    if store.exists(r) and store.state(r).last_sequence == last
                }
            for run_id in found.stalled:
                if store.quarantined(run_id):
                    continue
                if scan.failed.get(run_id) == store.state(run_id).last_sequence:
                    continue
                scan.failed.pop(run_id, None)
                scan.queued.add(run_id)
                task.to_drive.append(run_id)
        return min((scan.due for scan in self._scans.values()), default=float("inf"))

    def pending(self) -> bool:
        """Some active partition has runs to drive or commands to retry."""
        for task in self.tasks.active():  # noqa: SIM110 (no generator: twice an iteration)
            if task.to_drive or task.to_retry:
                return True
        return False

    async def sweep(self) -> None:
        deadline = time.monotonic() + TIME_BUDGET_S
        budget = RUN_BUDGET
        for task in self.tasks.active():
            while (task.to_drive or task.to_retry) and budget > 0:
                if time.monotonic() >= deadline:
                    return
                budget -= 1
                self.ctx.pipeline.begin()
                if task.to_drive:
                    await self._drive(task, task.to_drive.popleft())
                else:
                    await self._retry(task, *task.to_retry.popleft())

    async def _drive(self, task: PartitionTask, run_id: str) -> None:
        store = task.store
        scan = self._scans.get(task.partition)
        repair = scan is not None and scan.task is task and run_id in scan.queued
        if repair and scan is not None:
            scan.queued.discard(run_id)
        if not store.exists(run_id) or store.quarantined(run_id):
            return  # a run whose start an abort threw away, or one not to touch
        # What the sweep drives (a run a restore found waiting on nothing, one an abort or a
        # failed command left, an operator's RetryRun) retries a failed workflow task at once.
        work = task.engine.advance(run_id, retry_task=True)
        if not await self.boundary.guard(task, run_id, work):
            if repair and scan is not None and store.exists(run_id):
                scan.failed[run_id] = store.state(run_id).last_sequence
            return
        if repair:
            self.ctx.metrics.runs_repaired.inc()
        state = store.state(run_id)
        if state.is_terminal or not is_suspended(state, self.ctx.clock()):
            return
        # A suspended run is not asked for a decision, which is what re-dispatches its running
        # steps: a step that ran beside a wait when the last owner stopped is dispatched here.
        running = [
            (step_id, step.attempt)
            for step_id, step in state.steps.items()
            if step.status is StepStatus.RUNNING
        ]
        if running:
            self.steps.dispatch(task, run_id, running)

    async def _retry(self, task: PartitionTask, run_id: str, inbox_id: str, raw: bytes) -> None:
        if not self.inbox.is_parked(task, run_id, inbox_id):
            return  # applied since, with another of its run's
        if await self.inbox.retry(task, run_id, inbox_id, raw):
            await self.boundary.guard(task, run_id, self.inbox.drain(task, run_id))
