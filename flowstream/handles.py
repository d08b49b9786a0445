"""Handles: one vocabulary for starting runs and talking to them, embedded or on Kafka.

::

    client = flowstream.EmbeddedClient(engine)          # or flowstream.KafkaClient(settings)
    handle = await client.start(order, Order(...), id="order-1")
    await handle.signal("shipped", Shipment(carrier="DHL"), id="order-1-shipped")
    summary = await handle.result()                     # typed by the workflow's annotation
    await handle.cancel()                               # or cancel(force=True)

The verbs and their argument order are the CLI's (``signal RUN NAME --id ID``): a handle is
the run, the signal name comes first, its idempotency id is a keyword. Payloads may be JSON,
pydantic models or dataclasses. ``result()`` returns the output of the last run of the chain
(after ``continue_as_new``), decoded by the workflow's return annotation, and raises
``RunFailedError`` when the run ended otherwise.

``Client`` holds the vocabulary over a small set of backend methods; ``EmbeddedClient`` drives
a ``FlowEngine`` in this process (``result()`` fires the engine's deadlines while it waits, see
``engine.host``), and ``flowstream.remote.KafkaClient`` sends commands through ``FlowClient``.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar, overload

from flowstream.engine.engine import FlowEngine
from flowstream.errors import RunFailedError
from flowstream.model.base import JSON
from flowstream.model.events import EventEnvelope
from flowstream.model.payloads import from_json, to_json
from flowstream.model.snapshot import WorkflowRunSnapshot
from flowstream.model.spec import WorkflowSpec
from flowstream.workflow import WORKFLOW_ATTRIBUTE, Context

__all__ = ["Client", "EmbeddedClient", "WorkflowHandle"]

A = TypeVar("A")
R = TypeVar("R")


class WorkflowHandle(Generic[R]):
    """One run, as its starter sees it: wait for its result, signal it, cancel it."""

    __slots__ = ("_client", "_output", "run_id")

    def __init__(self, client: Client, run_id: str, output_type: Any = Any) -> None:
        self._client = client
        self._output = output_type
        #: The run's id (the first of its chain, if it continues as new).
        self.run_id = run_id

    def __repr__(self) -> str:
        return f"WorkflowHandle({self.run_id!r})"

    async def result(self, *, timeout: float | None = None) -> R:
        """The run's output once it has completed; ``RunFailedError`` if it ended otherwise,
        ``TimeoutError`` after ``timeout`` seconds."""
        snapshot = await self._client._wait(self.run_id, timeout)
        outcome = snapshot.outcome
        if outcome is not None and outcome.type == "completed":
            value: R = from_json(self._output, outcome.output, f"output of run {self.run_id}")
            return value
        kind = outcome.type if outcome is not None else snapshot.status.value
        raise RunFailedError(snapshot.run_id, kind, snapshot.error)

    async def signal(self, name: str, payload: object = None, *, id: str | None = None) -> None:
        """Send signal ``name``. ``id`` makes a repeated send a no-op (default: a new id)."""
        signal_id = id if id is not None else uuid.uuid4().hex
        await self._client._signal(self.run_id, name, to_json(payload, f"signal {name}"), signal_id)

    async def resume_hook(self, hook_id: str, payload: object = None) -> None:
        """Deliver ``payload`` to the run's hook ``hook_id``."""
        await self._client._resume_hook(self.run_id, hook_id, to_json(payload, f"hook {hook_id}"))

    async def cancel(self, reason: str | None = None, *, force: bool = False) -> None:
        """Ask the run to cancel (its code may clean up), or end it at once with ``force``."""
        await self._client._cancel(self.run_id, reason, force)

    async def snapshot(self) -> WorkflowRunSnapshot:
        """The run's current snapshot."""
        return await self._client._snapshot(self.run_id)

    async def history(self) -> list[EventEnvelope]:
        """The run's committed events."""
        return await self._client._history(self.run_id)


def _target(workflow: Any) -> tuple[WorkflowSpec, Any]:
    """The spec a start pins, and the type its output is decoded as."""
    if isinstance(workflow, WorkflowSpec):
        return workflow, Any
    definition = getattr(workflow, WORKFLOW_ATTRIBUTE, None)
    if definition is None:
        raise TypeError(f"{workflow!r} is neither a WorkflowSpec nor an @app.workflow function")
    return definition.spec, definition.output_type


class Client(ABC):
    """Starts runs and hands out their handles; the backends implement the underscored verbs."""

    @overload
    async def start(
        self, workflow: Callable[[Context, A], Awaitable[R]], input: A, *, id: str
    ) -> WorkflowHandle[R]: ...

    @overload
    async def start(
        self, workflow: Callable[[Context], Awaitable[R]], *, id: str
    ) -> WorkflowHandle[R]: ...

    @overload
    async def start(
        self, workflow: WorkflowSpec, input: object = None, *, id: str
    ) -> WorkflowHandle[Any]: ...

    async def start(self, workflow: Any, input: object = None, *, id: str) -> WorkflowHandle[Any]:
        """Start run ``id`` of ``workflow`` (an ``@app.workflow`` function, or a spec) with
        ``input``; idempotent for the same workflow and input."""
        spec, output = _target(workflow)
        await self._start(id, spec, to_json(input, f"input of run {id}"))
        return WorkflowHandle(self, id, output)

    @overload
    def get_handle(self, workflow: Callable[..., Awaitable[R]], id: str) -> WorkflowHandle[R]: ...

    @overload
    def get_handle(self, workflow: WorkflowSpec | None, id: str) -> WorkflowHandle[Any]: ...

    def get_handle(self, workflow: Any, id: str) -> WorkflowHandle[Any]:
        """The handle of an existing run ``id`` of ``workflow`` (``None``: output untyped)."""
        output = Any if workflow is None else _target(workflow)[1]
        return WorkflowHandle(self, id, output)

    @abstractmethod
    async def _start(self, run_id: str, spec: WorkflowSpec, input: JSON) -> None: ...

    @abstractmethod
    async def _wait(self, run_id: str, timeout: float | None) -> WorkflowRunSnapshot: ...

    @abstractmethod
    async def _signal(self, run_id: str, name: str, payload: JSON, signal_id: str) -> None: ...

    @abstractmethod
    async def _resume_hook(self, run_id: str, hook_id: str, payload: JSON) -> None: ...

    @abstractmethod
    async def _cancel(self, run_id: str, reason: str | None, force: bool) -> None: ...

    @abstractmethod
    async def _snapshot(self, run_id: str) -> WorkflowRunSnapshot: ...

    @abstractmethod
    async def _history(self, run_id: str) -> list[EventEnvelope]: ...


class EmbeddedClient(Client):
    """Handles over a ``FlowEngine`` in this process."""

    def __init__(self, engine: FlowEngine) -> None:
        self.engine = engine

    async def _start(self, run_id: str, spec: WorkflowSpec, input: JSON) -> None:
        await self.engine.start(run_id, spec, input)

    async def _wait(self, run_id: str, timeout: float | None) -> WorkflowRunSnapshot:
        return await self.engine.wait(run_id, timeout=timeout)

    async def _signal(self, run_id: str, name: str, payload: JSON, signal_id: str) -> None:
        await self.engine.signal(run_id, name, payload, id=signal_id)

    async def _resume_hook(self, run_id: str, hook_id: str, payload: JSON) -> None:
        await self.engine.resume_hook(run_id, hook_id, payload)

    async def _cancel(self, run_id: str, reason: str | None, force: bool) -> None:
        await self.engine.cancel(run_id, reason, force=force)

    async def _snapshot(self, run_id: str) -> WorkflowRunSnapshot:
        return self.engine.snapshot(run_id)

    async def _history(self, run_id: str) -> list[EventEnvelope]:
        return self.engine.history(run_id)
