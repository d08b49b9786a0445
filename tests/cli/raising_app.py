"""The stall workflow's runtime whose workflow code raises once the signal has arrived (a bug
shipped after the run started)."""

from __future__ import annotations

from flowstream.model.commands import RuntimeCommand
from flowstream.replay.context import WorkflowContext
from tests.support import make_runtime


def raises_after_go(ctx: WorkflowContext) -> RuntimeCommand:
    if not ctx.signal_received("w1"):
        return ctx.wait_for_signal("w1", "go")
    raise ValueError("bug in my workflow code")


runtime = make_runtime(raises_after_go)
