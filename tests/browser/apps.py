"""The workflow the console tests drive, in the gateway's process (embedded) or in real
``flowstream worker`` processes (Kafka): an order that is checked (a step that fails its first
attempt when asked, so the page has an attempt with an error), may continue as new or start a
child, waits for a signal or for a manager's approval through a hook, then ships.

Options in the input: ``flaky`` (the check fails once), ``hops`` (continue as new that many
times first), ``child`` (a child order runs and ends first), ``signal`` (wait for ``go``),
``hook_digest`` (wait for hook ``approval`` whose token has this SHA-256 digest; the token
itself stays out of the input, which the console shows).
"""

from __future__ import annotations

from datetime import timedelta

from flowstream.model.base import JSON
from flowstream.model.commands import RuntimeCommand
from flowstream.model.spec import RetryPolicy, WorkflowSpec
from flowstream.replay.context import StepInvocation, WorkflowInvocation

SPEC = WorkflowSpec(name="console-order", signal_names=("go",))
CHECK_RETRY = RetryPolicy.fixed(3, timedelta(milliseconds=100))


class ConsoleOrder:
    """check → (continue | child) → (signal | hook) → ship; a cancellation request cancels it."""

    def run_workflow(self, invocation: WorkflowInvocation) -> RuntimeCommand:
        ctx = invocation.context()
        options = invocation.input if isinstance(invocation.input, dict) else {}
        if ctx.cancellation_request() is not None:
            return ctx.cancel()
        if not ctx.step_completed("check"):
            return ctx.schedule_step("check", "check", {"order": invocation.run_id}, CHECK_RETRY)
        hops = int(options.get("hops", 0))
        if hops:
            return ctx.continue_as_new({**options, "hops": hops - 1, "flaky": False})
        if options.get("child") and ctx.child_workflow_outcome("packing") is None:
            return ctx.start_child_workflow("packing", SPEC, {"parent": invocation.run_id})
        if options.get("signal") and not ctx.signal_received("go"):
            return ctx.wait_for_signal("go", "go")
        digest = options.get("hook_digest")
        if digest and not ctx.hook_received("approval"):
            return ctx.create_hook(
                "approval", token_digest=str(digest), metadata={"ask": "approve the order"}
            )
        if not ctx.step_completed("ship"):
            return ctx.schedule_step("ship", "ship", {"check": ctx.step_output("check")})
        approval: JSON = ctx.hook_payload("approval") if digest else None
        return ctx.complete({"shipped": ctx.step_output("ship"), "approval": approval})

    def run_step(self, invocation: StepInvocation) -> JSON:
        raw = getattr(invocation.history[0].event, "input", None)
        options = raw if isinstance(raw, dict) else {}
        if invocation.step_id == "check" and options.get("flaky") and invocation.attempt == 1:
            raise ConnectionError("the stock service did not answer")
        return {"step": invocation.step_id, "attempt": invocation.attempt}


runtime = ConsoleOrder()
