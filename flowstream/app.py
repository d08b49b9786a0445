"""``App``: a ``FlowRuntime`` made of plain functions, registered by decorator.

::

    app = flowstream.App()

    @app.step(retry=flowstream.RetryPolicy(max_attempts=3, delay=timedelta(seconds=1)))
    def charge(order: Order) -> Receipt: ...

    @app.workflow(signals=["shipped"])
    async def order(ctx: flowstream.Context, order: Order) -> Summary:
        receipt = await ctx.step(charge, order)
        ...

The decorators return the functions unchanged (call them in unit tests as usual) and record
them on the app. The app is a ``FlowRuntime``: ``run_workflow`` runs the workflow function from
the top against the history and returns the command of the first operation history cannot
answer (``flowstream.workflow``); ``run_step`` calls the step function registered under the
step's name with its input decoded by the parameter's annotation, and stores its return value
as JSON. So an app runs wherever a runtime does: ``FlowEngine(store, app)``, ``flowstream
worker --app module:app``, ``flowstream audit --app module:app``.

How a workflow function ends decides the run's end: a return value completes it (its JSON is the
output), ``ApplicationError`` (and the ``StepFailedError``/``ChildFailedError`` the context
raises) fails it, ``asyncio.CancelledError`` after a cancellation request cancels it,
``ctx.continue_as_new`` continues it; any other exception is a workflow-task failure, retried
once the code is fixed, as for the raw contract.
"""

from __future__ import annotations

import asyncio
import inspect
import typing
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar, overload

from flowstream.errors import ApplicationError, NonRetryableError
from flowstream.model.commands import RuntimeCommand
from flowstream.model.payloads import from_json, to_json
from flowstream.model.spec import RetryPolicy, WorkflowSpec
from flowstream.replay.context import StepInvocation, WorkflowInvocation
from flowstream.workflow import STEP_ATTRIBUTE, WORKFLOW_ATTRIBUTE, Context, ContinueAsNew, Suspend

__all__ = ["App", "StepDefinition", "WorkflowDefinition", "current_step"]

F = TypeVar("F", bound=Callable[..., Any])

_CURRENT_STEP: ContextVar[StepInvocation | None] = ContextVar("flowstream_step", default=None)


def current_step() -> StepInvocation:
    """The attempt a step function is running for (run and step ids, attempt, idempotency key).

    Only inside a step function of an ``App``; hand ``idempotency_key`` to the external system.
    """
    invocation = _CURRENT_STEP.get()
    if invocation is None:
        raise RuntimeError("current_step() is only available inside a step function")
    return invocation


def _hints(fn: Callable[..., Any]) -> tuple[list[Any], Any]:
    """The parameters' and the return value's annotations (``Any`` where there is none)."""
    try:
        hints = typing.get_type_hints(fn)
    except NameError as exc:
        raise TypeError(f"cannot resolve the annotations of {fn.__qualname__}: {exc}") from None
    parameters = [
        hints.get(p.name, Any)
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    return parameters, hints.get("return", Any)


def _unwrapped_output(fn: Callable[..., Any], annotation: Any) -> Any:
    # ``async def f() -> X`` is annotated X; an explicit Awaitable[X] on a sync def means X too.
    if inspect.iscoroutinefunction(fn):
        return annotation
    origin = typing.get_origin(annotation)
    if origin in (Awaitable, Coroutine):
        return typing.get_args(annotation)[-1]
    return annotation


@dataclass(slots=True, kw_only=True)
class _Registered:
    """A registered function and its types, read on first use (forward references resolve)."""

    #: Parameters before the input: a workflow's context.
    LEADING: ClassVar[int] = 0

    fn: Callable[..., Any]
    _types: tuple[bool, Any, Any] | None = field(default=None, repr=False)

    def _label(self) -> str:
        raise NotImplementedError

    def _resolve(self) -> tuple[bool, Any, Any]:
        if self._types is None:
            parameters, output = _hints(self.fn)
            inputs = parameters[self.LEADING :]
            if len(parameters) < self.LEADING or len(inputs) > 1:
                context = "the context and " if self.LEADING else ""
                raise TypeError(f"{self._label()} takes {context}one input at most (a model, say)")
            self._types = (
                bool(inputs),
                inputs[0] if inputs else Any,
                _unwrapped_output(self.fn, output),
            )
        return self._types

    @property
    def input_type(self) -> Any:
        """The annotation the input is decoded as (``Any`` without one)."""
        return self._resolve()[1]

    @property
    def output_type(self) -> Any:
        """The annotation the output is decoded as, by the reader (workflow, parent, handle)."""
        return self._resolve()[2]


@dataclass(slots=True, kw_only=True)
class StepDefinition(_Registered):
    """A registered step: its name, function and default retry policy."""

    name: str
    retry: RetryPolicy | None

    def _label(self) -> str:
        return f"step {self.name}"

    def call(self, invocation: StepInvocation) -> Any:
        """Call the function for ``invocation``: its JSON, or an awaitable of it."""
        takes_input, input_type, _ = self._resolve()
        try:
            value = from_json(input_type, invocation.input, f"input of step {invocation.step_id}")
        except Exception as exc:  # the input will not change on a retry
            raise NonRetryableError(str(exc)) from None
        args = (value,) if takes_input else ()
        if inspect.iscoroutinefunction(self.fn):
            return self._call_async(invocation, args)
        token = _CURRENT_STEP.set(invocation)
        try:
            result = self.fn(*args)
        finally:
            _CURRENT_STEP.reset(token)
        if inspect.isawaitable(result):
            return self._await(invocation, result)
        return to_json(result, f"output of step {invocation.step_id}")

    async def _call_async(self, invocation: StepInvocation, args: tuple[Any, ...]) -> Any:
        token = _CURRENT_STEP.set(invocation)
        try:
            result = await self.fn(*args)
        finally:
            _CURRENT_STEP.reset(token)
        return to_json(result, f"output of step {invocation.step_id}")

    async def _await(self, invocation: StepInvocation, result: Awaitable[Any]) -> Any:
        return to_json(await result, f"output of step {invocation.step_id}")


@dataclass(slots=True, kw_only=True)
class WorkflowDefinition(_Registered):
    """A registered workflow: its spec and function (taking the context, then the input)."""

    LEADING: ClassVar[int] = 1

    spec: WorkflowSpec

    def _label(self) -> str:
        return f"workflow {self.spec.name}"

    def decide(
        self, invocation: WorkflowInvocation, steps: Mapping[Callable[..., Any], StepDefinition]
    ) -> RuntimeCommand:
        """Run the function from the top against the history, with the app's ``steps``: the
        cycle's one command."""
        takes_input, input_type, _ = self._resolve()
        ctx = Context(invocation.context(), steps)
        args: tuple[Any, ...] = (ctx,)
        if takes_input:
            args = (ctx, from_json(input_type, invocation.input, f"input of run {ctx.run_id}"))
        coroutine = self.fn(*args)
        try:
            yielded = coroutine.send(None)
        except StopIteration as done:
            if ctx.cancellation_requested:
                return RuntimeCommand.cancel()
            return RuntimeCommand.complete(to_json(done.value, f"output of run {ctx.run_id}"))
        except ContinueAsNew as request:
            return RuntimeCommand.continue_as_new(request.input)
        except ApplicationError as exc:
            return RuntimeCommand.fail(str(exc))
        except asyncio.CancelledError:
            if ctx.cancellation_requested:
                return RuntimeCommand.cancel()
            raise
        coroutine.close()
        if isinstance(yielded, Suspend):
            return yielded.command
        raise TypeError(
            f"workflow {self.spec.name} awaited {type(yielded).__name__}, which history cannot "
            "answer: await only the operations of its context (ctx.step, ctx.sleep, ...; "
            "ctx.gather, not asyncio.gather) and do I/O in steps"
        )


class App:
    """A ``FlowRuntime`` whose workflows and steps are plain functions registered on it.

    ``build_id`` pins the runs it starts to a runtime build (``WorkflowSpec.runtime_build_id``).
    """

    def __init__(self, *, build_id: str | None = None) -> None:
        self.build_id = build_id
        self._workflows: dict[str, WorkflowDefinition] = {}
        self._workflow_functions: dict[Callable[..., Any], WorkflowDefinition] = {}
        self._steps: dict[str, StepDefinition] = {}
        self._step_functions: dict[Callable[..., Any], StepDefinition] = {}

    # -- registration ---------------------------------------------------------------------

    @overload
    def workflow(self, fn: F, /) -> F: ...

    @overload
    def workflow(
        self,
        *,
        name: str | None = None,
        version: str = "1",
        signals: Sequence[str] = (),
        patch_markers: Sequence[str] = (),
    ) -> Callable[[F], F]: ...

    def workflow(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        version: str = "1",
        signals: Sequence[str] = (),
        patch_markers: Sequence[str] = (),
    ) -> Any:
        """Register an ``async def`` workflow taking ``(ctx, input)`` or ``(ctx)``; every
        signal it waits for is declared in ``signals``."""

        def register(fn: F) -> F:
            if not inspect.iscoroutinefunction(fn):
                raise TypeError(f"workflow {fn.__qualname__} must be an async def")
            spec = WorkflowSpec(
                name=name or fn.__name__,
                version=version,
                runtime_build_id=self.build_id,
                signal_names=tuple(signals),
                patch_markers=tuple(patch_markers),
            )
            if spec.name in self._workflows:
                raise ValueError(f"a workflow called {spec.name} is already registered")
            definition = WorkflowDefinition(spec=spec, fn=fn)
            self._workflows[spec.name] = definition
            self._workflow_functions[fn] = definition
            if not hasattr(fn, WORKFLOW_ATTRIBUTE):
                setattr(fn, WORKFLOW_ATTRIBUTE, definition)
            return fn

        return register if fn is None else register(fn)

    @overload
    def step(self, fn: F, /) -> F: ...

    @overload
    def step(
        self, *, name: str | None = None, retry: RetryPolicy | None = None
    ) -> Callable[[F], F]: ...

    def step(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        retry: RetryPolicy | None = None,
    ) -> Any:
        """Register a step function (sync or async) taking one input or none; ``retry`` is
        its default policy. It runs at least once per attempt: make it idempotent with
        ``current_step().idempotency_key``."""

        def register(fn: F) -> F:
            step_name = name or fn.__name__
            if step_name in self._steps:
                raise ValueError(f"a step called {step_name} is already registered")
            definition = StepDefinition(name=step_name, fn=fn, retry=retry)
            self._steps[step_name] = definition
            self._step_functions[fn] = definition
            if not hasattr(fn, STEP_ATTRIBUTE):
                setattr(fn, STEP_ATTRIBUTE, definition)
            return fn

        return register if fn is None else register(fn)

    # -- reads ----------------------------------------------------------------------------

    def spec(self, workflow: Callable[..., Any] | str) -> WorkflowSpec:
        """The spec runs of ``workflow`` (a registered function, or its name) are pinned to."""
        return self.definition(workflow).spec

    def definition(self, workflow: Callable[..., Any] | str) -> WorkflowDefinition:
        """The registration of ``workflow`` (a registered function, or its name)."""
        if isinstance(workflow, str):
            found = self._workflows.get(workflow)
        else:
            found = self._workflow_functions.get(workflow)
        if found is None:
            raise LookupError(f"{workflow!r} is not a workflow of this app")
        return found

    @property
    def workflows(self) -> Mapping[str, WorkflowDefinition]:
        """The registered workflows, by name."""
        return dict(self._workflows)

    @property
    def workflow_inputs(self) -> Mapping[str, Any]:
        """What the app serves (``flowstream.runtime``): each workflow's input annotation, which
        a start's input must validate against before anything is written (``None``: any)."""
        return {
            name: None if definition.input_type is Any else definition.input_type
            for name, definition in self._workflows.items()
        }

    # -- the FlowRuntime contract ---------------------------------------------------------

    def run_workflow(self, invocation: WorkflowInvocation) -> RuntimeCommand:
        """One replay cycle: the command of the first operation history cannot answer."""
        definition = self._workflows.get(invocation.spec.name)
        if definition is None:
            raise LookupError(f"workflow {invocation.spec.name} is not registered with this app")
        return definition.decide(invocation, self._step_functions)

    def run_step(self, invocation: StepInvocation) -> object:
        """Run one attempt of the step registered under ``invocation.step_name``."""
        definition = self._steps.get(invocation.step_name)
        if definition is None:
            raise NonRetryableError(f"step {invocation.step_name} is not registered with this app")
        return definition.call(invocation)
