"""Helpers for writing workflow tests quickly.

``make_runtime(workflow, steps)`` builds a ``FlowRuntime`` from a function ``ctx -> command``
(or a dict of them by workflow name) and a dict of step handlers by step name, and records every
invocation. ``FakeClock`` is an injectable clock that only moves when a test moves it.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from flowstream.model.base import JSON
from flowstream.model.commands import RuntimeCommand
from flowstream.model.events import EventEnvelope, FlowEvent, WorkflowTaskFailed
from flowstream.model.snapshot import WorkflowRunSnapshot
from flowstream.model.spec import WorkflowSpec
from flowstream.replay.context import StepInvocation, WorkflowContext, WorkflowInvocation

__all__ = [
    "EPOCH",
    "Crash",
    "FakeClock",
    "RecordingRuntime",
    "WorkflowCall",
    "envelope",
    "event_types",
    "events_of",
    "make_runtime",
    "run",
    "spec",
    "task_failed",
]

T = TypeVar("T")

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)

WorkflowFn = Callable[[WorkflowContext], RuntimeCommand | Awaitable[RuntimeCommand]]
StepFn = Callable[[StepInvocation], JSON | Awaitable[JSON]]


class Crash(BaseException):
    """Simulates the process dying inside a handler: not an ``Exception``, so the engine does
    not record it as a step failure and nothing after it is committed."""


class FakeClock:
    """A clock that stands still until ``advance``/``set`` moves it."""

    def __init__(self, start: datetime = EPOCH) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> datetime:
        self.now += timedelta(**delta)
        return self.now

    def set(self, moment: datetime) -> datetime:
        self.now = moment
        return self.now


def spec(name: str = "wf", **fields: Any) -> WorkflowSpec:
    return WorkflowSpec(name=name, **fields)


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def event_types(history: Iterable[EventEnvelope]) -> list[str]:
    return [envelope.event.type for envelope in history]


def events_of(history: Iterable[EventEnvelope], type_: str) -> list[Any]:
    return [envelope.event for envelope in history if envelope.event.type == type_]


def task_failed(
    snapshot: WorkflowRunSnapshot,
    history: Sequence[EventEnvelope],
    before: Sequence[EventEnvelope] | None = None,
    error: type[BaseException] | str | None = None,
) -> WorkflowTaskFailed:
    """The ``workflow_task_failed`` a drive appended last (of ``error``, a class or a name),
    which ``snapshot`` shows; with ``before``: the only event appended after it."""
    last = history[-1].event
    assert isinstance(last, WorkflowTaskFailed), f"the history ends with {last.type}"
    assert snapshot.task_failure is not None and snapshot.task_failure.attempt == last.attempt
    if before is not None:
        assert list(history[:-1]) == list(before), "more than the failure was appended"
    if error is not None:
        assert last.error_type == (error if isinstance(error, str) else error.__name__), last
    return last


def envelope(
    run_id: str, sequence: int, event: FlowEvent, *, at: datetime = EPOCH
) -> EventEnvelope:
    """A hand-made envelope, for writing histories directly."""
    return EventEnvelope(
        run_id=run_id, sequence=sequence, event_id=f"e{sequence}", timestamp=at, event=event
    )


@dataclass(frozen=True, slots=True)
class WorkflowCall:
    run_id: str
    workflow: str
    last_sequence: int
    history_types: tuple[str, ...]


@dataclass
class RecordingRuntime:
    """Dispatches workflows by spec name and steps by step name; records every call."""

    workflows: Mapping[str, WorkflowFn]
    steps: Mapping[str, StepFn]
    workflow_calls: list[WorkflowCall] = field(default_factory=list)
    step_calls: list[StepInvocation] = field(default_factory=list)

    def _workflow(self, invocation: WorkflowInvocation) -> Any:
        name = invocation.spec.name
        fn = self.workflows.get(name) or self.workflows.get("*")
        if fn is None:
            raise LookupError(f"no workflow function for {name!r}")
        self.workflow_calls.append(
            WorkflowCall(
                invocation.run_id,
                name,
                invocation.history[-1].sequence,
                tuple(event_types(invocation.history)),
            )
        )
        return fn(invocation.context())

    def _step(self, invocation: StepInvocation) -> Any:
        self.step_calls.append(invocation)
        handler = self.steps.get(invocation.step_name)
        if handler is None:
            raise LookupError(f"no step handler for {invocation.step_name!r}")
        return handler(invocation)

    def calls_of(self, step_id: str) -> list[StepInvocation]:
        return [call for call in self.step_calls if call.step_id == step_id]

    def workflow_calls_of(self, run_id: str) -> list[WorkflowCall]:
        return [call for call in self.workflow_calls if call.run_id == run_id]


class _SyncRuntime(RecordingRuntime):
    def run_workflow(self, invocation: WorkflowInvocation) -> RuntimeCommand:
        result = self._workflow(invocation)
        assert not inspect.isawaitable(result), "async workflow in a sync runtime"
        return result  # type: ignore[no-any-return]

    def run_step(self, invocation: StepInvocation) -> JSON:
        return self._step(invocation)  # type: ignore[no-any-return]


class _AsyncRuntime(RecordingRuntime):
    async def run_workflow(self, invocation: WorkflowInvocation) -> RuntimeCommand:
        result = self._workflow(invocation)
        if inspect.isawaitable(result):
            result = await result
        return result  # type: ignore[no-any-return]

    async def run_step(self, invocation: StepInvocation) -> JSON:
        result = self._step(invocation)
        if inspect.isawaitable(result):
            result = await result
        return result  # type: ignore[no-any-return]


def make_runtime(
    workflow: WorkflowFn | Mapping[str, WorkflowFn],
    steps: Mapping[str, StepFn] | None = None,
    *,
    asynchronous: bool | None = None,
) -> RecordingRuntime:
    """A runtime from a workflow function (or ``{spec name: function}``; ``"*"`` matches any)
    and step handlers by step name.

    The runtime is ``async`` when any function is a coroutine function (or when asked): the
    engine runs sync step handlers of a batch in threads and async ones on the loop.
    """
    workflows = dict(workflow) if isinstance(workflow, Mapping) else {"*": workflow}
    handlers = dict(steps or {})
    if asynchronous is None:
        asynchronous = any(
            inspect.iscoroutinefunction(fn) for fn in [*workflows.values(), *handlers.values()]
        )
    cls = _AsyncRuntime if asynchronous else _SyncRuntime
    return cls(workflows, handlers)
