"""The closed set of history events and the envelope that carries them.

Each event has a snake_case ``type`` and a stable dot key (``event_key()``), e.g.
``step_completed`` → ``flow.step.completed``. Hook tokens never enter the history: a
``hook_created`` event stores the SHA-256 digest of the token, which is enough to check
determinism and to rebuild the token index, and leaks nothing when the log is read.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, ClassVar, Literal

from pydantic import Field, field_validator

from flowstream.model.base import JSON, FrozenModel
from flowstream.model.spec import RetryPolicy, WorkflowSpec

__all__ = [
    "EVENT_SCHEMA_VERSION",
    "ChildCancellationPolicy",
    "ChildWorkflowRequested",
    "ChildWorkflowResolved",
    "EventEnvelope",
    "FlowEvent",
    "HookCreated",
    "HookDisposed",
    "HookReceived",
    "ParentLink",
    "RunCancellationRequested",
    "RunCancelled",
    "RunCompleted",
    "RunContinuedAsNew",
    "RunCreated",
    "RunFailed",
    "RunProgressRecorded",
    "RunRetryExhausted",
    "RunStarted",
    "RunTimedOut",
    "SignalReceived",
    "SignalWaitCompleted",
    "SignalWaitCreated",
    "StepCancelled",
    "StepCompleted",
    "StepCreated",
    "StepFailed",
    "StepNonRetryable",
    "StepRetrying",
    "StepStarted",
    "TerminalOutcome",
    "WaitCompleted",
    "WaitCreated",
    "WorkflowProgress",
    "WorkflowTaskFailed",
]

EVENT_SCHEMA_VERSION = 1


class ChildCancellationPolicy(StrEnum):
    REQUEST_CANCELLATION = "request_cancellation"
    ABANDON = "abandon"


class WorkflowProgress(FrozenModel):
    progress_id: str = Field(min_length=1, max_length=200)
    completed: int = Field(ge=0)
    total: int | None = Field(default=None, gt=0)
    message: str | None = None


class ParentLink(FrozenModel):
    """Where a run came from: a parent's child request, or a predecessor's continuation.

    ``hop`` is a continuation's place in its chain (the root's successor is hop 1), so the
    continuation limit is checked without reading the runs before it. In the chain of a child,
    a continuation also names the parent it ``reports_to`` and the ``child_id`` there, so the
    chain's last run resolves the child without reading the runs before it either. A
    continuation names its chain's ``root`` (the first run), which may live on another
    partition than the run (``None`` for a child's link, and in links written before it).
    """

    run_id: str
    child_id: str | None = None
    continued: bool = False
    hop: int = Field(default=0, ge=0)
    reports_to: str | None = None
    root: str | None = None


class TerminalOutcome(FrozenModel):
    """How a run ended. ``type`` is completed, failed, cancelled, timed_out,
    retry_exhausted or continued_as_new."""

    type: Literal[
        "completed", "failed", "cancelled", "timed_out", "retry_exhausted", "continued_as_new"
    ]
    output: JSON = None
    error: str | None = None
    step_id: str | None = None
    successor_run_id: str | None = None


class _Event(FrozenModel):
    KEY: ClassVar[str] = ""

    def event_key(self) -> str:
        """Stable dot key, e.g. ``flow.step.completed``."""
        return self.KEY


# -- run lifecycle ---------------------------------------------------------------------------


class RunCreated(_Event):
    KEY: ClassVar[str] = "flow.run.created"
    type: Literal["run_created"] = "run_created"
    spec: WorkflowSpec
    input: JSON = None
    parent: ParentLink | None = None
    depth: int = 0


class RunStarted(_Event):
    KEY: ClassVar[str] = "flow.run.started"
    type: Literal["run_started"] = "run_started"


class RunCompleted(_Event):
    KEY: ClassVar[str] = "flow.run.completed"
    type: Literal["run_completed"] = "run_completed"
    output: JSON = None


class RunFailed(_Event):
    KEY: ClassVar[str] = "flow.run.failed"
    type: Literal["run_failed"] = "run_failed"
    error: str


class RunCancellationRequested(_Event):
    KEY: ClassVar[str] = "flow.run.cancellation.requested"
    type: Literal["run_cancellation_requested"] = "run_cancellation_requested"
    reason: str | None = None


class RunCancelled(_Event):
    KEY: ClassVar[str] = "flow.run.cancelled"
    type: Literal["run_cancelled"] = "run_cancelled"
    reason: str | None = None


class RunTimedOut(_Event):
    KEY: ClassVar[str] = "flow.run.timed_out"
    type: Literal["run_timed_out"] = "run_timed_out"
    deadline: datetime
    reason: str | None = None


class RunRetryExhausted(_Event):
    KEY: ClassVar[str] = "flow.run.retry_exhausted"
    type: Literal["run_retry_exhausted"] = "run_retry_exhausted"
    step_id: str
    attempt: int
    error: str


class RunContinuedAsNew(_Event):
    KEY: ClassVar[str] = "flow.run.continued_as_new"
    type: Literal["run_continued_as_new"] = "run_continued_as_new"
    successor_run_id: str
    input: JSON = None


class RunProgressRecorded(_Event):
    KEY: ClassVar[str] = "flow.run.progress.recorded"
    type: Literal["run_progress_recorded"] = "run_progress_recorded"
    progress: WorkflowProgress


class WorkflowTaskFailed(_Event):
    """Workflow code could not decide: it raised, returned something that is not a command, or
    decided against its own history. An engine record, not a decision: ``attempt`` counts the
    consecutive failures since the run last moved, ``message`` is the exception's text only
    (at most 500 characters), and ``retry_at`` is when the task is retried by itself (``None``:
    not before new input or an operator retry).

    ``undone_hook`` names a hook whose creation the failure undoes: on Kafka a hook's token is
    claimed on another partition after ``hook_created`` committed, and a claim that loses to an
    active one is recorded as this failure (``HookTokenConflictError``), which removes the hook
    as if its creation had been refused; the retried task creates it again."""

    KEY: ClassVar[str] = "flow.workflow.task.failed"
    type: Literal["workflow_task_failed"] = "workflow_task_failed"
    attempt: int = Field(ge=1)
    error_type: str = Field(min_length=1, max_length=200)
    message: str = Field(max_length=500)
    retry_at: datetime | None = None
    undone_hook: str | None = None


# -- steps -----------------------------------------------------------------------------------


class StepCreated(_Event):
    KEY: ClassVar[str] = "flow.step.created"
    type: Literal["step_created"] = "step_created"
    step_id: str
    step_name: str
    input: JSON = None
    retry: RetryPolicy = RetryPolicy()


class StepStarted(_Event):
    KEY: ClassVar[str] = "flow.step.started"
    type: Literal["step_started"] = "step_started"
    step_id: str
    attempt: int = Field(ge=1)


class StepCompleted(_Event):
    KEY: ClassVar[str] = "flow.step.completed"
    type: Literal["step_completed"] = "step_completed"
    step_id: str
    output: JSON = None


class StepRetrying(_Event):
    KEY: ClassVar[str] = "flow.step.retrying"
    type: Literal["step_retrying"] = "step_retrying"
    step_id: str
    attempt: int
    error: str
    retry_after: datetime | None = None


class StepFailed(_Event):
    KEY: ClassVar[str] = "flow.step.failed"
    type: Literal["step_failed"] = "step_failed"
    step_id: str
    attempt: int
    error: str


class StepNonRetryable(_Event):
    KEY: ClassVar[str] = "flow.step.non_retryable"
    type: Literal["step_non_retryable"] = "step_non_retryable"
    step_id: str
    attempt: int
    error: str


class StepCancelled(_Event):
    KEY: ClassVar[str] = "flow.step.cancelled"
    type: Literal["step_cancelled"] = "step_cancelled"
    step_id: str
    attempt: int
    reason: str


# -- timers, signals, hooks -------------------------------------------------------------------


class WaitCreated(_Event):
    KEY: ClassVar[str] = "flow.wait.created"
    type: Literal["wait_created"] = "wait_created"
    wait_id: str
    resume_at: datetime


class WaitCompleted(_Event):
    KEY: ClassVar[str] = "flow.wait.completed"
    type: Literal["wait_completed"] = "wait_completed"
    wait_id: str


class SignalReceived(_Event):
    KEY: ClassVar[str] = "flow.signal.received"
    type: Literal["signal_received"] = "signal_received"
    signal_id: str
    name: str
    payload: JSON = None


class SignalWaitCreated(_Event):
    KEY: ClassVar[str] = "flow.signal.wait.created"
    type: Literal["signal_wait_created"] = "signal_wait_created"
    wait_id: str
    signal_name: str


class SignalWaitCompleted(_Event):
    KEY: ClassVar[str] = "flow.signal.wait.completed"
    type: Literal["signal_wait_completed"] = "signal_wait_completed"
    wait_id: str
    signal_id: str


class HookCreated(_Event):
    KEY: ClassVar[str] = "flow.hook.created"
    type: Literal["hook_created"] = "hook_created"
    hook_id: str
    token_digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    metadata: JSON = None


class HookReceived(_Event):
    KEY: ClassVar[str] = "flow.hook.received"
    type: Literal["hook_received"] = "hook_received"
    hook_id: str
    payload: JSON = None


class HookDisposed(_Event):
    KEY: ClassVar[str] = "flow.hook.disposed"
    type: Literal["hook_disposed"] = "hook_disposed"
    hook_id: str


# -- child workflows ------------------------------------------------------------------------


class ChildWorkflowRequested(_Event):
    KEY: ClassVar[str] = "flow.child.workflow.requested"
    type: Literal["child_workflow_requested"] = "child_workflow_requested"
    child_id: str
    child_run_id: str
    spec: WorkflowSpec
    input: JSON = None
    cancellation_policy: ChildCancellationPolicy = ChildCancellationPolicy.REQUEST_CANCELLATION


class ChildWorkflowResolved(_Event):
    KEY: ClassVar[str] = "flow.child.workflow.resolved"
    type: Literal["child_workflow_resolved"] = "child_workflow_resolved"
    child_id: str
    outcome: TerminalOutcome


FlowEvent = Annotated[
    RunCreated
    | RunStarted
    | RunCompleted
    | RunFailed
    | RunCancellationRequested
    | RunCancelled
    | RunTimedOut
    | RunRetryExhausted
    | RunContinuedAsNew
    | RunProgressRecorded
    | StepCreated
    | StepStarted
    | StepCompleted
    | StepRetrying
    | StepFailed
    | StepNonRetryable
    | StepCancelled
    | WaitCreated
    | WaitCompleted
    | SignalReceived
    | SignalWaitCreated
    | SignalWaitCompleted
    | HookCreated
    | HookReceived
    | HookDisposed
    | ChildWorkflowRequested
    | ChildWorkflowResolved
    | WorkflowTaskFailed,
    Field(discriminator="type"),
]


class EventEnvelope(FrozenModel):
    """One committed event: its run, 1-based contiguous sequence, id and commit time."""

    run_id: str
    sequence: int = Field(ge=1)
    event_id: str
    timestamp: datetime
    event: FlowEvent
    schema_version: int = EVENT_SCHEMA_VERSION

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, value: int) -> int:
        if value != EVENT_SCHEMA_VERSION:
            raise ValueError(
                f"event schema version {value} is not supported (this build reads "
                f"{EVENT_SCHEMA_VERSION}); upgrade flowstream to read it"
            )
        return value
