"""What runtime code receives: invocations, and ``WorkflowContext``, the one door for workflow code.

Everything the context reads is derived from the durable history (through its projection), so it
is safe to use during replay: no clock, no randomness, no I/O.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TypeVar, overload

from pydantic import BaseModel, ValidationError

from flowstream.errors import SerializationError
from flowstream.model.base import JSON
from flowstream.model.commands import (
    CancelCommand,
    ChildWorkflowCommand,
    CompleteCommand,
    ContinueAsNewCommand,
    CreateHookCommand,
    FailCommand,
    RecordProgressCommand,
    RuntimeCommand,
    ScheduleStepCommand,
    ScheduleStepsCommand,
    StartChildWorkflowCommand,
    StartChildWorkflowsCommand,
    StepCommand,
    TimeoutCommand,
    WaitForSignalCommand,
    WaitUntilCommand,
)
from flowstream.model.events import (
    ChildCancellationPolicy,
    EventEnvelope,
    TerminalOutcome,
    WorkflowProgress,
)
from flowstream.model.payloads import to_json
from flowstream.model.snapshot import HookStatus, StepStatus, WaitStatus
from flowstream.model.spec import DEFAULT_RETRY, RetryPolicy, WorkflowSpec
from flowstream.replay.records import CancellationState
from flowstream.replay.state import RunState

__all__ = [
    "HistoryView",
    "StepInvocation",
    "WorkflowContext",
    "WorkflowInvocation",
    "decode_as",
]

M = TypeVar("M", bound=BaseModel)

#: Namespace for ``deterministic_id``; fixed forever so ids are stable across versions.
_ID_NAMESPACE = uuid.UUID("6f1c7a52-3d0e-5b8a-9c41-0f5e2d7b9a13")


def decode_as(model: type[M], value: JSON, what: str) -> M:
    """Decode committed JSON into ``model``; a mismatch is a ``SerializationError``."""
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise SerializationError(f"{what} does not decode as {model.__name__}: {exc}") from exc


def step_idempotency_key(run_id: str, step_id: str) -> str:
    """Stable across attempts of one step: hand it to the external system."""
    return f"flow:{run_id}:{step_id}"


class HistoryView(Sequence[EventEnvelope]):
    """A read-only view of the first ``length`` events of a history (O(1) to make).

    Histories only grow, so the view stays exactly what it was when the invocation was built.
    """

    __slots__ = ("_events", "_length")

    def __init__(self, events: Sequence[EventEnvelope], length: int) -> None:
        self._events = events
        self._length = length

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> EventEnvelope: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[EventEnvelope]: ...

    def __getitem__(self, index: int | slice) -> EventEnvelope | Sequence[EventEnvelope]:
        if isinstance(index, slice):
            return tuple(self._events[: self._length])[index]
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError("history index out of range")
        return self._events[index]

    def __repr__(self) -> str:
        return f"HistoryView({self._length} events)"


@dataclass(frozen=True, slots=True)
class WorkflowInvocation:
    """Input to ``FlowRuntime.run_workflow``: the run, its pinned spec, input and full history."""

    run_id: str
    spec: WorkflowSpec
    input: JSON
    history: Sequence[EventEnvelope]
    _state: RunState = field(repr=False, compare=False)

    def context(self) -> WorkflowContext:
        """Read helpers and command builders over this invocation's history."""
        return WorkflowContext(self._state)


@dataclass(frozen=True, slots=True)
class StepInvocation:
    """Input to ``FlowRuntime.run_step``. ``attempt`` is the same when an attempt is redelivered."""

    run_id: str
    step_id: str
    step_name: str
    attempt: int
    input: JSON
    history: Sequence[EventEnvelope] = field(repr=False)
    idempotency_key: str = ""

    def input_as(self, model: type[M]) -> M:
        """The step's input decoded as ``model`` (``SerializationError`` if it does not fit)."""
        return decode_as(model, self.input, f"input of step {self.step_id}")


class WorkflowContext:
    """Replay-safe read helpers and command builders over one run's history.

    Use a context only while ``run_workflow`` runs: ``history`` stays the history the invocation
    was given, but the read helpers look at the run's projection, which later cycles advance.
    """

    __slots__ = ("_length", "_state")

    def __init__(self, state: RunState) -> None:
        self._state = state
        self._length = state.last_sequence

    # -- reads ----------------------------------------------------------------------------

    @property
    def state(self) -> RunState:
        """The run's projection of the history (read it; never change it)."""
        return self._state

    @property
    def run_id(self) -> str:
        """The run's id."""
        return self._state.run_id

    @property
    def spec(self) -> WorkflowSpec:
        """The spec the run is pinned to."""
        return self._state.spec

    @property
    def input(self) -> JSON:
        """The run's input, as committed JSON."""
        return self._state.input

    @property
    def history(self) -> Sequence[EventEnvelope]:
        """The events the invocation was given (a view that does not grow)."""
        return HistoryView(self._state.history, self._length)

    def input_as(self, model: type[M]) -> M:
        """The run's input decoded as ``model`` (``SerializationError`` if it does not fit)."""
        return decode_as(model, self._state.input, f"input of run {self.run_id}")

    def has_patch_marker(self, marker: str) -> bool:
        """Whether the run was pinned with patch marker ``marker``."""
        return self._state.spec.has_patch_marker(marker)

    def logical_time(self) -> datetime:
        """Commit time of the last event: the only clock workflow code may read."""
        updated = self._state.updated_at
        assert updated is not None
        return updated

    def deterministic_id(self, name: str) -> str:
        """A UUID derived from the run id and ``name``: the same on every replay."""
        run_id = self._state.run_id
        return str(uuid.uuid5(_ID_NAMESPACE, f"{len(run_id)}/{run_id}{len(name)}/{name}"))

    def step_completed(self, step_id: str) -> bool:
        """Whether step ``step_id`` has a committed output."""
        step = self._state.steps.get(step_id)
        return step is not None and step.status is StepStatus.COMPLETED

    def step_output(self, step_id: str) -> JSON:
        """Committed output of a completed step, else ``None`` (see ``step_completed``)."""
        step = self._state.steps.get(step_id)
        if step is None or step.status is not StepStatus.COMPLETED:
            return None
        return step.output

    def step_output_as(self, step_id: str, model: type[M]) -> M | None:
        """The output of a completed step decoded as ``model``, else ``None``."""
        if not self.step_completed(step_id):
            return None
        return decode_as(model, self.step_output(step_id), f"output of step {step_id}")

    def step_failed(self, step_id: str) -> str | None:
        """The final error of a failed step, else ``None``."""
        step = self._state.steps.get(step_id)
        if step is None or step.status is not StepStatus.FAILED:
            return None
        return step.error

    def step_cancelled(self, step_id: str) -> bool:
        """Whether step ``step_id`` was cancelled (by a cancellation request or a batch
        abort)."""
        step = self._state.steps.get(step_id)
        return step is not None and step.status is StepStatus.CANCELLED

    def wait_completed(self, wait_id: str) -> bool:
        """Whether timer ``wait_id`` has fired."""
        wait = self._state.waits.get(wait_id)
        return wait is not None and wait.status is WaitStatus.COMPLETED

    def signal_received(self, wait_id: str) -> bool:
        """Whether the signal wait ``wait_id`` has been paired with a signal."""
        wait = self._state.signal_waits.get(wait_id)
        return wait is not None and wait.status is WaitStatus.COMPLETED

    def signal_payload(self, wait_id: str) -> JSON:
        """Payload of the signal paired with signal wait ``wait_id``, else ``None``."""
        wait = self._state.signal_waits.get(wait_id)
        if wait is None or wait.signal_id is None:
            return None
        return self._state.signals[wait.signal_id].payload

    def signal_payload_as(self, wait_id: str, model: type[M]) -> M | None:
        """The payload paired with signal wait ``wait_id`` decoded as ``model``, else
        ``None``."""
        if not self.signal_received(wait_id):
            return None
        return decode_as(model, self.signal_payload(wait_id), f"signal for wait {wait_id}")

    def hook_received(self, hook_id: str) -> bool:
        """Whether hook ``hook_id`` has received its payload."""
        hook = self._state.hooks.get(hook_id)
        return hook is not None and hook.received

    def hook_payload(self, hook_id: str) -> JSON:
        """The payload hook ``hook_id`` received, else ``None``."""
        hook = self._state.hooks.get(hook_id)
        return None if hook is None else hook.payload

    def hook_payload_as(self, hook_id: str, model: type[M]) -> M | None:
        """The payload hook ``hook_id`` received decoded as ``model``, else ``None``."""
        if not self.hook_received(hook_id):
            return None
        return decode_as(model, self.hook_payload(hook_id), f"payload of hook {hook_id}")

    def hook_disposed(self, hook_id: str) -> bool:
        """Whether hook ``hook_id`` was disposed."""
        hook = self._state.hooks.get(hook_id)
        return hook is not None and hook.status is HookStatus.DISPOSED

    def child_workflow_outcome(self, child_id: str) -> TerminalOutcome | None:
        """How child ``child_id`` ended, else ``None`` (not requested, or still running)."""
        child = self._state.children.get(child_id)
        return None if child is None else child.outcome

    def child_workflow_run_id(self, child_id: str) -> str | None:
        """The run id of child ``child_id``, once requested."""
        child = self._state.children.get(child_id)
        return None if child is None else child.run_id

    def cancellation_request(self) -> CancellationState | None:
        """The durable cancellation request, if any (clean up, then return ``cancel``)."""
        return self._state.cancellation

    def progress(self, progress_id: str) -> WorkflowProgress | None:
        """The progress recorded under ``progress_id``, if any."""
        return self._state.progress.get(progress_id)

    # -- command builders -----------------------------------------------------------------

    def complete(self, output: object = None) -> CompleteCommand:
        """End the run completed with ``output`` (JSON, a model or a dataclass)."""
        return RuntimeCommand.complete(to_json(output, "output"))

    def fail(self, error: str) -> FailCommand:
        """End the run failed with ``error``."""
        return RuntimeCommand.fail(error)

    def cancel(self) -> CancelCommand:
        """End the run cancelled (only after a durable cancellation request)."""
        return RuntimeCommand.cancel()

    def timeout(self, deadline: datetime, reason: str | None = None) -> TimeoutCommand:
        """End the run timed out at ``deadline``."""
        return RuntimeCommand.timeout(deadline, reason)

    def continue_as_new(self, input: object = None) -> ContinueAsNewCommand:
        """Close this run and start its successor (same spec) with ``input``."""
        return RuntimeCommand.continue_as_new(to_json(input, "continue-as-new input"))

    def record_progress(
        self, progress_id: str, completed: int, total: int | None = None, message: str | None = None
    ) -> RecordProgressCommand:
        """Record progress under a stable ``progress_id`` (each value once)."""
        return RuntimeCommand.record_progress(progress_id, completed, total, message)

    def step(
        self, step_id: str, step_name: str, input: object = None, retry: RetryPolicy | None = None
    ) -> StepCommand:
        """One member of a ``schedule_steps`` batch (``input``: JSON, a model or a dataclass)."""
        return StepCommand(
            step_id=step_id,
            step_name=step_name,
            input=to_json(input, f"input of step {step_id}"),
            retry=retry or DEFAULT_RETRY,
        )

    def schedule_step(
        self, step_id: str, step_name: str, input: object = None, retry: RetryPolicy | None = None
    ) -> ScheduleStepCommand:
        """Run handler ``step_name`` as step ``step_id`` (``input``: JSON, a model or a
        dataclass)."""
        return ScheduleStepCommand(step=self.step(step_id, step_name, input, retry))

    def schedule_steps(self, steps: Sequence[StepCommand]) -> ScheduleStepsCommand:
        """Run ``steps`` as one atomic batch (all identities validated before any starts)."""
        return RuntimeCommand.schedule_steps(steps)

    def wait_until(self, wait_id: str, resume_at: datetime) -> WaitUntilCommand:
        """Suspend until timer ``wait_id`` fires at ``resume_at`` (UTC)."""
        return RuntimeCommand.wait_until(wait_id, resume_at)

    def wait_for_signal(self, wait_id: str, signal_name: str) -> WaitForSignalCommand:
        """Suspend until a signal ``signal_name`` pairs with signal wait ``wait_id``."""
        return RuntimeCommand.wait_for_signal(wait_id, signal_name)

    def create_hook(
        self,
        hook_id: str,
        token: str | None = None,
        metadata: object = None,
        *,
        token_digest: str | None = None,
    ) -> CreateHookCommand:
        """Suspend until the hook is resumed (by run+hook id, or by its token alone)."""
        meta = to_json(metadata, f"metadata of hook {hook_id}")
        return RuntimeCommand.create_hook(hook_id, token, meta, token_digest=token_digest)

    def wait_for(self, wait_id: str, delay: timedelta) -> WaitUntilCommand:
        """A timer ``delay`` after the logical time at which it is first created.

        Once the wait exists its durable deadline is reused, so replays agree.
        """
        wait = self._state.waits.get(wait_id)
        resume_at = wait.resume_at if wait is not None else self.logical_time() + delay
        return RuntimeCommand.wait_until(wait_id, resume_at)

    def child_workflow(
        self,
        child_id: str,
        spec: WorkflowSpec,
        input: object = None,
        cancellation_policy: ChildCancellationPolicy = (
            ChildCancellationPolicy.REQUEST_CANCELLATION
        ),
    ) -> ChildWorkflowCommand:
        """One member of a ``start_child_workflows`` batch."""
        return ChildWorkflowCommand(
            child_id=child_id,
            spec=spec,
            input=to_json(input, f"input of child {child_id}"),
            cancellation_policy=cancellation_policy,
        )

    def start_child_workflow(
        self,
        child_id: str,
        spec: WorkflowSpec,
        input: object = None,
        cancellation_policy: ChildCancellationPolicy = (
            ChildCancellationPolicy.REQUEST_CANCELLATION
        ),
    ) -> StartChildWorkflowCommand:
        """Start child ``child_id`` of ``spec`` and wait for its outcome."""
        child = self.child_workflow(child_id, spec, input, cancellation_policy)
        return StartChildWorkflowCommand(child=child)

    def start_child_workflows(
        self, children: Sequence[ChildWorkflowCommand]
    ) -> StartChildWorkflowsCommand:
        """Start ``children`` as one atomic batch and wait for their outcomes."""
        return RuntimeCommand.start_child_workflows(children)
