"""The workflows the gateway tests start over HTTP, embedded and in a real worker.

``approval`` waits for a hook whose token's digest its input carries, then for the ``note``
signal when its input asks for one; ``waiter`` waits for the ``go`` signal; ``sleeper`` sleeps a
minute (something to cancel). No step does I/O, so runs move as fast as their commands.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

import flowstream

app = flowstream.App()


class ApprovalRequest(BaseModel):
    subject: str
    token_digest: str
    note: bool = False


@app.step
def record(decision: Any) -> dict[str, Any]:
    return {"recorded": decision}


@app.workflow(signals=["note"])
async def approval(ctx: flowstream.Context, request: ApprovalRequest) -> dict[str, Any]:
    decision = await ctx.hook("decision", token_digest=request.token_digest)
    note = await ctx.wait_for_signal("note") if request.note else None
    return {"subject": request.subject, "decision": await ctx.step(record, decision), "note": note}


@app.workflow(signals=["go"])
async def waiter(ctx: flowstream.Context) -> Any:
    return await ctx.wait_for_signal("go")


@app.workflow
async def sleeper(ctx: flowstream.Context) -> str:
    await ctx.sleep(60)
    return "woke"
