"""The operations of a plain-code workflow: awaitables that history answers or that suspend.

An operation is created by a ``Context`` method (``flowstream.workflow``), which fixes its
identity and definition at once (so ids follow the call order). Awaiting it asks the context to
resolve it against the run's projection: a value or an exception history holds is returned or
raised at once; otherwise the operation yields a ``Suspend`` carrying its command, which ends the
cycle. Each kind compares the definition it would write with the durable one first, so a changed
identity is a ``NonDeterministicError`` whether or not the operation is answered.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Generator
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar

from flowstream.errors import (
    ApplicationError,
    ChildFailedError,
    NonDeterministicError,
    StepFailedError,
)
from flowstream.model.base import JSON
from flowstream.model.commands import (
    ChildWorkflowCommand,
    RuntimeCommand,
    ScheduleStepCommand,
    StepCommand,
)
from flowstream.model.events import ChildCancellationPolicy
from flowstream.model.payloads import from_json
from flowstream.model.snapshot import HookStatus, StepStatus, WaitStatus
from flowstream.model.spec import WorkflowSpec
from flowstream.replay.decide import token_digest
from flowstream.replay.state import RunState

__all__ = [
    "PENDING",
    "Child",
    "ContinueAsNew",
    "Gather",
    "Hook",
    "Operation",
    "Resolver",
    "Signal",
    "Step",
    "Suspend",
    "Timer",
]

T = TypeVar("T")

#: What an operation answers when history holds no answer yet.
PENDING: Any = object()
_PENDING = PENDING


class Resolver(Protocol):
    """What an operation needs of its context."""

    @property
    def run_id(self) -> str: ...

    def _same(self, what: str, history: object, replay: object) -> None: ...

    def _resolve(self, operation: Operation[Any]) -> Any: ...


class Suspend:
    """Yielded by an operation history cannot answer: it carries the cycle's one command."""

    __slots__ = ("command",)

    def __init__(self, command: RuntimeCommand) -> None:
        self.command = command


class ContinueAsNew(BaseException):
    """Raised by ``Context.continue_as_new``: the run closes and a successor starts with
    ``input`` (a ``BaseException``, so ``except Exception`` in workflow code lets it pass)."""

    def __init__(self, input: JSON) -> None:
        super().__init__("continue as new")
        self.input = input


class Operation(Generic[T]):
    """One durable operation of a workflow; awaiting it yields history's answer."""

    __slots__ = ("_ctx", "id")

    def __init__(self, ctx: Resolver, id: str) -> None:
        self._ctx = ctx
        self.id = id

    def __await__(self) -> Generator[Any, Any, T]:
        answer = self._ctx._resolve(self)
        if answer is _PENDING:
            yield Suspend(self._command())
            raise RuntimeError("a suspended workflow cycle was resumed")  # pragma: no cover
        return answer  # type: ignore[no-any-return]

    def _answer(self, state: RunState) -> Any:
        """History's answer (a value, or an exception raised), or ``_PENDING``."""
        raise NotImplementedError

    def _command(self) -> RuntimeCommand:
        raise NotImplementedError


class Step(Operation[T]):
    __slots__ = ("_result", "spec")

    def __init__(self, ctx: Resolver, spec: StepCommand, result: Any) -> None:
        super().__init__(ctx, spec.step_id)
        self.spec = spec
        self._result = result

    def _answer(self, state: RunState) -> Any:
        step = state.steps.get(self.id)
        if step is None:
            return _PENDING
        ctx = self._ctx
        ctx._same(f"step {self.id} name", step.step_name, self.spec.step_name)
        ctx._same(f"step {self.id} input", step.input, self.spec.input)
        ctx._same(
            f"step {self.id} retry policy",
            step.retry.model_dump(mode="json"),
            self.spec.retry.model_dump(mode="json"),
        )
        if step.status is StepStatus.COMPLETED:
            return from_json(self._result, step.output, f"output of step {self.id}")
        if step.status is StepStatus.FAILED:
            raise StepFailedError(ctx.run_id, self.id, step.error or "failed")
        if step.status is StepStatus.CANCELLED:
            raise asyncio.CancelledError(f"step {self.id} was cancelled")
        return _PENDING

    def _command(self) -> RuntimeCommand:
        return ScheduleStepCommand(step=self.spec)


class Timer(Operation[None]):
    __slots__ = ("absolute", "resume_at")

    def __init__(self, ctx: Resolver, id: str, resume_at: datetime, absolute: bool) -> None:
        super().__init__(ctx, id)
        self.resume_at = resume_at
        self.absolute = absolute

    def _answer(self, state: RunState) -> Any:
        wait = state.waits.get(self.id)
        if wait is None:
            return _PENDING
        if self.absolute:
            self._ctx._same(
                f"wait {self.id} resume_at", wait.resume_at.isoformat(), self.resume_at.isoformat()
            )
        if wait.status is WaitStatus.COMPLETED:
            return None
        if wait.status is WaitStatus.CANCELLED:
            raise asyncio.CancelledError(f"timer {self.id} was cancelled")
        return _PENDING

    def _command(self) -> RuntimeCommand:
        return RuntimeCommand.wait_until(self.id, self.resume_at)


class Signal(Operation[T]):
    __slots__ = ("_result", "name")

    def __init__(self, ctx: Resolver, id: str, name: str, result: Any) -> None:
        super().__init__(ctx, id)
        self.name = name
        self._result = result

    def _answer(self, state: RunState) -> Any:
        wait = state.signal_waits.get(self.id)
        if wait is None:
            return _PENDING
        self._ctx._same(f"signal wait {self.id} name", wait.signal_name, self.name)
        if wait.status is WaitStatus.COMPLETED and wait.signal_id is not None:
            payload = state.signals[wait.signal_id].payload
            return from_json(self._result, payload, f"signal for wait {self.id}")
        if wait.status is WaitStatus.CANCELLED:
            raise asyncio.CancelledError(f"signal wait {self.id} was cancelled")
        return _PENDING

    def _command(self) -> RuntimeCommand:
        return RuntimeCommand.wait_for_signal(self.id, self.name)


class Hook(Operation[T]):
    __slots__ = ("_digest", "_result", "_token", "metadata")

    def __init__(
        self,
        ctx: Resolver,
        id: str,
        token: str | None,
        digest: str | None,
        metadata: JSON,
        result: Any,
    ) -> None:
        super().__init__(ctx, id)
        if (token is None) == (digest is None):
            raise TypeError("ctx.hook needs exactly one of token= or token_digest=")
        self._token = token
        self._digest = digest if digest is not None else token_digest(token or "")
        self.metadata = metadata
        self._result = result

    def _answer(self, state: RunState) -> Any:
        hook = state.hooks.get(self.id)
        if hook is None:
            return _PENDING
        if not hmac.compare_digest(hook.token_digest, self._digest):
            raise NonDeterministicError(
                self._ctx.run_id,
                f"hook {self.id} token differs: history token and replay token are different "
                "(values redacted)",
            )
        self._ctx._same(f"hook {self.id} metadata", hook.metadata, self.metadata)
        if hook.received:
            return from_json(self._result, hook.payload, f"payload of hook {self.id}")
        if hook.status is HookStatus.CANCELLED:
            raise asyncio.CancelledError(f"hook {self.id} was cancelled")
        if hook.status is HookStatus.DISPOSED:
            raise ApplicationError(f"hook {self.id} was disposed before it received a payload")
        return _PENDING

    def _command(self) -> RuntimeCommand:
        if self._token is not None:
            return RuntimeCommand.create_hook(self.id, self._token, self.metadata)
        return RuntimeCommand.create_hook(
            self.id, metadata=self.metadata, token_digest=self._digest
        )


class Child(Operation[T]):
    __slots__ = ("_result", "spec")

    def __init__(self, ctx: Resolver, spec: ChildWorkflowCommand, result: Any) -> None:
        super().__init__(ctx, spec.child_id)
        self.spec = spec
        self._result = result

    def _answer(self, state: RunState) -> Any:
        child = state.children.get(self.id)
        if child is None:
            return _PENDING
        self._ctx._same(
            f"child workflow {self.id}",
            _child_definition(child.spec, child.input, child.cancellation_policy),
            _child_definition(self.spec.spec, self.spec.input, self.spec.cancellation_policy),
        )
        outcome = child.outcome
        if outcome is None:
            return _PENDING
        if outcome.type == "completed":
            return from_json(self._result, outcome.output, f"output of child {self.id}")
        raise ChildFailedError(self._ctx.run_id, self.id, outcome.type, outcome.error)

    def _command(self) -> RuntimeCommand:
        return RuntimeCommand.start_child_workflows([self.spec])


def _child_definition(spec: WorkflowSpec, input: JSON, policy: ChildCancellationPolicy) -> JSON:
    return {
        "spec": spec.model_dump(mode="json"),
        "input": input,
        "cancellation_policy": policy.value,
    }


class Gather(Operation[Any]):
    __slots__ = ("members",)

    def __init__(self, ctx: Resolver, members: tuple[Operation[Any], ...]) -> None:
        kinds = {type(m) for m in members}
        if not members or not (kinds <= {Step} or kinds <= {Child}):
            raise TypeError(
                "ctx.gather takes one or more steps, or one or more child workflows (one batch "
                "each); await other operations one at a time"
            )
        super().__init__(ctx, ",".join(m.id for m in members))
        self.members = members

    def _answer(self, state: RunState) -> Any:
        answers: list[Any] = []
        failure: BaseException | None = None
        for member in self.members:
            try:
                answers.append(member._answer(state))
            except (ApplicationError, asyncio.CancelledError) as exc:
                failure = failure or exc
                answers.append(_PENDING)
        if any(a is _PENDING for a in answers) and (failure is None or self._unsettled(state)):
            return _PENDING
        if failure is not None:
            raise failure
        return tuple(answers)

    def _unsettled(self, state: RunState) -> bool:
        """Whether a member is still open (a batch is decided again until all settle)."""
        for member in self.members:
            if isinstance(member, Step):
                step = state.steps.get(member.id)
                if step is None or step.status in (StepStatus.PENDING, StepStatus.RUNNING):
                    return True
            elif isinstance(member, Child):
                child = state.children.get(member.id)
                if child is None or child.outcome is None:
                    return True
        return False

    def _command(self) -> RuntimeCommand:
        steps = [m.spec for m in self.members if isinstance(m, Step)]
        if steps:
            return RuntimeCommand.schedule_steps(steps)
        return RuntimeCommand.start_child_workflows(
            [m.spec for m in self.members if isinstance(m, Child)]
        )
