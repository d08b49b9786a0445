"""Children under concurrent drivers (issue 16): two drives of one parent converge on one history,
and a stale decision about a child becomes a lost race (re-read, replay), never an invalid
transition."""

from __future__ import annotations

import asyncio

from flowstream.engine import FlowEngine
from flowstream.model.commands import RuntimeCommand
from flowstream.model.snapshot import RunStatus, WorkflowRunSnapshot
from flowstream.replay.context import StepInvocation, WorkflowContext
from flowstream.stores.base import EventStore
from tests.support import FakeClock, events_of, make_runtime, run, spec

PARENT = spec("parent")
CHILD = spec("child")


def parent(ctx: WorkflowContext) -> RuntimeCommand:
    outcome = ctx.child_workflow_outcome("import")
    if outcome is None:
        return ctx.start_child_workflow("import", CHILD, {"n": 4})
    return ctx.complete(outcome.output)


def child(ctx: WorkflowContext) -> RuntimeCommand:
    if not ctx.step_completed("fetch"):
        return ctx.schedule_step("fetch", "fetch", None)
    return ctx.complete(ctx.step_output("fetch"))


async def fetch(invocation: StepInvocation) -> object:
    await asyncio.sleep(0.01)  # the other driver gets the loop while this one waits
    return "rows"


def two_drives(engine: FlowEngine, run_id: str) -> list[WorkflowRunSnapshot]:
    async def both() -> list[WorkflowRunSnapshot]:
        return list(await asyncio.gather(engine.drive(run_id), engine.drive(run_id)))

    return run(both())


def test_two_concurrent_drives_of_a_parent_converge(store: EventStore, clock: FakeClock) -> None:
    engine = FlowEngine(
        store, make_runtime({"parent": parent, "child": child}, {"fetch": fetch}), clock=clock
    )
    engine.create("p1", PARENT)
    first, second = two_drives(engine, "p1")
    assert first.status is RunStatus.COMPLETED
    assert first == second
    assert first.output == "rows"
    history = store.read("p1")
    assert [e.child_id for e in events_of(history, "child_workflow_resolved")] == ["import"]
    assert [e.sequence for e in history] == list(range(1, len(history) + 1))
    child_run = first.children["import"].run_id
    assert engine.snapshot(child_run).status is RunStatus.COMPLETED
    assert len(events_of(store.read(child_run), "run_completed")) == 1


def waiting_child(ctx: WorkflowContext) -> RuntimeCommand:
    if not ctx.hook_received("h"):
        return ctx.create_hook("h", "child-token")
    return ctx.complete()


def test_a_forced_cancel_racing_a_drive_of_the_parent_converges(
    store: EventStore, clock: FakeClock
) -> None:
    """The forced cancel cancels the child and then waits for durability; meanwhile a drive of
    the parent resolves the cancelled child and completes the parent. The forced cancel's own
    resolution of the child is then stale: it loses the race and reports the completed run."""
    durable = store.wait_durable

    async def yielding() -> None:
        await durable()
        await asyncio.sleep(0)

    store.wait_durable = yielding  # type: ignore[method-assign]
    engine = FlowEngine(
        store, make_runtime({"parent": parent, "child": waiting_child}), clock=clock
    )
    child_run = run(engine.start("p1", PARENT)).children["import"].run_id

    async def race() -> list[WorkflowRunSnapshot]:
        return list(await asyncio.gather(engine.force_cancel("p1", "stop"), engine.drive("p1")))

    cancelled, driven = run(race())
    assert engine.snapshot(child_run).status is RunStatus.CANCELLED
    final = engine.snapshot("p1")
    assert final.status is RunStatus.COMPLETED
    assert cancelled == driven == final
    history = store.read("p1")
    assert [e.child_id for e in events_of(history, "child_workflow_resolved")] == ["import"]
