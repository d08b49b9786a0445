"""Limits (issue 3): oversized events are rejected before anything is written, and run ids and
other identities are validated."""

from __future__ import annotations

import pytest

from flowstream.engine import FlowEngine
from flowstream.errors import InvalidIdentifierError, PayloadTooLargeError
from flowstream.model.commands import RuntimeCommand
from flowstream.model.snapshot import RunStatus
from flowstream.replay.context import WorkflowContext
from flowstream.stores.base import MAX_EVENT_BYTES, EventStore
from tests.support import FakeClock, event_types, make_runtime, run, spec, task_failed

SPEC = spec("limits", signal_names=("go",))
BIG = "x" * (MAX_EVENT_BYTES + 1)


def echo_workflow(ctx: WorkflowContext) -> RuntimeCommand:
    if ctx.input == "big-output":
        return ctx.complete(BIG)
    if ctx.input == "big-step":
        if not ctx.step_completed("s"):
            return ctx.schedule_step("s", "big")
        return ctx.complete()
    if ctx.input == "hook":
        if not ctx.hook_received("h"):
            return ctx.create_hook("h", "limits-token")
        return ctx.complete()
    return ctx.wait_for_signal("sw", "go")


def make_engine(store: EventStore, clock: FakeClock) -> FlowEngine:
    return FlowEngine(store, make_runtime(echo_workflow, {"big": lambda inv: BIG}), clock=clock)


def test_an_oversized_input_creates_no_run(store: EventStore, clock: FakeClock) -> None:
    engine = make_engine(store, clock)
    with pytest.raises(PayloadTooLargeError) as caught:
        run(engine.start("r1", SPEC, BIG))
    assert caught.value.limit == MAX_EVENT_BYTES
    assert "reference" in str(caught.value)  # says what to do instead
    assert engine.list_runs() == []


def test_an_oversized_workflow_output_appends_nothing(store: EventStore, clock: FakeClock) -> None:
    engine = make_engine(store, clock)
    with pytest.raises(PayloadTooLargeError):
        run(engine.start("r1", SPEC, "big-output"))
    assert event_types(store.read("r1")) == ["run_created", "run_started"]
    assert engine.snapshot("r1").status is RunStatus.RUNNING


def test_an_oversized_step_output_fails_the_step_for_good(
    store: EventStore, clock: FakeClock
) -> None:
    """The output is never committed, and the attempt is not retried into a crash loop."""
    engine = make_engine(store, clock)
    snapshot = run(engine.start("r1", SPEC, "big-step"))
    history = store.read("r1")
    kinds = event_types(history)
    assert "step_completed" not in kinds
    assert kinds.count("step_started") == 1
    failure = next(e.event for e in history if e.event.type == "step_non_retryable")
    assert "exceeds the limit" in failure.error  # type: ignore[union-attr]
    assert snapshot.status is RunStatus.FAILED


def test_oversized_signal_and_hook_payloads_append_nothing(
    store: EventStore, clock: FakeClock
) -> None:
    engine = make_engine(store, clock)
    run(engine.start("sig", SPEC, "signal"))
    before = store.read("sig")
    with pytest.raises(PayloadTooLargeError):
        run(engine.send_signal("sig", "s1", "go", BIG))
    assert store.read("sig") == before

    run(engine.start("hook", SPEC, "hook"))
    before = store.read("hook")
    with pytest.raises(PayloadTooLargeError):
        run(engine.resume_hook("hook", "h", BIG))
    assert store.read("hook") == before
    assert run(engine.resume_hook("hook", "h", "small")).status is RunStatus.COMPLETED


@pytest.mark.parametrize("run_id", ["", "white space", "semi;colon", "ünïcode", "a/b", "x" * 201])
def test_invalid_run_ids_are_rejected(store: EventStore, clock: FakeClock, run_id: str) -> None:
    engine = make_engine(store, clock)
    with pytest.raises(InvalidIdentifierError) as caught:
        run(engine.start(run_id, SPEC, "signal"))
    assert "run id" in str(caught.value)
    assert engine.list_runs() == []


def test_valid_run_ids_are_accepted(store: EventStore, clock: FakeClock) -> None:
    engine = make_engine(store, clock)
    for run_id in ("a", "order-2026-0001", "A_b-9", "x" * 200):
        run(engine.start(run_id, SPEC, "signal"))
    assert len(engine.list_runs()) == 4


@pytest.mark.parametrize(
    "command",
    [
        lambda ctx: ctx.schedule_step("bad\nid", "work"),
        lambda ctx: ctx.wait_for_signal("bad\tid", "go"),
        lambda ctx: ctx.create_hook("bad\x00id", "limits-token"),
        lambda ctx: ctx.start_child_workflow("bad\rid", spec("child")),
    ],
    ids=["step", "signal-wait", "hook", "child"],
)
def test_malformed_identities_are_rejected_before_appending(
    store: EventStore, clock: FakeClock, command: object
) -> None:
    engine = FlowEngine(store, make_runtime(command), clock=clock)  # type: ignore[arg-type]
    task_failed(run(engine.start("r1", SPEC)), store.read("r1"), error=InvalidIdentifierError)
    assert event_types(store.read("r1")) == ["run_created", "run_started", "workflow_task_failed"]
