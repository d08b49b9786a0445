"""A plain-code app whose waits are short in real time: the host and Kafka tests run it."""

from __future__ import annotations

import flowstream

app = flowstream.App()
attempts: dict[str, int] = {}


@app.step(retry=flowstream.RetryPolicy(max_attempts=3, delay_ms=50))
def wobbly(key: str) -> str:
    attempt = flowstream.current_step().attempt
    if attempt == 1:
        raise ConnectionError("first attempt fails")
    return f"{key}@{attempt}"


@app.step
def finish(parts: list[str]) -> str:
    return "+".join(parts)


@app.workflow(signals=["go"])
async def errand(ctx: flowstream.Context, key: str) -> str:
    first = await ctx.step(wobbly, key)
    await ctx.sleep(0.1)
    word = await ctx.wait_for_signal("go", str)
    both = await ctx.gather(ctx.step(wobbly, f"{key}-a"), ctx.step(wobbly, f"{key}-b"))
    return await ctx.step(finish, [first, word, *both])


@app.workflow
async def napper(ctx: flowstream.Context) -> str:
    await ctx.sleep(0.05)
    return await ctx.step(wobbly, "nap")


@app.workflow
async def counter(ctx: flowstream.Context, n: int) -> int:
    """Continues as new until ``n`` is 3: a handle's result is the chain's last output."""
    if n < 3:
        ctx.continue_as_new(n + 1)
    return n
