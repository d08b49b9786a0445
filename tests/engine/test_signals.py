"""Signals (issue 4): declared names, idempotent delivery by signal id, FIFO pairing with signal
waits, early signals kept for later waits, signals to created-but-not-started runs."""

from __future__ import annotations

from datetime import timedelta

import pytest

from flowstream.engine import FlowEngine
from flowstream.errors import InvalidTransitionError, RunConflictError, RunNotFoundError
from flowstream.model.commands import RuntimeCommand
from flowstream.model.snapshot import RunStatus, WaitStatus
from flowstream.replay.context import WorkflowContext
from flowstream.stores.base import EventStore
from tests.support import FakeClock, event_types, events_of, make_runtime, run, spec, task_failed

SPEC = spec("approvals", signal_names=("approve", "note"))


def two_approvals(ctx: WorkflowContext) -> RuntimeCommand:
    """Waits for two ``approve`` signals in turn, then completes with both payloads."""
    for wait_id in ("first", "second"):
        if not ctx.signal_received(wait_id):
            return ctx.wait_for_signal(wait_id, "approve")
    return ctx.complete([ctx.signal_payload("first"), ctx.signal_payload("second")])


def test_a_signal_wait_suspends_until_the_signal_arrives(
    store: EventStore, clock: FakeClock
) -> None:
    runtime = make_runtime(two_approvals)
    engine = FlowEngine(store, runtime, clock=clock)
    snapshot = run(engine.start("r1", SPEC))
    assert snapshot.status is RunStatus.SUSPENDED
    assert snapshot.signal_waits["first"].status is WaitStatus.WAITING
    calls = len(runtime.workflow_calls)
    assert run(engine.drive("r1")).status is RunStatus.SUSPENDED
    assert len(runtime.workflow_calls) == calls

    run(engine.send_signal("r1", "s-1", "approve", {"by": "ann"}))
    snapshot = run(engine.send_signal("r1", "s-2", "approve", {"by": "bob"}))
    assert snapshot.status is RunStatus.COMPLETED
    assert snapshot.output == [{"by": "ann"}, {"by": "bob"}]
    assert snapshot.signal_waits["first"].signal_id == "s-1"


def test_a_signal_is_idempotent_by_id(store: EventStore, clock: FakeClock) -> None:
    engine = FlowEngine(store, make_runtime(two_approvals), clock=clock)
    run(engine.start("r1", SPEC))
    run(engine.send_signal("r1", "s-1", "approve", {"by": "ann"}))
    run(engine.send_signal("r1", "s-1", "approve", {"by": "ann"}))
    history = store.read("r1")
    assert len(events_of(history, "signal_received")) == 1
    assert engine.snapshot("r1").status is RunStatus.SUSPENDED  # still waiting for "second"


@pytest.mark.parametrize(("name", "payload"), [("approve", {"by": "eve"}), ("note", {"by": "ann"})])
def test_the_same_signal_id_with_other_content_conflicts(
    store: EventStore, clock: FakeClock, name: str, payload: object
) -> None:
    engine = FlowEngine(store, make_runtime(two_approvals), clock=clock)
    run(engine.start("r1", SPEC))
    run(engine.send_signal("r1", "s-1", "approve", {"by": "ann"}))
    before = store.read("r1")
    with pytest.raises(RunConflictError) as caught:
        run(engine.send_signal("r1", "s-1", name, payload))
    assert "s-1" in str(caught.value)
    assert store.read("r1") == before


def test_signals_pair_with_waits_in_fifo_order(store: EventStore, clock: FakeClock) -> None:
    def gate(ctx: WorkflowContext) -> RuntimeCommand:
        # Parks on a hook first, so both signals arrive before any wait exists.
        if not ctx.hook_received("gate"):
            return ctx.create_hook("gate", "gate-token")
        return two_approvals(ctx)

    engine = FlowEngine(store, make_runtime(gate), clock=clock)
    run(engine.start("r1", SPEC))
    run(engine.send_signal("r1", "s-a", "approve", "A"))
    run(engine.send_signal("r1", "s-note", "note", "ignored"))
    run(engine.send_signal("r1", "s-b", "approve", "B"))
    snapshot = run(engine.resume_hook("r1", "gate", None))
    assert snapshot.output == ["A", "B"]
    pairs = [(e.wait_id, e.signal_id) for e in events_of(store.read("r1"), "signal_wait_completed")]
    assert pairs == [("first", "s-a"), ("second", "s-b")]
    unconsumed = [s.signal_id for s in snapshot.signals if s.consumed_by is None]
    assert unconsumed == ["s-note"]


def test_a_signal_before_its_wait_is_kept_and_consumed_later(
    store: EventStore, clock: FakeClock
) -> None:
    deadline = clock.now + timedelta(minutes=1)

    def nap_then_approve(ctx: WorkflowContext) -> RuntimeCommand:
        if not ctx.wait_completed("nap"):
            return ctx.wait_until("nap", deadline)
        if not ctx.signal_received("approval"):
            return ctx.wait_for_signal("approval", "approve")
        return ctx.complete(ctx.signal_payload("approval"))

    engine = FlowEngine(store, make_runtime(nap_then_approve), clock=clock)
    run(engine.start("r1", SPEC))
    snapshot = run(engine.send_signal("r1", "early", "approve", "yes"))
    assert snapshot.status is RunStatus.SUSPENDED
    assert snapshot.signal_waits == {}
    assert [s.signal_id for s in snapshot.signals] == ["early"]
    snapshot = run(engine.resume_wait("r1", "nap", now=deadline))
    assert snapshot.output == "yes"
    assert snapshot.signals[0].consumed_by == "approval"


def test_a_signal_to_a_created_but_not_started_run_is_kept(
    store: EventStore, clock: FakeClock
) -> None:
    runtime = make_runtime(two_approvals)
    engine = FlowEngine(store, runtime, clock=clock)
    run(engine.start("r1", SPEC, drive=False))
    run(engine.send_signal("r1", "early", "approve", "E"))
    types = event_types(store.read("r1"))
    assert types[:2] == ["run_created", "signal_received"]
    snapshot = run(engine.send_signal("r1", "late", "approve", "L"))
    assert snapshot.output == ["E", "L"]


def test_an_undeclared_signal_name_is_a_clear_error(store: EventStore, clock: FakeClock) -> None:
    engine = FlowEngine(store, make_runtime(two_approvals), clock=clock)
    run(engine.start("r1", SPEC))
    before = store.read("r1")
    with pytest.raises(InvalidTransitionError) as caught:
        run(engine.send_signal("r1", "s-1", "reject", None))
    assert "reject" in str(caught.value) and "declared" in str(caught.value)
    assert store.read("r1") == before


def test_waiting_for_an_undeclared_signal_name_is_an_invalid_transition(
    store: EventStore,
) -> None:
    runtime = make_runtime(lambda ctx: ctx.wait_for_signal("w", "reject"))
    task_failed(
        run(FlowEngine(store, runtime).start("r1", SPEC)),
        store.read("r1"),
        error=InvalidTransitionError,
    )
    assert event_types(store.read("r1")) == ["run_created", "run_started", "workflow_task_failed"]


def test_a_signal_to_a_terminal_run_is_a_clear_error(store: EventStore, clock: FakeClock) -> None:
    engine = FlowEngine(store, make_runtime(lambda ctx: ctx.complete()), clock=clock)
    run(engine.start("r1", SPEC))
    with pytest.raises(InvalidTransitionError) as caught:
        run(engine.send_signal("r1", "s-1", "approve", None))
    assert "completed" in str(caught.value)
    assert event_types(store.read("r1"))[-1] == "run_completed"


def test_a_signal_to_an_unknown_run_is_run_not_found(store: EventStore) -> None:
    engine = FlowEngine(store, make_runtime(two_approvals))
    with pytest.raises(RunNotFoundError):
        run(engine.send_signal("ghost", "s-1", "approve", None))
