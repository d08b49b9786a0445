"""Plain-code workflows the API tests run (one app; each test uses some of them)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import flowstream

app = flowstream.App()
calls: list[str] = []


@dataclass(frozen=True)
class Item:
    sku: str
    quantity: int


@app.step
def reserve(item: Item) -> dict[str, int]:
    calls.append(f"reserve:{item.sku}")
    return {item.sku: item.quantity}


@app.step
async def price(item: Item) -> int:
    await asyncio.sleep(0)
    return 100 * item.quantity


@app.step(retry=flowstream.RetryPolicy(max_attempts=2).continue_workflow_on_failure())
def flaky() -> str:
    raise ConnectionError("always down")


@app.step
def stamp() -> str:
    step = flowstream.current_step()
    return step.idempotency_key


@app.workflow
async def basket(ctx: flowstream.Context, items: list[Item]) -> dict[str, int]:
    reserved = await ctx.gather(*(ctx.step(reserve, item) for item in items))
    prices = await ctx.gather(*(ctx.step(price, item) for item in items))
    merged: dict[str, int] = {}
    for part in reserved:
        merged.update(part)
    merged["total"] = sum(prices)
    return merged


@app.workflow
async def tolerant(ctx: flowstream.Context) -> str:
    try:
        await ctx.step(flaky)
    except flowstream.StepFailedError as exc:
        return f"fell back after: {exc.error}"
    return "unreachable"


@app.workflow
async def rejecting(ctx: flowstream.Context, amount: int) -> None:
    if amount > 10:
        raise flowstream.ApplicationError(f"amount {amount} is over the limit")


@app.workflow
async def impatient(ctx: flowstream.Context) -> None:
    await asyncio.sleep(0.01)  # not an operation of the context


@app.workflow
async def clock_reader(ctx: flowstream.Context) -> str:
    # Reads the wall clock while choosing a command: a replay chooses another deadline.
    await ctx.sleep_until(datetime.now(UTC) + timedelta(minutes=5))
    return "woke"


@app.workflow
async def honest_timer(ctx: flowstream.Context) -> str:
    await ctx.sleep(timedelta(minutes=5))
    return "woke"


@app.workflow(signals=["approve"])
async def approval(ctx: flowstream.Context, token: str) -> dict[str, object]:
    who = await ctx.hook("manager", token=token, metadata={"kind": "approval"})
    note = await ctx.wait_for_signal("approve", str)
    again = await ctx.wait_for_signal("approve", str)
    return {"who": who, "notes": [note, again], "key": await ctx.step(stamp)}


@app.workflow
async def cleanup(ctx: flowstream.Context) -> str:
    try:
        await ctx.sleep(timedelta(days=1))
    except asyncio.CancelledError:
        await ctx.step(stamp, id="cleanup-stamp")
        raise
    return "slept"


@app.workflow
async def parent(ctx: flowstream.Context, items: list[Item]) -> list[dict[str, int]]:
    first, second = await ctx.gather(
        ctx.child(basket, items[:1]), ctx.child(basket, items[1:], id="rest")
    )
    return [first, second]


@app.workflow
async def counter(ctx: flowstream.Context, n: int) -> int:
    if n < 3:
        ctx.continue_as_new(n + 1)
    return n


@app.workflow
async def failing_child(ctx: flowstream.Context) -> str:
    try:
        await ctx.child(rejecting, 50)
    except flowstream.ChildFailedError as exc:
        return exc.outcome
    return "completed"


@app.workflow
async def mixed(ctx: flowstream.Context) -> None:
    await ctx.gather(ctx.step(stamp), ctx.sleep(1))  # type: ignore[arg-type]


@app.workflow
async def undeclared(ctx: flowstream.Context) -> None:
    await ctx.wait_for_signal("never-declared")


@app.workflow
async def fixed_deadline(ctx: flowstream.Context, minutes: int) -> str:
    # The deadline comes from the input: durable, so replays agree.
    await ctx.sleep_until(datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=minutes))
    return "woke"
