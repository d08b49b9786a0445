"""Issue 16 item 1: an input recorded right before a crash (its event committed, the next decision
not) leaves a run that waits on nothing; the identical redelivery of that input drives it on.

The crash is simulated by appending the input's event directly through the store, which is what
the engine appends before it drives the run.
"""

from __future__ import annotations

from datetime import timedelta

from flowstream.engine import FlowEngine
from flowstream.model.commands import RuntimeCommand
from flowstream.model.events import FlowEvent, HookReceived, SignalReceived, WaitCompleted
from flowstream.model.snapshot import RunStatus
from flowstream.replay.context import WorkflowContext
from flowstream.stores.base import EventStore
from tests.support import EPOCH, FakeClock, event_types, make_runtime, run, spec

SPEC = spec("inputs", signal_names=("approve",))
DUE = EPOCH + timedelta(minutes=5)


def one_input(ctx: WorkflowContext) -> RuntimeCommand:
    """Waits for the input named by ``ctx.input``, then completes with what it carried."""
    kind = ctx.input
    if kind == "signal":
        if not ctx.signal_received("w1"):
            return ctx.wait_for_signal("w1", "approve")
        return ctx.complete(ctx.signal_payload("w1"))
    if kind == "hook":
        if not ctx.hook_received("h1"):
            return ctx.create_hook("h1", "hook-token-redelivery")
        return ctx.complete(ctx.hook_payload("h1"))
    if not ctx.wait_completed("t1"):
        return ctx.wait_until("t1", DUE)
    return ctx.complete("woke")


def crashed_after(engine: FlowEngine, store: EventStore, kind: str, event: FlowEvent) -> None:
    """Start a run waiting for ``kind``, then commit ``event`` as a crashed delivery would."""
    assert run(engine.start("r1", SPEC, kind)).status is RunStatus.SUSPENDED
    store.append_if_sequence("r1", store.state("r1").last_sequence, [event])
    assert engine.snapshot("r1").status is not RunStatus.COMPLETED
    assert engine.condition("r1").is_stalled  # nothing would move it


def test_a_redelivered_signal_drives_the_run_it_left_stalled(
    store: EventStore, clock: FakeClock
) -> None:
    engine = FlowEngine(store, make_runtime(one_input), clock=clock)
    crashed_after(
        engine, store, "signal", SignalReceived(signal_id="s1", name="approve", payload=7)
    )
    snapshot = run(engine.send_signal("r1", "s1", "approve", 7))
    assert snapshot.status is RunStatus.COMPLETED
    assert snapshot.output == 7
    assert event_types(store.read("r1")).count("signal_received") == 1


def test_a_redelivered_hook_payload_drives_the_run_it_left_stalled(
    store: EventStore, clock: FakeClock
) -> None:
    engine = FlowEngine(store, make_runtime(one_input), clock=clock)
    crashed_after(engine, store, "hook", HookReceived(hook_id="h1", payload={"ok": True}))
    snapshot = run(engine.resume_hook("r1", "h1", {"ok": True}))
    assert snapshot.status is RunStatus.COMPLETED
    assert snapshot.output == {"ok": True}


def test_a_redelivered_timer_drives_the_run_it_left_stalled(
    store: EventStore, clock: FakeClock
) -> None:
    engine = FlowEngine(store, make_runtime(one_input), clock=clock)
    clock.set(DUE)
    crashed_after(engine, store, "timer", WaitCompleted(wait_id="t1"))
    snapshot = run(engine.resume_wait("r1", "t1"))
    assert snapshot.status is RunStatus.COMPLETED
    assert snapshot.output == "woke"


def test_a_redelivery_to_a_suspended_run_appends_and_decides_nothing(
    store: EventStore, clock: FakeClock
) -> None:
    def hook_then_timer(ctx: WorkflowContext) -> RuntimeCommand:
        if not ctx.hook_received("h1"):
            return ctx.create_hook("h1", "hook-token-suspended")
        if not ctx.wait_completed("t1"):
            return ctx.wait_until("t1", DUE)
        return ctx.complete()

    runtime = make_runtime(hook_then_timer)
    engine = FlowEngine(store, runtime, clock=clock)
    run(engine.start("r1", SPEC))
    assert run(engine.resume_hook("r1", "h1", 1)).status is RunStatus.SUSPENDED
    calls, history = len(runtime.workflow_calls), store.read("r1")
    assert run(engine.resume_hook("r1", "h1", 1)).status is RunStatus.SUSPENDED
    assert len(runtime.workflow_calls) == calls
    assert store.read("r1") == history


def test_the_scheduler_tick_repairs_a_run_its_input_left_stalled(
    store: EventStore, clock: FakeClock
) -> None:
    engine = FlowEngine(store, make_runtime(one_input), clock=clock)
    clock.set(DUE)
    crashed_after(engine, store, "timer", WaitCompleted(wait_id="t1"))
    assert store.due_wakeups(DUE) == []  # nothing indexed would ever move it
    tick = run(engine.resume_due())
    assert tick.repaired == ["r1"]
    assert engine.snapshot("r1").status is RunStatus.COMPLETED
    assert run(engine.resume_due()).repaired == []


def test_a_run_being_driven_is_in_its_own_condition_and_no_scan_drives_it_again(
    store: EventStore, clock: FakeClock
) -> None:
    seen: list[str] = []

    async def looks_at_itself(ctx: WorkflowContext) -> RuntimeCommand:
        seen.append(engine.condition("r1").describe())
        seen.extend(engine.find_stalled().stalled)
        return ctx.complete()

    engine = FlowEngine(store, make_runtime(looks_at_itself), clock=clock)
    assert run(engine.start("r1", SPEC)).status is RunStatus.COMPLETED
    assert seen == ["being driven"]
