"""``Sweeper``: the runs a partition must drive after its restore or an abort, and its inbox
retried after the restore, a budget of them per loop iteration (so no sweep holds a
transaction open past its timeout, and commands keep flowing meanwhile)."""

from __future__ import annotations

import time

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

    def pending(self) -> bool:
        return any(t.to_drive or t.to_retry for t in self.tasks.active())

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
        if not store.exists(run_id) or store.quarantined(run_id):
            return  # a run whose start an abort threw away, or one not to touch
        # What the sweep drives (a run a restore found waiting on nothing, one an abort or a
        # failed command left, an operator's RetryRun) retries a failed workflow task at once.
        work = task.engine.advance(run_id, retry_task=True)
        if not await self.boundary.guard(task, run_id, work):
            return
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
