"""User code with typed steps, checked by ``mypy --strict`` (``test_typing``): step inputs and
outputs, signals, children and handles carry their types through the context."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import assert_type

import flowstream

app = flowstream.App()


class Order(flowstream.Model):
    order_id: str
    lines: dict[str, int]


@dataclass(frozen=True)
class Shipment:
    carrier: str
    tracking: str


@app.step
def count(order: Order) -> dict[str, int]:
    return {"lines": len(order.lines), "units": sum(order.lines.values())}


@app.step(retry=flowstream.RetryPolicy(max_attempts=4, delay=timedelta(seconds=2)))
async def quote(order: Order) -> int:
    return 100 * sum(order.lines.values())


@app.step
def today() -> str:
    return "2026-12-01"


@app.workflow
async def label(ctx: flowstream.Context, shipment: Shipment) -> str:
    return f"{shipment.carrier}:{shipment.tracking}"


@app.workflow(signals=["shipped"])
async def fulfil(ctx: flowstream.Context, order: Order) -> dict[str, object]:
    counts = await ctx.step(count, order)
    assert_type(counts, dict[str, int])
    cents = await ctx.step(quote, order, id="quote")
    assert_type(cents, int)
    assert_type(await ctx.step(today), str)
    both = await ctx.gather(ctx.step(count, order, id="again"), ctx.step(quote, order, id="q2"))
    assert_type(both, tuple[dict[str, int], int])
    await ctx.sleep(timedelta(hours=1))
    shipment = await ctx.wait_for_signal("shipped", Shipment)
    assert_type(shipment, Shipment)
    text = await ctx.child(label, shipment)
    assert_type(text, str)
    return {"counts": counts, "cents": cents, "label": text}


async def client_side(client: flowstream.EmbeddedClient) -> None:
    handle = await client.start(fulfil, Order(order_id="1", lines={"a": 2}), id="fulfil-1")
    assert_type(handle, flowstream.WorkflowHandle[dict[str, object]])
    await handle.signal("shipped", Shipment(carrier="DHL", tracking="1"), id="s-1")
    result = await handle.result()
    assert_type(result, dict[str, object])
    await handle.cancel()


def raw_context(ctx: flowstream.WorkflowContext, data: dict[str, int]) -> flowstream.RuntimeCommand:
    # The seeds' builders take typed payloads too.
    if not ctx.step_completed("count"):
        return ctx.schedule_step("count", "count", Order(order_id="1", lines=data))
    return ctx.complete(data)


engine: flowstream.FlowRuntime = app


class RawRuntime:
    """The seeds' contract, typed: a step that returns ``dict[str, int]`` is a FlowRuntime."""

    def run_workflow(self, invocation: flowstream.WorkflowInvocation) -> flowstream.RuntimeCommand:
        return raw_context(invocation.context(), {"a": 1})

    def run_step(self, invocation: flowstream.StepInvocation) -> dict[str, int]:
        order = invocation.input_as(Order)
        return dict(order.lines)


raw: flowstream.FlowRuntime = RawRuntime()
