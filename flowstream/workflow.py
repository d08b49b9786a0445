"""``Context``: what a plain-code workflow receives, and the operations history answers.

A plain-code workflow is an ``async def`` that awaits operations of its context::

    reservation = await ctx.step(reserve_stock, order)
    await ctx.sleep(timedelta(hours=1))
    shipment = await ctx.wait_for_signal("shipped", Shipment)

It runs on the seeds' contract, one ``RuntimeCommand`` per replay cycle: every cycle runs the
function from the top against the run's history. An operation history answers (a completed
step, a fired timer, a paired signal…) returns its committed value at once; the first one it
cannot answer becomes the cycle's command, and the function goes no further in that cycle. So
the only state a workflow keeps is its history: the process may vanish at any await.

Rules, all checked:

* Identities are stable: an operation's id is the one given (``id=...``), else derived from its
  kind and the call order, ``name`` for the first step called ``name`` and ``name#2`` for the
  second (timers count under ``sleep``, signal waits under the signal name, children under the
  child workflow's name). Create operations in an order that history determines.
* An identity that reappears must carry the same definition: a step's name, input and retry
  policy, a timer's absolute deadline, a signal wait's name, a hook's token and metadata, a
  child's spec, input and cancellation policy. A difference is a ``NonDeterministicError``, for
  answered operations here as for new ones in ``decide``.
* Workflow code awaits nothing but these operations (no ``asyncio.sleep``, no I/O): anything
  else is refused with a ``TypeError`` (a workflow-task failure).
* ``gather`` awaits several steps (or several children) as one atomic batch.
* After a cancellation request, the first operation history cannot answer (and any operation
  the request cancelled) raises ``asyncio.CancelledError``; code may catch it to clean up with
  new operations, and its run then ends cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, NoReturn, TypeVar, overload

from flowstream.errors import NonDeterministicError
from flowstream.model.base import canonical_json, json_equal, utc, validate_identifier
from flowstream.model.commands import ChildWorkflowCommand, StepCommand
from flowstream.model.events import ChildCancellationPolicy
from flowstream.model.payloads import to_json
from flowstream.model.spec import DEFAULT_RETRY, RetryPolicy, WorkflowSpec
from flowstream.operations import (
    PENDING,
    Child,
    ContinueAsNew,
    Gather,
    Hook,
    Operation,
    Signal,
    Step,
    Suspend,
    Timer,
)
from flowstream.replay.context import WorkflowContext

__all__ = [
    "STEP_ATTRIBUTE",
    "WORKFLOW_ATTRIBUTE",
    "Context",
    "ContinueAsNew",
    "Operation",
    "Suspend",
]

T = TypeVar("T")
A = TypeVar("A")
B = TypeVar("B")
C = TypeVar("C")
D = TypeVar("D")
R = TypeVar("R")

_REQUEST = ChildCancellationPolicy.REQUEST_CANCELLATION

#: The attributes ``@app.step`` and ``@app.workflow`` set on the functions they register (the
#: first registration's; an app looks its own up by function).
STEP_ATTRIBUTE = "__flowstream_step__"
WORKFLOW_ATTRIBUTE = "__flowstream_workflow__"


class Context:
    """The one door of a plain-code workflow: durable operations and replay-safe reads.

    Build nothing from the clock, randomness or the environment here; read them in a step.
    """

    __slots__ = ("_cancel_raised", "_counts", "_state", "_steps", "raw")

    def __init__(
        self, raw: WorkflowContext, steps: Mapping[Callable[..., Any], Any] | None = None
    ) -> None:
        #: The seeds' context over the same history (read helpers and command builders).
        self.raw = raw
        self._state = raw.state
        #: The app's steps by function (a function may be a step of several apps).
        self._steps = steps
        self._counts: dict[str, int] = {}
        self._cancel_raised = False

    # -- reads ----------------------------------------------------------------------------

    @property
    def run_id(self) -> str:
        """The run's id."""
        return self.raw.run_id

    @property
    def spec(self) -> WorkflowSpec:
        """The spec the run is pinned to."""
        return self.raw.spec

    @property
    def cancellation_requested(self) -> bool:
        """Whether a cancellation request is durable for this run."""
        return self.raw.cancellation_request() is not None

    def now(self) -> datetime:
        """Commit time of the last event: the only clock workflow code may read."""
        return self.raw.logical_time()

    def patched(self, marker: str) -> bool:
        """Whether the run was pinned with patch marker ``marker`` (take the new branch)."""
        return self.raw.has_patch_marker(marker)

    def deterministic_id(self, name: str) -> str:
        """A UUID derived from the run id and ``name``: the same on every replay."""
        return self.raw.deterministic_id(name)

    # -- operations -----------------------------------------------------------------------

    @overload
    def step(
        self,
        fn: Callable[[A], Awaitable[R]],
        input: A,
        *,
        id: str | None = None,
        retry: RetryPolicy | None = None,
    ) -> Operation[R]: ...

    @overload
    def step(
        self,
        fn: Callable[[A], R],
        input: A,
        *,
        id: str | None = None,
        retry: RetryPolicy | None = None,
    ) -> Operation[R]: ...

    @overload
    def step(
        self,
        fn: Callable[[], Awaitable[R]],
        *,
        id: str | None = None,
        retry: RetryPolicy | None = None,
    ) -> Operation[R]: ...

    @overload
    def step(
        self,
        fn: Callable[[], R],
        *,
        id: str | None = None,
        retry: RetryPolicy | None = None,
    ) -> Operation[R]: ...

    def step(
        self,
        fn: Callable[..., Any],
        input: object = None,
        *,
        id: str | None = None,
        retry: RetryPolicy | None = None,
    ) -> Operation[Any]:
        """Run step ``fn`` (registered with ``@app.step``) on ``input``; awaited, its output
        decoded by ``fn``'s return annotation. ``retry`` overrides the step's policy."""
        step = self._steps.get(fn) if self._steps is not None else getattr(fn, STEP_ATTRIBUTE, None)
        if step is None:
            name = getattr(fn, "__name__", repr(fn))
            raise TypeError(f"{name} is not a step of this app: register it with @app.step")
        name = step.name
        command = StepCommand(
            step_id=self._derive(name, id),
            step_name=name,
            input=to_json(input, f"input of step {name}"),
            retry=retry or step.retry or DEFAULT_RETRY,
        )
        return Step(self, command, step.output_type)

    def sleep(self, delay: timedelta | float, *, id: str | None = None) -> Operation[None]:
        """A durable timer ``delay`` (a ``timedelta``, or seconds) after the logical time at
        which it is first created; later cycles reuse its durable deadline."""
        wait_id = self._derive("sleep", id)
        wait = self._state.waits.get(wait_id)
        if not isinstance(delay, timedelta):
            delay = timedelta(seconds=delay)
        resume_at = wait.resume_at if wait is not None else self.now() + delay
        return Timer(self, wait_id, resume_at, absolute=False)

    def sleep_until(self, moment: datetime, *, id: str | None = None) -> Operation[None]:
        """A durable timer at ``moment`` (timezone-aware)."""
        return Timer(self, self._derive("sleep", id), utc(moment), absolute=True)

    @overload
    def wait_for_signal(
        self, name: str, type: type[T], *, id: str | None = None
    ) -> Operation[T]: ...

    @overload
    def wait_for_signal(self, name: str, *, id: str | None = None) -> Operation[Any]: ...

    def wait_for_signal(
        self, name: str, type: Any = Any, *, id: str | None = None
    ) -> Operation[Any]:
        """The payload of the next signal ``name`` (declared in ``@app.workflow(signals=...)``),
        decoded as ``type``."""
        if name not in self.spec.signal_names:
            raise TypeError(
                f"signal {name!r} is not declared by workflow {self.spec.name}: declare it with "
                f"@app.workflow(signals=[...])"
            )
        return Signal(self, self._derive(name, id), name, type)

    @overload
    def hook(
        self,
        id: str,
        type: type[T],
        *,
        token: str | None = None,
        token_digest: str | None = None,
        metadata: object = None,
    ) -> Operation[T]: ...

    @overload
    def hook(
        self,
        id: str,
        *,
        token: str | None = None,
        token_digest: str | None = None,
        metadata: object = None,
    ) -> Operation[Any]: ...

    def hook(
        self,
        id: str,
        type: Any = Any,
        *,
        token: str | None = None,
        token_digest: str | None = None,
        metadata: object = None,
    ) -> Operation[Any]:
        """The payload hook ``id`` receives (resumed by run and hook id, or by its token alone),
        decoded as ``type``. Give the ``token`` or only its SHA-256 ``token_digest``."""
        hook_id = validate_identifier("hook", id)
        meta = to_json(metadata, f"metadata of hook {hook_id}")
        return Hook(self, hook_id, token, token_digest, meta, type)

    @overload
    def child(
        self,
        workflow: Callable[[Context, A], Awaitable[R]],
        input: A,
        *,
        id: str | None = None,
        cancellation_policy: ChildCancellationPolicy = _REQUEST,
    ) -> Operation[R]: ...

    @overload
    def child(
        self,
        workflow: Callable[[Context], Awaitable[R]],
        *,
        id: str | None = None,
        cancellation_policy: ChildCancellationPolicy = _REQUEST,
    ) -> Operation[R]: ...

    def child(
        self,
        workflow: Callable[..., Any],
        input: object = None,
        *,
        id: str | None = None,
        cancellation_policy: ChildCancellationPolicy = _REQUEST,
    ) -> Operation[Any]:
        """Run ``workflow`` (registered with ``@app.workflow``) as a child; awaited, its output
        decoded by the workflow's return annotation. A child that does not complete raises
        ``ChildFailedError``."""
        definition = _registered_workflow(workflow)
        spec: WorkflowSpec = definition.spec
        command = ChildWorkflowCommand(
            child_id=self._derive(spec.name, id),
            spec=spec,
            input=to_json(input, f"input of child {spec.name}"),
            cancellation_policy=cancellation_policy,
        )
        return Child(self, command, definition.output_type)

    @overload
    def gather(self, a: Operation[A], /) -> Operation[tuple[A]]: ...

    @overload
    def gather(self, a: Operation[A], b: Operation[B], /) -> Operation[tuple[A, B]]: ...

    @overload
    def gather(
        self, a: Operation[A], b: Operation[B], c: Operation[C], /
    ) -> Operation[tuple[A, B, C]]: ...

    @overload
    def gather(
        self, a: Operation[A], b: Operation[B], c: Operation[C], d: Operation[D], /
    ) -> Operation[tuple[A, B, C, D]]: ...

    @overload
    def gather(self, *operations: Operation[T]) -> Operation[tuple[T, ...]]: ...

    def gather(self, *operations: Operation[Any]) -> Operation[Any]:
        """Await several steps, or several children, as one atomic batch; their results in
        order. The first failure (in order) is raised once every member has settled."""
        return Gather(self, operations)

    def continue_as_new(self, input: object = None) -> NoReturn:
        """End this run and start its successor with ``input`` (same spec, fresh history)."""
        raise ContinueAsNew(to_json(input, "continue-as-new input"))

    # -- the machinery --------------------------------------------------------------------

    def _derive(self, base: str, explicit: str | None) -> str:
        if explicit is not None:
            return validate_identifier("operation", explicit)
        count = self._counts.get(base, 0) + 1
        self._counts[base] = count
        return validate_identifier("operation", base if count == 1 else f"{base}#{count}")

    def _same(self, what: str, history: object, replay: object) -> None:
        if not json_equal(history, replay):
            raise NonDeterministicError(
                self.run_id,
                f"{what} differs: history={canonical_json(history)}; "
                f"replay={canonical_json(replay)}",
            )

    def _resolve(self, operation: Operation[Any]) -> Any:
        try:
            answer = operation._answer(self._state)
        except asyncio.CancelledError:
            self._cancel_raised = True
            raise
        if answer is PENDING and self.cancellation_requested and not self._cancel_raised:
            self._cancel_raised = True
            raise asyncio.CancelledError("the run's cancellation was requested")
        return answer


def _registered_workflow(fn: Callable[..., Any]) -> Any:
    definition = getattr(fn, WORKFLOW_ATTRIBUTE, None)
    if definition is None:
        name = getattr(fn, "__name__", repr(fn))
        raise TypeError(f"{name} is not a workflow: register it with @app.workflow")
    return definition
