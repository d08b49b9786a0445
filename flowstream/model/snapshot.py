"""``WorkflowRunSnapshot``: the read model projected from a run's history.

A snapshot is a projection for APIs and operations; it cannot replace the history. Hook tokens
are not part of it (the history holds only their digests).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from flowstream.model.base import JSON, FrozenModel
from flowstream.model.events import (
    ChildCancellationPolicy,
    ParentLink,
    TerminalOutcome,
    WorkflowProgress,
)
from flowstream.model.spec import RetryPolicy, WorkflowSpec

__all__ = [
    "TERMINAL_STATUSES",
    "CancellationSnapshot",
    "ChildWorkflowSnapshot",
    "HookSnapshot",
    "HookStatus",
    "RunStatus",
    "SignalSnapshot",
    "SignalWaitSnapshot",
    "StepSnapshot",
    "StepStatus",
    "TaskFailureSnapshot",
    "WaitSnapshot",
    "WaitStatus",
    "WorkflowRunSnapshot",
    "WorkflowRunSummary",
]


class RunStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUSPENDED = "suspended"
    CANCELLING = "cancelling"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    CONTINUED_AS_NEW = "continued_as_new"


TERMINAL_STATUSES = frozenset(
    {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.CONTINUED_AS_NEW}
)


class StepStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class WaitStatus(StrEnum):
    WAITING = "waiting"
    COMPLETED = "completed"
    CANCELLED = "cancelled"


class HookStatus(StrEnum):
    ACTIVE = "active"
    RECEIVED = "received"
    DISPOSED = "disposed"
    CANCELLED = "cancelled"


class StepSnapshot(FrozenModel):
    step_id: str
    step_name: str
    status: StepStatus
    input: JSON = None
    retry: RetryPolicy
    attempt: int
    output: JSON = None
    error: str | None = None
    retry_after: datetime | None = None


class WaitSnapshot(FrozenModel):
    wait_id: str
    status: WaitStatus
    resume_at: datetime


class HookSnapshot(FrozenModel):
    """A hook; its token is never part of a snapshot."""

    hook_id: str
    status: HookStatus
    metadata: JSON = None
    payload: JSON = None


class SignalSnapshot(FrozenModel):
    signal_id: str
    name: str
    payload: JSON = None
    received_sequence: int
    consumed_by: str | None = None


class SignalWaitSnapshot(FrozenModel):
    wait_id: str
    signal_name: str
    status: WaitStatus
    created_sequence: int
    signal_id: str | None = None


class ChildWorkflowSnapshot(FrozenModel):
    child_id: str
    run_id: str
    spec: WorkflowSpec
    input: JSON = None
    cancellation_policy: ChildCancellationPolicy
    requested_sequence: int
    outcome: TerminalOutcome | None = None


class CancellationSnapshot(FrozenModel):
    reason: str | None = None
    requested_at: datetime
    sequence: int


class TaskFailureSnapshot(FrozenModel):
    """Why a running run is not moving: its workflow code failed ``attempt`` times in a row."""

    attempt: int
    error_type: str
    message: str
    #: When the task is retried by itself; ``None``: on new input or an operator retry only.
    retry_at: datetime | None = None


class WorkflowRunSnapshot(FrozenModel):
    run_id: str
    spec: WorkflowSpec
    input: JSON = None
    status: RunStatus
    parent: ParentLink | None = None
    steps: dict[str, StepSnapshot] = {}
    waits: dict[str, WaitSnapshot] = {}
    hooks: dict[str, HookSnapshot] = {}
    signals: list[SignalSnapshot] = []
    signal_waits: dict[str, SignalWaitSnapshot] = {}
    children: dict[str, ChildWorkflowSnapshot] = {}
    progress: list[WorkflowProgress] = []
    cancellation: CancellationSnapshot | None = None
    output: JSON = None
    error: str | None = None
    outcome: TerminalOutcome | None = None
    #: Set while the run's workflow task is failing (its status stays running).
    task_failure: TaskFailureSnapshot | None = None
    last_sequence: int
    updated_at: datetime

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


class WorkflowRunSummary(FrozenModel):
    """Counts of runs per status, and open suspensions of non-terminal runs."""

    total_runs: int = 0
    by_status: dict[RunStatus, int] = {}
    open_waits: int = 0
    active_hooks: int = 0
    pending_retries: int = 0
    open_children: int = 0
    open_signal_waits: int = 0
