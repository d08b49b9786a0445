"""flowstream: durable workflows over an event history, on Kafka or embedded RocksDB.

One import gives what a workflow author needs::

    import flowstream

    app = flowstream.App()          # workflows and steps as plain functions (flowstream.app)

    @app.step
    def reserve(order: Order) -> Reservation: ...

    @app.workflow
    async def order(ctx: flowstream.Context, order: Order) -> Reservation:
        return await ctx.step(reserve, order)

and the seeds' contract underneath (``FlowRuntime`` with ``run_workflow``/``run_step``,
``WorkflowInvocation``, ``RuntimeCommand``…), the embedded engine and its stores, the Kafka
client, and the error tree. ``flowstream.testing`` has the test environment. Heavy backends
(RocksDB, Kafka) are imported on first use, so ``import flowstream`` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flowstream.app import App, current_step
from flowstream.engine import FlowEngine, SchedulerTick
from flowstream.errors import (
    ApplicationError,
    ChildFailedError,
    FlowError,
    InvalidInputError,
    InvalidTransitionError,
    NonDeterministicError,
    NonRetryableError,
    RunConflictError,
    RunFailedError,
    RunNotFoundError,
    SerializationError,
    StepError,
    StepFailedError,
    UnknownOutcomeError,
    WorkflowNotServedError,
)
from flowstream.handles import EmbeddedClient, WorkflowHandle
from flowstream.model.commands import ChildWorkflowCommand, RuntimeCommand, StepCommand
from flowstream.model.events import ChildCancellationPolicy, EventEnvelope, TerminalOutcome
from flowstream.model.payloads import Model
from flowstream.model.snapshot import RunStatus, WorkflowRunSnapshot
from flowstream.model.spec import Backoff, ExhaustedAction, RetryPolicy, WorkflowSpec
from flowstream.replay.context import StepInvocation, WorkflowContext, WorkflowInvocation
from flowstream.runtime import FlowRuntime
from flowstream.stores import EventStore, MemoryEventStore
from flowstream.workflow import Context, Operation

if TYPE_CHECKING:
    from flowstream.client import FlowClient
    from flowstream.remote import KafkaClient
    from flowstream.settings import Settings
    from flowstream.stores.rocksdb import RocksDBEventStore

__version__ = "0.1.0"

__all__ = [
    "App",
    "ApplicationError",
    "Backoff",
    "ChildCancellationPolicy",
    "ChildFailedError",
    "ChildWorkflowCommand",
    "Context",
    "EmbeddedClient",
    "EventEnvelope",
    "EventStore",
    "ExhaustedAction",
    "FlowClient",
    "FlowEngine",
    "FlowError",
    "FlowRuntime",
    "InvalidInputError",
    "InvalidTransitionError",
    "KafkaClient",
    "MemoryEventStore",
    "Model",
    "NonDeterministicError",
    "NonRetryableError",
    "Operation",
    "RetryPolicy",
    "RocksDBEventStore",
    "RunConflictError",
    "RunFailedError",
    "RunNotFoundError",
    "RunStatus",
    "RuntimeCommand",
    "SchedulerTick",
    "SerializationError",
    "Settings",
    "StepCommand",
    "StepError",
    "StepFailedError",
    "StepInvocation",
    "TerminalOutcome",
    "UnknownOutcomeError",
    "WorkflowContext",
    "WorkflowHandle",
    "WorkflowInvocation",
    "WorkflowNotServedError",
    "WorkflowRunSnapshot",
    "WorkflowSpec",
    "__version__",
    "current_step",
]

#: Names whose modules import a heavy dependency (rocksdict, confluent_kafka): loaded on use.
_LAZY = {
    "FlowClient": "flowstream.client",
    "KafkaClient": "flowstream.remote",
    "RocksDBEventStore": "flowstream.stores.rocksdb",
    "Settings": "flowstream.settings",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'flowstream' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
