"""Workflow-task failures: what the engine records when workflow code cannot decide, and when it
asks that code again.

Workflow code that raises, returns something that is not a ``RuntimeCommand``, or returns a
command its own history refuses (nondeterminism, a command that cannot make progress) costs a
``workflow_task_failed`` record, appended at the sequence the decision would have taken. It is
an engine record, not a decision: replay and audit skip it when they match decisions, and any
other event that follows it (new input, a decision) clears it. While it stands the run is
suspended on the task's retry (``task_retry_pending``), due at ``retry_at``:

* ``TaskRetryPolicy`` spaces the automatic retries (1 s, doubling, at most 300 s apart);
* the ``max_automatic``-th consecutive failure has no ``retry_at``: the run waits for new input
  or an operator retry, so one trigger appends at most ``max_automatic`` records;
* with ``fail_after`` the ``fail_after``-th consecutive failure is recorded and ends the run
  with ``run_failed`` in the same append.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from flowstream.model.events import FlowEvent, RunFailed, WorkflowTaskFailed
from flowstream.replay.records import TaskFailure

if TYPE_CHECKING:
    from flowstream.replay.state import RunState

__all__ = [
    "MESSAGE_LIMIT",
    "TaskRetryPolicy",
    "task_failed_events",
    "task_failure_error",
    "task_retry_pending",
]

#: Characters of the exception's text a failure record keeps.
MESSAGE_LIMIT = 500
_TYPE_LIMIT = 200


@dataclass(frozen=True, slots=True)
class TaskRetryPolicy:
    """How a failed workflow task is retried, and when its run gives up."""

    #: Delay before the first automatic retry; each further one doubles it.
    initial_ms: int = 1_000
    #: The longest delay between two automatic retries.
    max_interval_ms: int = 300_000
    #: The consecutive failure that is no longer retried by itself (the earlier ones are).
    max_automatic: int = 10
    #: The consecutive failure that fails the run; ``None``: a run never fails for it.
    fail_after: int | None = None

    def __post_init__(self) -> None:
        if self.initial_ms < 1 or self.max_interval_ms < self.initial_ms:
            raise ValueError("task retry needs 1 <= initial_ms <= max_interval_ms")
        if self.max_automatic < 1:
            raise ValueError("task retry max_automatic must be at least 1")
        if self.fail_after is not None and self.fail_after < 1:
            raise ValueError("task retry fail_after must be at least 1 (or None)")

    def delay_ms(self, attempt: int) -> int:
        """The delay after consecutive failure ``attempt`` (1-based), capped."""
        return min(self.max_interval_ms, self.initial_ms << min(attempt - 1, 40))


def task_retry_pending(state: RunState, now: datetime) -> bool:
    """The run's workflow task failed and its retry is not due at ``now`` (or never by itself)."""
    failure = state.task_failure
    return failure is not None and (failure.retry_at is None or failure.retry_at > now)


def task_failed_events(
    state: RunState,
    error_type: str,
    message: str,
    now: datetime,
    policy: TaskRetryPolicy,
    *,
    undone_hook: str | None = None,
) -> list[FlowEvent]:
    """What records a failed workflow task of ``state`` at ``now``: the failure, and the run's
    ``run_failed`` when ``policy`` gives up on it. ``undone_hook``: the hook whose creation
    failed after it was recorded (a lost token claim)."""
    attempt = 1 if state.task_failure is None else state.task_failure.attempt + 1
    kind = error_type[:_TYPE_LIMIT] or "Exception"
    text = message[:MESSAGE_LIMIT]
    if policy.fail_after is not None and attempt >= policy.fail_after:
        failed = WorkflowTaskFailed(
            attempt=attempt, error_type=kind, message=text, undone_hook=undone_hook
        )
        return [failed, RunFailed(error=task_failure_error(failed))]
    retry_at = None
    if attempt < policy.max_automatic:
        retry_at = now + timedelta(milliseconds=policy.delay_ms(attempt))
    failed = WorkflowTaskFailed(
        attempt=attempt, error_type=kind, message=text, retry_at=retry_at, undone_hook=undone_hook
    )
    return [failed]


def task_failure_error(failure: TaskFailure | WorkflowTaskFailed) -> str:
    """The ``run_failed`` error of a run its failing workflow task ended."""
    times = "once" if failure.attempt == 1 else f"{failure.attempt} times in a row"
    return f"workflow task failed {times}: {failure.error_type}: {failure.message}"
