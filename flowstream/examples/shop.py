"""The README's first example: a typed three-step order workflow as plain code.

``app`` is a ``FlowRuntime``: ``flowstream worker --app flowstream.examples.shop:app`` serves it
on Kafka, ``FlowEngine(store, app)`` embedded. ``tests/api/test_docs.py`` keeps this module and
the README's example the same code.
"""

import flowstream

app = flowstream.App()


class Order(flowstream.Model):
    order_id: str
    cents: int


@app.step
def reserve_stock(order: Order) -> str:
    return f"reservation-{order.order_id}"


@app.step(retry=flowstream.RetryPolicy(max_attempts=5, delay_ms=200))  # on any exception
def charge_card(order: Order) -> int:
    return order.cents  # pass flowstream.current_step().idempotency_key to the payment API


@app.step
def ship(tracking: str) -> str:
    return f"shipped as {tracking}"


@app.workflow(signals=["shipped"])
async def order(ctx: flowstream.Context, order: Order) -> str:
    await ctx.step(reserve_stock, order)
    await ctx.step(charge_card, order)
    await ctx.sleep(3600)  # a durable one-hour timer
    return await ctx.step(ship, await ctx.wait_for_signal("shipped", str))
