"""The workflows behind the golden histories, and the scenarios that recorded them.

Changing a workflow here in a way that changes any decision it makes for a recorded history is
exactly what ``test_golden.py`` catches: keep old branches behind patch markers instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta

from flowstream.engine import FlowEngine
from flowstream.model.base import JSON
from flowstream.model.commands import RuntimeCommand
from flowstream.model.spec import RetryPolicy, WorkflowSpec
from flowstream.replay.context import StepInvocation, WorkflowContext
from tests.support import EPOCH, FakeClock

__all__ = ["SCENARIOS", "STEPS", "WORKFLOWS"]

APPROVAL_TOKEN = "golden-approval-token"  # a host secret: never in the recorded histories

ORDER = WorkflowSpec(name="golden-order", version="3", signal_names=("shipped",))
PARENT = WorkflowSpec(name="golden-parent")
CHILD = WorkflowSpec(name="golden-child")
COUNTER = WorkflowSpec(name="golden-counter", patch_markers=("count-by-two",))


def order(ctx: WorkflowContext) -> RuntimeCommand:
    """Reserve, charge and notify (one batch), approve by hook, wait for a signal, settle."""
    assert isinstance(ctx.input, dict)
    if ctx.cancellation_request() is not None:
        if not ctx.step_completed("release"):
            return ctx.schedule_step("release", "release_stock", {"sku": ctx.input["sku"]})
        return ctx.cancel()
    if not ctx.step_completed("reserve"):
        return ctx.schedule_step("reserve", "reserve_stock", {"sku": ctx.input["sku"]})
    if not (ctx.step_completed("charge") and ctx.step_completed("notify")):
        return ctx.schedule_steps(
            [
                ctx.step(
                    "charge", "charge", {"cents": ctx.input["cents"]}, RetryPolicy.fixed(3, 500)
                ),
                ctx.step("notify", "notify", {"to": "customer"}),
            ]
        )
    if not ctx.hook_received("approval"):
        return ctx.create_hook("approval", APPROVAL_TOKEN, {"kind": "human_approval"})
    if not ctx.signal_received("shipment"):
        return ctx.wait_for_signal("shipment", "shipped")
    if not ctx.wait_completed("settle"):
        return ctx.wait_for("settle", timedelta(seconds=30))
    if ctx.progress("done") is None:
        return ctx.record_progress("done", 1, 1, "order settled")
    return ctx.complete(
        {
            "reservation": ctx.step_output("reserve"),
            "receipt": ctx.step_output("charge"),
            "approved_by": ctx.hook_payload("approval"),
            "shipment": ctx.signal_payload("shipment"),
        }
    )


def parent(ctx: WorkflowContext) -> RuntimeCommand:
    """Two children in one batch, then a third that fails; reports every outcome."""
    batch = ["left", "right"]
    if any(ctx.child_workflow_outcome(c) is None for c in batch):
        return ctx.start_child_workflows(
            [ctx.child_workflow(c, CHILD, {"n": n}) for n, c in enumerate(batch, start=1)]
        )
    if ctx.child_workflow_outcome("broken") is None:
        return ctx.start_child_workflow("broken", CHILD, {"n": -1})
    return ctx.complete(
        {
            c: ctx.child_workflow_outcome(c).model_dump(mode="json", exclude_none=True)  # type: ignore[union-attr]
            for c in (*batch, "broken")
        }
    )


def child(ctx: WorkflowContext) -> RuntimeCommand:
    assert isinstance(ctx.input, dict)
    if ctx.input["n"] < 0:
        return ctx.fail("negative input")
    if not ctx.step_completed("square"):
        return ctx.schedule_step("square", "square", ctx.input["n"])
    return ctx.complete(ctx.step_output("square"))


def counter(ctx: WorkflowContext) -> RuntimeCommand:
    """Continues as new until the count reaches 4 (by two, under a patch marker)."""
    assert isinstance(ctx.input, int)
    step = 2 if ctx.has_patch_marker("count-by-two") else 1
    if ctx.input < 4:
        return ctx.continue_as_new(ctx.input + step)
    return ctx.complete(ctx.input)


def exhausting(ctx: WorkflowContext) -> RuntimeCommand:
    """A batch whose ``fatal`` member fails the run while ``parked`` waits for a delayed retry."""
    return ctx.schedule_steps(
        [
            ctx.step("parked", "parked", None, RetryPolicy.fixed(3, 60_000)),
            ctx.step("fatal", "fatal", None, RetryPolicy.none()),
        ]
    )


WORKFLOWS: dict[str, Callable[[WorkflowContext], RuntimeCommand]] = {
    ORDER.name: order,
    PARENT.name: parent,
    CHILD.name: child,
    COUNTER.name: counter,
    "golden-exhausting": exhausting,
}


def _charge(invocation: StepInvocation) -> JSON:
    if invocation.attempt == 1:
        raise ConnectionError("gateway timeout")
    return {"receipt": f"rcpt-{invocation.run_id}", "attempt": invocation.attempt}


async def _parked(invocation: StepInvocation) -> JSON:
    raise ConnectionError("try later")


async def _fatal(invocation: StepInvocation) -> JSON:
    for _ in range(50):  # let the sibling's retry commit first
        await asyncio.sleep(0)
    raise ValueError("card reported stolen")


STEPS: dict[str, Callable[[StepInvocation], object]] = {
    "reserve_stock": lambda inv: {"reservation": f"res-{inv.run_id}"},
    "charge": _charge,
    "notify": lambda inv: {"sent": True},
    "release_stock": lambda inv: {"released": True},
    "square": lambda inv: inv.input * inv.input,  # type: ignore[operator]
    "parked": _parked,
    "fatal": _fatal,
}


# -- scenarios: each drives runs to the state its golden file records ---------------------------

Scenario = Callable[[FlowEngine, FakeClock], Awaitable[None]]


async def order_completed(engine: FlowEngine, clock: FakeClock) -> None:
    await engine.start("order-1", ORDER, {"sku": "sku-8842", "cents": 1250})
    clock.set(EPOCH + timedelta(milliseconds=500))
    await engine.resume_due(clock.now)
    clock.advance(minutes=5)
    await engine.resume_hook_by_token(APPROVAL_TOKEN, {"by": "manager"})
    clock.advance(minutes=5)
    await engine.send_signal("order-1", "ship-1", "shipped", {"carrier": "dhl"})
    clock.advance(seconds=30)
    await engine.resume_due(clock.now)


async def order_suspended(engine: FlowEngine, clock: FakeClock) -> None:
    await engine.start("order-2", ORDER, {"sku": "sku-1", "cents": 99})
    clock.set(EPOCH + timedelta(milliseconds=500))
    await engine.resume_due(clock.now)
    clock.advance(minutes=1)
    await engine.resume_hook("order-2", "approval", {"by": "night shift"})


async def order_cancelled(engine: FlowEngine, clock: FakeClock) -> None:
    await engine.start("order-3", ORDER, {"sku": "sku-2", "cents": 5})
    clock.set(EPOCH + timedelta(milliseconds=500))
    await engine.resume_due(clock.now)
    clock.advance(minutes=1)
    await engine.request_cancellation("order-3", "customer changed their mind")


async def parent_children(engine: FlowEngine, clock: FakeClock) -> None:
    await engine.start("parent-1", PARENT, None)


async def continued(engine: FlowEngine, clock: FakeClock) -> None:
    await engine.start("count-1", COUNTER, 0)


async def batch_exhausted(engine: FlowEngine, clock: FakeClock) -> None:
    await engine.start("exhaust-1", WorkflowSpec(name="golden-exhausting"), None)


SCENARIOS: dict[str, Scenario] = {
    "order_completed": order_completed,
    "order_suspended": order_suspended,
    "order_cancelled": order_cancelled,
    "parent_children": parent_children,
    "continued": continued,
    "batch_exhausted": batch_exhausted,
}
