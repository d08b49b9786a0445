"""Decisions workflow code returns: exactly one ``RuntimeCommand`` per replay cycle.

``RuntimeCommand`` is the base of every variant and also carries the static constructors
(``RuntimeCommand.schedule_step(...)``, ``RuntimeCommand.schedule_steps([...])``…); workflow code
usually builds commands through ``invocation.context()`` instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Literal, Self

from pydantic import Field, SecretStr, model_validator

from flowstream.model.base import JSON, FrozenModel
from flowstream.model.events import ChildCancellationPolicy, WorkflowProgress
from flowstream.model.spec import DEFAULT_RETRY, RetryPolicy, WorkflowSpec

__all__ = [
    "CancelCommand",
    "ChildWorkflowCommand",
    "CompleteCommand",
    "ContinueAsNewCommand",
    "CreateHookCommand",
    "FailCommand",
    "RecordProgressCommand",
    "RuntimeCommand",
    "ScheduleStepCommand",
    "ScheduleStepsCommand",
    "StartChildWorkflowCommand",
    "StartChildWorkflowsCommand",
    "StepCommand",
    "TimeoutCommand",
    "WaitForSignalCommand",
    "WaitUntilCommand",
]

MAX_BATCH_SIZE = 256


class StepCommand(FrozenModel):
    """One step: stable id, handler name, JSON input, retry policy."""

    step_id: str = Field(min_length=1, max_length=200)
    step_name: str = Field(min_length=1, max_length=200)
    input: JSON = None
    retry: RetryPolicy = RetryPolicy()

    def with_retry(self, retry: RetryPolicy) -> StepCommand:
        """The same step with another retry policy."""
        return self.model_copy(update={"retry": retry})


class ChildWorkflowCommand(FrozenModel):
    """One child workflow: stable id inside the parent, spec, input and cancellation policy."""

    child_id: str = Field(min_length=1, max_length=200)
    spec: WorkflowSpec
    input: JSON = None
    cancellation_policy: ChildCancellationPolicy = ChildCancellationPolicy.REQUEST_CANCELLATION


class RuntimeCommand(FrozenModel):
    """Base of every decision; its class methods build the variants."""

    @staticmethod
    def complete(output: JSON = None) -> CompleteCommand:
        """End the run completed with ``output``."""
        return CompleteCommand(output=output)

    @staticmethod
    def fail(error: str) -> FailCommand:
        """End the run failed with ``error``."""
        return FailCommand(error=error)

    @staticmethod
    def cancel() -> CancelCommand:
        """End the run cancelled (after a durable cancellation request)."""
        return CancelCommand()

    @staticmethod
    def timeout(deadline: datetime, reason: str | None = None) -> TimeoutCommand:
        """End the run timed out at ``deadline``."""
        return TimeoutCommand(deadline=deadline, reason=reason)

    @staticmethod
    def continue_as_new(input: JSON = None) -> ContinueAsNewCommand:
        """Close the run and start its successor with ``input``."""
        return ContinueAsNewCommand(input=input)

    @staticmethod
    def record_progress(
        progress_id: str, completed: int, total: int | None = None, message: str | None = None
    ) -> RecordProgressCommand:
        """Record progress under a stable ``progress_id``."""
        return RecordProgressCommand(
            progress=WorkflowProgress(
                progress_id=progress_id, completed=completed, total=total, message=message
            )
        )

    @staticmethod
    def schedule_step(
        step_id: str, step_name: str, input: JSON = None, retry: RetryPolicy | None = None
    ) -> ScheduleStepCommand:
        """Run handler ``step_name`` as step ``step_id``."""
        return ScheduleStepCommand(
            step=StepCommand(
                step_id=step_id, step_name=step_name, input=input, retry=retry or DEFAULT_RETRY
            )
        )

    @staticmethod
    def schedule_steps(steps: Sequence[StepCommand]) -> ScheduleStepsCommand:
        """Run ``steps`` as one atomic batch."""
        return ScheduleStepsCommand(steps=tuple(steps))

    @staticmethod
    def wait_until(wait_id: str, resume_at: datetime) -> WaitUntilCommand:
        """Suspend until timer ``wait_id`` fires at ``resume_at``."""
        return WaitUntilCommand(wait_id=wait_id, resume_at=resume_at)

    @staticmethod
    def wait_for_signal(wait_id: str, signal_name: str) -> WaitForSignalCommand:
        """Suspend until a signal ``signal_name`` pairs with wait ``wait_id``."""
        return WaitForSignalCommand(wait_id=wait_id, signal_name=signal_name)

    @staticmethod
    def create_hook(
        hook_id: str,
        token: str | None = None,
        metadata: JSON = None,
        *,
        token_digest: str | None = None,
    ) -> CreateHookCommand:
        """Suspend until hook ``hook_id`` is resumed (by token, or by run and hook id)."""
        return CreateHookCommand(
            hook_id=hook_id,
            token=None if token is None else SecretStr(token),
            token_digest=token_digest,
            metadata=metadata,
        )

    @staticmethod
    def start_child_workflow(
        child_id: str,
        spec: WorkflowSpec,
        input: JSON = None,
        cancellation_policy: ChildCancellationPolicy = (
            ChildCancellationPolicy.REQUEST_CANCELLATION
        ),
    ) -> StartChildWorkflowCommand:
        """Start child ``child_id`` and wait for its outcome."""
        return StartChildWorkflowCommand(
            child=ChildWorkflowCommand(
                child_id=child_id, spec=spec, input=input, cancellation_policy=cancellation_policy
            )
        )

    @staticmethod
    def start_child_workflows(
        children: Sequence[ChildWorkflowCommand],
    ) -> StartChildWorkflowsCommand:
        """Start ``children`` as one atomic batch and wait for their outcomes."""
        return StartChildWorkflowsCommand(children=tuple(children))


class CompleteCommand(RuntimeCommand):
    """End the run completed with ``output``."""

    type: Literal["complete"] = "complete"
    output: JSON = None


class FailCommand(RuntimeCommand):
    """End the run failed with ``error``."""

    type: Literal["fail"] = "fail"
    error: str


class CancelCommand(RuntimeCommand):
    """End the run cancelled, after a durable cancellation request."""

    type: Literal["cancel"] = "cancel"


class TimeoutCommand(RuntimeCommand):
    """End the run timed out at ``deadline``."""

    type: Literal["timeout"] = "timeout"
    deadline: datetime
    reason: str | None = None


class ContinueAsNewCommand(RuntimeCommand):
    """Close the run and start its successor (same spec) with ``input``."""

    type: Literal["continue_as_new"] = "continue_as_new"
    input: JSON = None


class RecordProgressCommand(RuntimeCommand):
    """Record ``progress`` (each progress id holds one value)."""

    type: Literal["record_progress"] = "record_progress"
    progress: WorkflowProgress


class ScheduleStepCommand(RuntimeCommand):
    """Run one step."""

    type: Literal["schedule_step"] = "schedule_step"
    step: StepCommand


class ScheduleStepsCommand(RuntimeCommand):
    """Run several steps as one atomic batch."""

    type: Literal["schedule_steps"] = "schedule_steps"
    steps: tuple[StepCommand, ...]


class WaitUntilCommand(RuntimeCommand):
    """Suspend until a durable timer fires."""

    type: Literal["wait_until"] = "wait_until"
    wait_id: str = Field(min_length=1, max_length=200)
    resume_at: datetime


class WaitForSignalCommand(RuntimeCommand):
    """Suspend until a named signal pairs with this wait."""

    type: Literal["wait_for_signal"] = "wait_for_signal"
    wait_id: str = Field(min_length=1, max_length=200)
    signal_name: str = Field(min_length=1)


class CreateHookCommand(RuntimeCommand):
    """Create a hook; the token is a bearer secret and is never printed.

    Give either the ``token`` or only its SHA-256 ``token_digest`` (hex): with the digest, the
    host keeps the secret and the workflow input never carries it.
    """

    type: Literal["create_hook"] = "create_hook"
    hook_id: str = Field(min_length=1, max_length=200)
    token: SecretStr | None = None
    token_digest: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    metadata: JSON = None

    @model_validator(mode="after")
    def _one_token(self) -> Self:
        if (self.token is None) == (self.token_digest is None):
            raise ValueError("create_hook needs exactly one of token or token_digest")
        return self


class StartChildWorkflowCommand(RuntimeCommand):
    """Start one child workflow and wait for its outcome."""

    type: Literal["start_child_workflow"] = "start_child_workflow"
    child: ChildWorkflowCommand


class StartChildWorkflowsCommand(RuntimeCommand):
    """Start several child workflows as one atomic batch."""

    type: Literal["start_child_workflows"] = "start_child_workflows"
    children: tuple[ChildWorkflowCommand, ...]
