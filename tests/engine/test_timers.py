"""Timers (issue 4): a host-chosen UTC deadline in the command, suspension that holds nothing, a
durable index behind ``next_wakeup``/``resume_due``, exactly-once completion.

The scenarios take ``flows`` and run in both modes (``tests.support.flows``): on Kafka the
processor's clock is the test's, and its own timer scan fires what comes due. The tests on the
``store`` fixture call the engine's host API (``resume_wait``, two engines on one store, a
store reopened), which a processor keeps to itself; docs/parity.md lists them."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import pytest

from flowstream.engine import FlowEngine
from flowstream.errors import InvalidTransitionError
from flowstream.model.commands import RuntimeCommand
from flowstream.model.snapshot import RunStatus, WaitStatus, WorkflowRunSnapshot
from flowstream.replay.context import WorkflowContext
from flowstream.replay.state import Wakeup
from flowstream.stores.base import EventStore
from tests.support import (
    EPOCH,
    FakeClock,
    event_types,
    events_of,
    make_runtime,
    run,
    spec,
    task_failed,
)
from tests.support.flows import EmbeddedFlow, Flow, Flows
from tests.support.stores import StoreFactory

SPEC = spec("timer")


def sleeper(ctx: WorkflowContext) -> RuntimeCommand:
    """Waits until the deadline given in the input (an ISO string), then completes."""
    assert isinstance(ctx.input, dict)
    if not ctx.wait_completed("nap"):
        return ctx.wait_until("nap", datetime.fromisoformat(ctx.input["until"]))
    return ctx.complete(ctx.input["until"])


def at(seconds: float) -> datetime:
    return EPOCH + timedelta(seconds=seconds)


def start(engine: FlowEngine, run_id: str, seconds: float) -> object:
    return run(engine.start(run_id, SPEC, {"until": at(seconds).isoformat()}))


def begin(flow: Flow, run_id: str, seconds: float) -> WorkflowRunSnapshot:
    return flow.start(run_id, SPEC, {"until": at(seconds).isoformat()})


def test_a_timer_suspends_the_run_and_workflow_code_is_not_invoked(flows: Flows) -> None:
    runtime = make_runtime(sleeper)
    flow = flows(runtime)
    snapshot = begin(flow, "r1", 60)
    assert snapshot.status is RunStatus.SUSPENDED
    assert snapshot.waits["nap"].status is WaitStatus.WAITING
    assert snapshot.waits["nap"].resume_at == at(60)
    [created] = events_of(flow.history("r1"), "wait_created")
    assert created.resume_at == at(60)
    calls = len(runtime.workflow_calls)
    assert flow.retry("r1").status is RunStatus.SUSPENDED
    assert len(runtime.workflow_calls) == calls
    if isinstance(flow, EmbeddedFlow):
        flow.clock.set(at(3600))  # even long past the deadline, drive does not complete a timer
        assert run(flow.engine.drive("r1")).status is RunStatus.SUSPENDED
        assert len(runtime.workflow_calls) == calls
    # (A processor is its own scheduler: once its clock passes the deadline it fires the
    # timer; docs/parity.md, "the processor fires its own timers".)


def test_next_wakeup_and_resume_due_resume_exactly_the_due_runs(flows: Flows) -> None:
    flow = flows(make_runtime(sleeper))
    begin(flow, "soon", 10)
    begin(flow, "later", 20)
    begin(flow, "much-later", 300)
    assert flow.next_wakeup() == Wakeup(at(10), flow.id("soon"), "wait", "nap")

    flow.clock.set(at(9))
    flow.fire_due()
    assert {flow.snapshot(r).status for r in ("soon", "later")} == {RunStatus.SUSPENDED}
    flow.clock.set(at(20))
    flow.fire_due()
    assert flow.snapshot("soon").status is RunStatus.COMPLETED
    assert flow.snapshot("later").status is RunStatus.COMPLETED
    assert flow.snapshot("much-later").status is RunStatus.SUSPENDED
    assert flow.next_wakeup() == Wakeup(at(300), flow.id("much-later"), "wait", "nap")


def test_a_timer_resumed_twice_completes_once(store: EventStore, clock: FakeClock) -> None:
    runtime = make_runtime(sleeper)
    engine = FlowEngine(store, runtime, clock=clock)
    start(engine, "r1", 10)
    run(engine.resume_wait("r1", "nap", now=at(10)))
    run(engine.resume_wait("r1", "nap", now=at(11)))
    run(engine.resume_due(at(12)))
    history = store.read("r1")
    assert len(events_of(history, "wait_completed")) == 1
    assert len(events_of(history, "run_completed")) == 1


def test_concurrent_resumptions_complete_the_timer_once(
    store: EventStore, clock: FakeClock
) -> None:
    engine = FlowEngine(store, make_runtime(sleeper), clock=clock)
    other = FlowEngine(store, make_runtime(sleeper), clock=clock)
    start(engine, "r1", 10)

    async def both() -> None:
        await asyncio.gather(engine.resume_wait("r1", "nap", now=at(10)), other.resume_due(at(10)))

    run(both())
    assert len(events_of(store.read("r1"), "wait_completed")) == 1
    assert engine.snapshot("r1").status is RunStatus.COMPLETED


def test_a_timer_cannot_be_resumed_before_its_deadline(store: EventStore, clock: FakeClock) -> None:
    engine = FlowEngine(store, make_runtime(sleeper), clock=clock)
    start(engine, "r1", 10)
    with pytest.raises(InvalidTransitionError):
        run(engine.resume_wait("r1", "nap", now=at(9)))
    with pytest.raises(InvalidTransitionError):
        run(engine.resume_wait("r1", "no-such-wait", now=at(60)))
    assert event_types(store.read("r1"))[-1] == "wait_created"


def test_deadlines_are_stored_in_utc(flows: Flows) -> None:
    plus_two = timezone(timedelta(hours=2))
    local = datetime(2026, 1, 1, 2, 0, 10, tzinfo=plus_two)  # == EPOCH + 10 s
    flow = flows(make_runtime(sleeper))
    flow.start("r1", SPEC, {"until": local.isoformat()})
    wakeup = flow.next_wakeup()
    assert wakeup is not None and wakeup.due == at(10)
    flow.clock.set(at(10))
    flow.fire_due()
    assert flow.snapshot("r1").status is RunStatus.COMPLETED


def test_a_naive_deadline_is_rejected(flows: Flows) -> None:
    flow = flows(make_runtime(lambda ctx: ctx.wait_until("w", datetime(2026, 1, 1))))
    task_failed(flow.start("r1", SPEC), flow.history("r1"), error=InvalidTransitionError)
    assert event_types(flow.history("r1")) == [
        "run_created",
        "run_started",
        "workflow_task_failed",
    ]


def test_timers_survive_a_restart(
    stores: StoreFactory, store: EventStore, clock: FakeClock
) -> None:
    start(FlowEngine(store, make_runtime(sleeper), clock=clock), "r1", 10)
    reopened = stores.reopen(store, clock=clock)
    engine = FlowEngine(reopened, make_runtime(sleeper), clock=clock)
    assert engine.next_wakeup() == Wakeup(at(10), "r1", "wait", "nap")
    assert run(engine.resume_due(at(10))).resumed == ["r1"]
    assert engine.snapshot("r1").output == at(10).isoformat()


def test_wait_for_uses_logical_time_and_keeps_its_deadline_on_replay(flows: Flows) -> None:
    def workflow(ctx: WorkflowContext) -> RuntimeCommand:
        if not ctx.wait_completed("settle"):
            return ctx.wait_for("settle", timedelta(seconds=30))
        return ctx.complete()

    flow = flows(make_runtime(workflow))
    flow.clock.set(at(100))
    flow.start("r1", SPEC)
    assert flow.snapshot("r1").waits["settle"].resume_at == at(130)
    flow.clock.set(at(500))
    flow.fire_due()
    assert flow.snapshot("r1").status is RunStatus.COMPLETED


def test_a_timer_of_a_run_that_ended_is_not_due(flows: Flows) -> None:
    runtime = make_runtime(sleeper)
    flow = flows(runtime)
    begin(flow, "r1", 10)
    flow.cancel("r1", "stop", force=True)
    assert flow.next_wakeup() is None
    calls = len(runtime.workflow_calls)
    flow.clock.set(at(10))
    flow.fire_due()
    assert flow.snapshot("r1").status is RunStatus.CANCELLED
    assert len(runtime.workflow_calls) == calls
