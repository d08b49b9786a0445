"""Timers (issue 4): a host-chosen UTC deadline in the command, suspension that holds nothing, a
durable index behind ``next_wakeup``/``resume_due``, exactly-once completion."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import pytest

from flowstream.engine import FlowEngine
from flowstream.errors import InvalidTransitionError
from flowstream.model.commands import RuntimeCommand
from flowstream.model.snapshot import RunStatus, WaitStatus
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


def test_a_timer_suspends_the_run_and_workflow_code_is_not_invoked(
    store: EventStore, clock: FakeClock
) -> None:
    runtime = make_runtime(sleeper)
    engine = FlowEngine(store, runtime, clock=clock)
    snapshot = start(engine, "r1", 60)
    assert snapshot.status is RunStatus.SUSPENDED  # type: ignore[attr-defined]
    assert snapshot.waits["nap"].status is WaitStatus.WAITING  # type: ignore[attr-defined]
    assert snapshot.waits["nap"].resume_at == at(60)  # type: ignore[attr-defined]
    [created] = events_of(store.read("r1"), "wait_created")
    assert created.resume_at == at(60)
    calls = len(runtime.workflow_calls)
    clock.set(at(3600))  # even long past the deadline, drive does not complete a timer
    assert run(engine.drive("r1")).status is RunStatus.SUSPENDED
    assert len(runtime.workflow_calls) == calls


def test_next_wakeup_and_resume_due_resume_exactly_the_due_runs(
    store: EventStore, clock: FakeClock
) -> None:
    engine = FlowEngine(store, make_runtime(sleeper), clock=clock)
    start(engine, "soon", 10)
    start(engine, "later", 20)
    start(engine, "much-later", 300)
    assert engine.next_wakeup() == Wakeup(at(10), "soon", "wait", "nap")

    assert run(engine.resume_due(at(9))).resumed == []
    tick = run(engine.resume_due(at(20)))
    assert sorted(tick.resumed) == ["later", "soon"]
    assert tick.failed == {}
    assert engine.snapshot("soon").status is RunStatus.COMPLETED
    assert engine.snapshot("later").status is RunStatus.COMPLETED
    assert engine.snapshot("much-later").status is RunStatus.SUSPENDED
    assert engine.next_wakeup() == Wakeup(at(300), "much-later", "wait", "nap")


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


def test_deadlines_are_stored_in_utc(store: EventStore, clock: FakeClock) -> None:
    plus_two = timezone(timedelta(hours=2))
    local = datetime(2026, 1, 1, 2, 0, 10, tzinfo=plus_two)  # == EPOCH + 10 s
    engine = FlowEngine(store, make_runtime(sleeper), clock=clock)
    run(engine.start("r1", SPEC, {"until": local.isoformat()}))
    wakeup = engine.next_wakeup()
    assert wakeup is not None and wakeup.due == at(10)
    assert run(engine.resume_due(at(10))).resumed == ["r1"]


def test_a_naive_deadline_is_rejected(store: EventStore) -> None:
    runtime = make_runtime(lambda ctx: ctx.wait_until("w", datetime(2026, 1, 1)))
    task_failed(
        run(FlowEngine(store, runtime).start("r1", SPEC)),
        store.read("r1"),
        error=InvalidTransitionError,
    )
    assert event_types(store.read("r1")) == ["run_created", "run_started", "workflow_task_failed"]


def test_timers_survive_a_restart(
    stores: StoreFactory, store: EventStore, clock: FakeClock
) -> None:
    start(FlowEngine(store, make_runtime(sleeper), clock=clock), "r1", 10)
    reopened = stores.reopen(store, clock=clock)
    engine = FlowEngine(reopened, make_runtime(sleeper), clock=clock)
    assert engine.next_wakeup() == Wakeup(at(10), "r1", "wait", "nap")
    assert run(engine.resume_due(at(10))).resumed == ["r1"]
    assert engine.snapshot("r1").output == at(10).isoformat()


def test_wait_for_uses_logical_time_and_keeps_its_deadline_on_replay(
    store: EventStore, clock: FakeClock
) -> None:
    def workflow(ctx: WorkflowContext) -> RuntimeCommand:
        if not ctx.wait_completed("settle"):
            return ctx.wait_for("settle", timedelta(seconds=30))
        return ctx.complete()

    clock.set(at(100))
    engine = FlowEngine(store, make_runtime(workflow), clock=clock)
    run(engine.start("r1", SPEC))
    assert engine.snapshot("r1").waits["settle"].resume_at == at(130)
    clock.set(at(500))
    run(engine.resume_due(at(500)))
    assert engine.snapshot("r1").status is RunStatus.COMPLETED


def test_a_timer_of_a_run_that_ended_is_not_due(store: EventStore, clock: FakeClock) -> None:
    engine = FlowEngine(store, make_runtime(sleeper), clock=clock)
    start(engine, "r1", 10)
    run(engine.force_cancel("r1", "stop"))
    assert engine.next_wakeup() is None
    assert run(engine.resume_due(at(10))).resumed == []
    assert engine.snapshot("r1").status is RunStatus.CANCELLED
