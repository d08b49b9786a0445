"""Small tools of the semantics pass: write a history event by event, and build an engine."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from flowstream.engine import FlowEngine
from flowstream.model.events import EventEnvelope, FlowEvent, RunCreated, RunStarted
from flowstream.model.spec import RetryPolicy, WorkflowSpec
from flowstream.stores.base import EventStore
from tests.support import EPOCH, FakeClock, RecordingRuntime, StepFn, WorkflowFn, make_runtime, spec

__all__ = ["CHILD", "DELAYED", "LATER", "SPEC", "append", "begin", "engine_for", "types_of"]

#: The spec most rules use: it declares the signal names the tests send.
SPEC = spec("semantics", signal_names=("go", "stop"))
#: The spec of child runs.
CHILD = spec("child")
#: A deadline well after the test clock's start.
LATER = EPOCH + timedelta(hours=1)
#: Three attempts a minute apart.
DELAYED = RetryPolicy.fixed(3, 60_000)


def append(store: EventStore, run_id: str, *events: FlowEvent) -> list[EventEnvelope]:
    """Append ``events`` as one batch at the run's current last sequence (validated)."""
    last = store.state(run_id).last_sequence if store.exists(run_id) else 0
    return store.append_if_sequence(run_id, last, list(events))


def begin(
    store: EventStore, *events: FlowEvent, run_id: str = "r1", of: WorkflowSpec = SPEC
) -> list[EventEnvelope]:
    """A started run, then ``events`` one batch each."""
    written = append(store, run_id, RunCreated(spec=of), RunStarted())
    for event in events:
        written += append(store, run_id, event)
    return written


def types_of(store: EventStore, run_id: str = "r1") -> list[str]:
    return [envelope.event.type for envelope in store.read(run_id)]


def engine_for(
    store: EventStore,
    clock: FakeClock,
    workflow: WorkflowFn | Mapping[str, WorkflowFn],
    steps: Mapping[str, StepFn] | None = None,
    **options: Any,
) -> tuple[FlowEngine, RecordingRuntime]:
    runtime = make_runtime(workflow, steps)
    return FlowEngine(store, runtime, clock=clock, **options), runtime
