"""The records a ``RunState`` keeps per step, wait, hook, signal, child and deadline of a run."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from flowstream.model.base import JSON
from flowstream.model.events import ChildCancellationPolicy, TerminalOutcome
from flowstream.model.snapshot import HookStatus, StepStatus, WaitStatus
from flowstream.model.spec import RetryPolicy, WorkflowSpec

__all__ = [
    "CancellationState",
    "ChildState",
    "FailRunFailure",
    "HookState",
    "SignalState",
    "SignalWaitState",
    "StepState",
    "TaskFailure",
    "WaitState",
    "Wakeup",
]


@dataclass(slots=True)
class StepState:
    """One step: its latest attempt and outcome."""

    step_id: str
    step_name: str
    input: JSON
    retry: RetryPolicy
    status: StepStatus = StepStatus.PENDING
    attempt: int = 0
    output: JSON = None
    error: str | None = None
    retry_after: datetime | None = None


@dataclass(slots=True)
class WaitState:
    """One durable timer."""

    wait_id: str
    resume_at: datetime
    status: WaitStatus = WaitStatus.WAITING


@dataclass(slots=True)
class HookState:
    """One hook, and the payload it received."""

    hook_id: str
    token_digest: str
    metadata: JSON
    status: HookStatus = HookStatus.ACTIVE
    payload: JSON = None
    received: bool = False
    #: The sequence of its ``hook_created`` (which claim of its token an answer is about).
    sequence: int = 0


@dataclass(slots=True)
class SignalState:
    """One received signal, and the signal wait that consumed it."""

    signal_id: str
    name: str
    payload: JSON
    received_sequence: int
    consumed_by: str | None = None


@dataclass(slots=True)
class SignalWaitState:
    """One wait for a named signal, and the signal it was paired with."""

    wait_id: str
    signal_name: str
    created_sequence: int
    status: WaitStatus = WaitStatus.WAITING
    signal_id: str | None = None


@dataclass(slots=True)
class ChildState:
    """One requested child workflow, and its outcome once resolved."""

    child_id: str
    run_id: str
    spec: WorkflowSpec
    input: JSON
    cancellation_policy: ChildCancellationPolicy
    requested_sequence: int
    outcome: TerminalOutcome | None = None


@dataclass(slots=True)
class CancellationState:
    """The run's durable cancellation request."""

    reason: str | None
    requested_at: datetime
    sequence: int


@dataclass(frozen=True, slots=True)
class Wakeup:
    """A durable deadline: a timer (``kind="wait"``), a delayed step retry (``kind="retry"``) or
    the retry of a failed workflow task (``kind="task"``, ``subject_id`` names the attempt)."""

    due: datetime
    run_id: str
    kind: str
    subject_id: str


@dataclass(slots=True)
class FailRunFailure:
    """A step failure that must end the run (retry exhausted or non-retryable, fail-run)."""

    step_id: str
    attempt: int
    error: str
    exhausted: bool


@dataclass(slots=True)
class TaskFailure:
    """The last ``workflow_task_failed`` of a run that has not moved since."""

    attempt: int
    error_type: str
    message: str
    retry_at: datetime | None
