"""A runtime for the embedded CLI tests: a run waits for signal ``go``, then completes."""

from __future__ import annotations

from flowstream.model.commands import RuntimeCommand
from flowstream.replay.context import WorkflowContext
from tests.support import make_runtime, spec

SPEC = spec("stall", signal_names=("go",))


def waits_for_go(ctx: WorkflowContext) -> RuntimeCommand:
    if not ctx.signal_received("w1"):
        return ctx.wait_for_signal("w1", "go")
    return ctx.complete(ctx.signal_payload("w1"))


runtime = make_runtime(waits_for_go)
