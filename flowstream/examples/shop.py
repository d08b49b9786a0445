"""The README's first example: a typed three-step order workflow as plain code.

``app`` is a ``FlowRuntime``: ``flowstream worker --app flowstream.examples.shop:app`` serves it
on Kafka, ``FlowEngine(store, app)`` embedded. The charge fails on its first attempt and is
retried after 200 ms; the workflow then sleeps an hour and waits for a ``shipped`` signal.
"""

import flowstream

app = flowstream.App()


class Order(flowstream.Model):
    order_id: str
    cents: int


class Receipt(flowstream.Model):
    order_id: str
    charged: int
    tracking: str


@app.step
def reserve_stock(order: Order) -> str:
    return f"reservation-{order.order_id}"


@app.step(retry=flowstream.RetryPolicy(max_attempts=3, delay_ms=200))
def charge_card(order: Order) -> int:
    if flowstream.current_step().attempt == 1:
        raise ConnectionError("payment gateway timed out")  # retried after 200 ms
    return order.cents


@app.step
def send_receipt(receipt: Receipt) -> str:
    return f"mail-{receipt.order_id}"  # the id the mail service gave the receipt


@app.workflow(signals=["shipped"])
async def order(ctx: flowstream.Context, order: Order) -> Receipt:
    await ctx.step(reserve_stock, order)
    charged = await ctx.step(charge_card, order)
    await ctx.sleep(3600)  # a durable one-hour timer
    tracking = await ctx.wait_for_signal("shipped", str)
    receipt = Receipt(order_id=order.order_id, charged=charged, tracking=tracking)
    await ctx.step(send_receipt, receipt)
    return receipt
