"""``FailureBoundary``: the one place where a failure of one run's code, or of the engine around
it, is caught, counted and recorded, so no run can stop the processor."""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Any

from flowstream.errors import FlowError, NonDeterministicError
from flowstream.processor.context import Context
from flowstream.processor.deadletters import DeadLetters

__all__ = ["FailureBoundary", "describe"]

LOG = logging.getLogger("flowstream.processor")


def describe(exc: BaseException) -> str:
    """One line naming what user code raised."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class FailureBoundary:
    """Runs work for one run; what it raises is that run's failure, never the processor's.

    * a ``NonDeterministicError`` is counted and dead-lettered for the run;
    * another ``FlowError`` (a refusal the engine explains: an invalid transition, a conflict
      it could not resolve) is logged for the run;
    * anything else is step-handler code raising, or the engine failing around user code:
      counted, logged in one line (the traceback at debug level), dead-lettered for the run,
      and the run is marked to be driven again by the partition's next owner, so a fixed
      deployment moves it on;
    * a command that appended and then failed, whatever the error, marks its run the same way
      (``moved_then_failed``).

    Workflow code that raises (or decides against its history) is not seen here: the engine
    records it in the run's history (``workflow_task_failed``) and retries it, and reports it
    through ``task_failed``.
    """

    def __init__(self, ctx: Context, dead_letters: DeadLetters) -> None:
        self.ctx = ctx
        self.dead_letters = dead_letters

    async def guard(self, task: Any, run_id: str, work: Awaitable[Any]) -> bool:
        """Await ``work`` for ``run_id`` of ``task``; whether it finished without raising."""
        try:
            await work
            return True
        except NonDeterministicError as exc:
            self.ctx.metrics.nondeterminism.inc()
            LOG.error("%s", exc)
            self.dead_letters.for_run(task.partition, run_id, str(exc))
        except FlowError as exc:
            LOG.warning("run %s: %s", run_id, exc)
        except Exception as exc:
            self.failed(task, run_id, exc)
        return False

    @staticmethod
    def last_sequence(task: Any, run_id: str) -> int:
        """``run_id``'s last sequence in ``task``'s store (0: no such run)."""
        store = task.store
        return store.state(run_id).last_sequence if store.exists(run_id) else 0

    def moved_then_failed(self, task: Any, run_id: str, before: int) -> None:
        """A command for ``run_id`` failed: if it appended first (``before`` was the run's
        last sequence), mark the run to be driven again, as when its code raises. The events
        commit with the dead letter, so without the mark nothing would move the run on."""
        try:
            moved = self.last_sequence(task, run_id) != before
        except FlowError:
            return  # a history that does not read: nothing to drive
        if moved:
            LOG.warning("run %s: its command failed after appending: marked to drive", run_id)
            task.store.mark_to_drive(run_id)

    def task_failed(self, run_id: str, error_type: str, message: str) -> None:
        """The engine recorded a ``workflow_task_failed`` for ``run_id``: count it and log it
        in one line (the run's history holds the record and the retry is due by itself)."""
        self.ctx.metrics.workflow_failures.inc()
        if error_type == "NonDeterministicError":
            self.ctx.metrics.nondeterminism.inc()
        first = message.splitlines()[0] if message else ""
        LOG.error("run %s: workflow task failed: %s", run_id, f"{error_type}: {first}"[:300])

    def failed(self, task: Any, run_id: str, exc: Exception, *, report: bool = True) -> None:
        """Record that ``run_id``'s code raised ``exc`` (``report``: dead-letter it for the run;
        a command being applied is dead-lettered with the reason instead)."""
        self.ctx.metrics.workflow_failures.inc()
        reason = f"run {run_id}: runtime code raised {describe(exc)}"
        LOG.error("%s", reason)
        LOG.debug("run %s: traceback", run_id, exc_info=exc)
        if report:
            self.dead_letters.for_run(task.partition, run_id, reason)
        if task.store.exists(run_id):
            task.store.mark_to_drive(run_id)
