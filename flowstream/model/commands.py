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
        return CompleteCommand(output=output)

    @staticmethod
    def fail(error: str) -> FailCommand:
        return FailCommand(error=error)

    @staticmethod
    def cancel() -> CancelCommand:
        return CancelCommand()

    @staticmethod
    def timeout(deadline: datetime, reason: str | None = None) -> TimeoutCommand:
        return TimeoutCommand(deadline=deadline, reason=reason)

    @staticmethod
    def continue_as_new(input: JSON = None) -> ContinueAsNewCommand:
        return ContinueAsNewCommand(input=input)

    @staticmethod
    def record_progress(
        progress_id: str, completed: int, total: int | None = None, message: str | None = None
    ) -> RecordProgressCommand:
        return RecordProgressCommand(
            progress=WorkflowProgress(
                progress_id=progress_id, completed=completed, total=total, message=message
            )
        )

    @staticmethod
    def schedule_step(
        step_id: str, step_name: str, input: JSON = None, retry: RetryPolicy | None = None
    ) -> ScheduleStepCommand:
        return ScheduleStepCommand(
            step=StepCommand(
                step_id=step_id, step_name=step_name, input=input, retry=retry or DEFAULT_RETRY
            )
        )

    @staticmethod
    def schedule_steps(steps: Sequence[StepCommand]) -> ScheduleStepsCommand:
        return ScheduleStepsCommand(steps=tuple(steps))

    @staticmethod
    def wait_until(wait_id: str, resume_at: datetime) -> WaitUntilCommand:
        return WaitUntilCommand(wait_id=wait_id, resume_at=resume_at)

    @staticmethod
    def wait_for_signal(wait_id: str, signal_name: str) -> WaitForSignalCommand:
        return WaitForSignalCommand(wait_id=wait_id, signal_name=signal_name)

    @staticmethod
    def create_hook(
        hook_id: str,
        token: str | None = None,
        metadata: JSON = None,
        *,
        token_digest: str | None = None,
    ) -> CreateHookCommand:
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
        return StartChildWorkflowCommand(
            child=ChildWorkflowCommand(
                child_id=child_id, spec=spec, input=input, cancellation_policy=cancellation_policy
            )
        )

    @staticmethod
    def start_child_workflows(
        children: Sequence[ChildWorkflowCommand],
    ) -> StartChildWorkflowsCommand:
        return StartChildWorkflowsCommand(children=tuple(children))


class CompleteCommand(RuntimeCommand):
    type: Literal["complete"] = "complete"
    output: JSON = None


class FailCommand(RuntimeCommand):
    type: Literal["fail"] = "fail"
    error: str


class CancelCommand(RuntimeCommand):
    type: Literal["cancel"] = "cancel"


class TimeoutCommand(RuntimeCommand):
    type: Literal["timeout"] = "timeout"
    deadline: datetime
    reason: str | None = None


class ContinueAsNewCommand(RuntimeCommand):
    type: Literal["continue_as_new"] = "continue_as_new"
    input: JSON = None


class RecordProgressCommand(RuntimeCommand):
    type: Literal["record_progress"] = "record_progress"
    progress: WorkflowProgress


class ScheduleStepCommand(RuntimeCommand):
    type: Literal["schedule_step"] = "schedule_step"
    step: StepCommand


class ScheduleStepsCommand(RuntimeCommand):
    type: Literal["schedule_steps"] = "schedule_steps"
    steps: tuple[StepCommand, ...]


class WaitUntilCommand(RuntimeCommand):
    type: Literal["wait_until"] = "wait_until"
    wait_id: str = Field(min_length=1, max_length=200)
    resume_at: datetime


class WaitForSignalCommand(RuntimeCommand):
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
    type: Literal["start_child_workflow"] = "start_child_workflow"
    child: ChildWorkflowCommand


class StartChildWorkflowsCommand(RuntimeCommand):
    type: Literal["start_child_workflows"] = "start_child_workflows"
    children: tuple[ChildWorkflowCommand, ...]
