"""The demo workflow: an order that reserves stock, charges and notifies in one batch (the charge
fails once and retries after a delay), waits for a manager's approval hook, for a "shipped"
signal, and for a short settling timer, then completes.

``runtime`` is the ``FlowRuntime`` the CLI and ``flowstream worker --app
flowstream.examples.order:runtime`` serve.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel

from flowstream.model.base import JSON
from flowstream.model.commands import RuntimeCommand
from flowstream.model.spec import RetryPolicy, WorkflowSpec
from flowstream.replay.context import StepInvocation, WorkflowInvocation

__all__ = ["SPEC", "OrderInput", "OrderRuntime", "runtime"]

SPEC = WorkflowSpec(name="order", version="1", signal_names=("shipped",))


class OrderInput(BaseModel):
    order_id: str
    sku: str
    quantity: int
    amount_cents: int
    approval_token_digest: str | None = None


class OrderRuntime:
    """Workflow decisions and step handlers for ``order``."""

    #: The workflows this runtime serves, with their input models: an engine refuses a run of
    #: another workflow, and a start whose input is not an ``OrderInput``, before writing.
    workflow_inputs = {SPEC.name: OrderInput}

    def run_workflow(self, invocation: WorkflowInvocation) -> RuntimeCommand:
        ctx = invocation.context()
        order = ctx.input_as(OrderInput)
        if not ctx.step_completed("reserve-stock"):
            return ctx.schedule_step(
                "reserve-stock", "reserve_stock", {"sku": order.sku, "quantity": order.quantity}
            )
        if not (ctx.step_completed("charge") and ctx.step_completed("notify")):
            return ctx.schedule_steps(
                [
                    ctx.step(
                        "charge",
                        "charge_payment",
                        {"order_id": order.order_id, "amount_cents": order.amount_cents},
                        RetryPolicy.fixed(3, 300),
                    ),
                    ctx.step("notify", "send_confirmation", {"order_id": order.order_id}),
                ]
            )
        if order.approval_token_digest is not None and not ctx.hook_received("approval"):
            return ctx.create_hook(
                "approval",
                token_digest=order.approval_token_digest,
                metadata={"kind": "human_approval", "subject": f"order {order.order_id}"},
            )
        if "shipped" in ctx.spec.signal_names and not ctx.signal_received("shipment"):
            return ctx.wait_for_signal("shipment", "shipped")
        if not ctx.wait_completed("settle"):
            return ctx.wait_for("settle", timedelta(seconds=1))
        return ctx.complete(
            {
                "order_id": order.order_id,
                "reservation": ctx.step_output("reserve-stock"),
                "receipt": ctx.step_output("charge"),
                "approved_by": ctx.hook_payload("approval"),
                "shipment": ctx.signal_payload("shipment"),
            }
        )

    def run_step(self, invocation: StepInvocation) -> JSON:
        data = invocation.input
        assert isinstance(data, dict)
        if invocation.step_name == "reserve_stock":
            return {"reservation_id": f"res-{invocation.run_id}", "sku": data["sku"]}
        if invocation.step_name == "charge_payment":
            if invocation.attempt == 1:
                raise ConnectionError("payment gateway timed out")
            return {"receipt": f"rcpt-{invocation.idempotency_key}", "attempt": invocation.attempt}
        if invocation.step_name == "send_confirmation":
            return {"sent": True}
        raise LookupError(f"unknown step {invocation.step_name}")


runtime = OrderRuntime()
