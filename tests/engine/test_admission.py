"""Nothing is written before it is known to be valid (issue 16, item 3 and the start's input): a
runtime that declares ``workflow_inputs`` is refused every write to a run of another workflow,
and a start whose input does not validate against the declared model appends nothing."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, RootModel

from flowstream.engine import FlowEngine
from flowstream.errors import InvalidInputError, WorkflowNotServedError
from flowstream.model.commands import RuntimeCommand
from flowstream.model.snapshot import RunStatus
from flowstream.replay.context import WorkflowContext
from flowstream.runtime import check_served
from flowstream.stores.base import EventStore
from tests.support import FakeClock, event_types, make_runtime, run, spec

ORDER = spec("order", signal_names=("shipped",))
OTHER = spec("other", signal_names=("shipped",))


class Order(BaseModel):
    order_id: str
    quantity: int


def waits(ctx: WorkflowContext) -> RuntimeCommand:
    if ctx.cancellation_request() is not None:
        return ctx.cancel("asked")
    if not ctx.hook_received("h"):
        return ctx.create_hook("h", f"token-{ctx.run_id}")
    if not ctx.signal_received("s"):
        return ctx.wait_for_signal("s", "shipped")
    return ctx.complete(ctx.input)


def declaring(store: EventStore, clock: FakeClock, **inputs: Any) -> FlowEngine:
    """An engine whose runtime declares ``inputs`` as the workflows it serves."""
    runtime = make_runtime(waits)
    runtime.workflow_inputs = inputs  # type: ignore[attr-defined]
    return FlowEngine(store, runtime, clock=clock)


def test_a_start_whose_input_does_not_validate_appends_nothing(
    store: EventStore, clock: FakeClock
) -> None:
    engine = declaring(store, clock, order=Order)
    with pytest.raises(InvalidInputError) as caught:
        run(engine.start("o1", ORDER, {"order_id": "o1", "quantity": "lots", "pin": "s3cret"}))
    message = str(caught.value)
    assert "\n" not in message
    assert "run o1" in message and "Order" in message and "workflow order" in message
    assert "quantity" in message and "lots" not in message  # the field, never its value
    assert caught.value.run_id == "o1" and caught.value.workflow == "order"
    assert not store.exists("o1")
    assert engine.runtime.workflow_calls == []  # type: ignore[attr-defined]
    with pytest.raises(InvalidInputError):
        run(engine.start("o2", ORDER, None))
    assert not store.exists("o2")


def test_a_start_whose_input_validates_runs(store: EventStore, clock: FakeClock) -> None:
    engine = declaring(store, clock, order=Order, other=None)
    snapshot = run(engine.start("o1", ORDER, {"order_id": "o1", "quantity": 2}))
    assert snapshot.status is RunStatus.SUSPENDED
    # None: the workflow takes any JSON; a root model validates a bare value.
    assert run(engine.start("x1", OTHER, ["anything", 1])).status is RunStatus.SUSPENDED
    counted = declaring(store, clock, other=RootModel[int])
    assert run(counted.start("x2", OTHER, 7)).status is RunStatus.SUSPENDED
    with pytest.raises(InvalidInputError):
        run(counted.start("x3", OTHER, "seven"))


def test_an_existing_run_is_not_validated_again(store: EventStore, clock: FakeClock) -> None:
    """A model that got stricter does not turn an idempotent repeat into an error."""
    run(declaring(store, clock, order=None).start("o1", ORDER, {"order_id": "o1"}))
    stricter = declaring(store, clock, order=Order)
    assert run(stricter.start("o1", ORDER, {"order_id": "o1"})).run_id == "o1"


def test_every_input_to_a_run_of_another_workflow_is_refused_before_writing(
    store: EventStore, clock: FakeClock
) -> None:
    permissive = FlowEngine(store, make_runtime(waits), clock=clock)
    run(permissive.start("x1", OTHER, None))
    before = store.read("x1")
    engine = declaring(store, clock, order=Order)
    attempts = [
        engine.send_signal("x1", "s1", "shipped", {"parcel": 1}),
        engine.resume_hook("x1", "h", "ok"),
        engine.resume_hook_by_token("token-x1", "ok"),
        engine.dispose_hook("x1", "h"),
        engine.request_cancellation("x1", "stop"),
        engine.drive("x1"),
        engine.start("x2", OTHER, None),
    ]
    for attempt in attempts:
        with pytest.raises(WorkflowNotServedError) as caught:
            run(attempt)
        assert "workflow other" in str(caught.value) and "serves order" in str(caught.value)
    assert store.read("x1") == before
    assert not store.exists("x2")
    assert engine.runtime.workflow_calls == []  # type: ignore[attr-defined]
    # The runtime that serves it still moves it on.
    run(permissive.resume_hook("x1", "h", "ok"))
    done = run(permissive.send_signal("x1", "s1", "shipped", None))
    assert done.status is RunStatus.COMPLETED
    assert event_types(store.read("x1"))[-1] == "run_completed"


def test_force_cancel_needs_no_workflow_code(store: EventStore, clock: FakeClock) -> None:
    """Ending a run now runs none of its code, so any engine may do it (an operator's way out
    of a run whose code is gone)."""
    run(FlowEngine(store, make_runtime(waits), clock=clock).start("x1", OTHER, None))
    snapshot = run(declaring(store, clock, order=Order).force_cancel("x1", "gone"))
    assert snapshot.status is RunStatus.CANCELLED


def test_a_declaration_that_is_not_a_mapping_is_a_type_error() -> None:
    class Wrong:
        workflow_inputs = ["order"]

    with pytest.raises(TypeError, match="workflow_inputs must map"):
        check_served(Wrong(), "r1", ORDER)


def test_the_example_runtime_declares_its_workflow_and_input() -> None:
    from flowstream.examples.order import SPEC, OrderInput, runtime

    assert dict(runtime.workflow_inputs) == {SPEC.name: OrderInput}


def test_a_child_whose_input_does_not_validate_fails_for_its_parent_unborn(
    store: EventStore, clock: FakeClock
) -> None:
    """The parent's code sees the child failed with the reason and can handle it; the child's
    run is never created (the Kafka processor does the same, tests/processor)."""
    kid = spec("kid")

    def parent(ctx: WorkflowContext) -> RuntimeCommand:
        outcome = ctx.child_workflow_outcome("k")
        if outcome is None:
            return ctx.start_child_workflow("k", kid, ctx.input)
        return ctx.complete({"type": outcome.type, "error": outcome.error})

    def child(ctx: WorkflowContext) -> RuntimeCommand:
        return ctx.complete(ctx.input)

    runtime = make_runtime({"parent": parent, "kid": child})
    runtime.workflow_inputs = {"parent": None, "kid": Order}  # type: ignore[attr-defined]
    engine = FlowEngine(store, runtime, clock=clock)
    ok = run(engine.start("p1", spec("parent"), {"order_id": "o", "quantity": 1}))
    assert ok.output == {"type": "completed", "error": None}
    bad = run(engine.start("p2", spec("parent"), {"order_id": "o"}))
    assert bad.status is RunStatus.COMPLETED
    assert isinstance(bad.output, dict) and bad.output["type"] == "failed"
    assert "does not validate against Order" in bad.output["error"]
    assert not store.exists(bad.children["k"].run_id)
