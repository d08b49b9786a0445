"""The runtime the chain-parity tests run inside real ``flowstream worker`` processes.

``chain-parent`` starts the children its input lists (``{"kids": [{"id", "hops", "wait",
"hold_file", "policy", "build"}]}``; ``"build": "kid-v2"`` pins a child to that build) and
completes with each one's outcome once all have ended; asked to cancel, it waits for them and
then cancels.

``chain-kid`` continues as new ``hops`` times, then runs its ``work`` step (held until
``hold_file`` exists, when given) and, with ``"wait": "signal"``, waits for the ``go`` signal;
it completes with the signal's payload, or fails with ``fail``'s text. Asked to cancel, it
cancels at once.

With ``"wait_first": true`` either first waits for a ``go`` signal (wait id ``first``), so a
test can make it move on in the same poll as another command.

Every step execution is appended to ``$FLOWSTREAM_TEST_STEP_LOG`` (as in ``tests.processor.apps``).
"""

from __future__ import annotations

import os
import time

import orjson

from flowstream.model.base import JSON
from flowstream.model.commands import RuntimeCommand
from flowstream.model.events import ChildCancellationPolicy
from flowstream.model.spec import WorkflowSpec
from flowstream.replay.context import StepInvocation, WorkflowContext, WorkflowInvocation

PARENT = WorkflowSpec(name="chain-parent", signal_names=("go",))
KID = WorkflowSpec(name="chain-kid", signal_names=("go",))
#: The kid pinned to a build a worker serves only when started with ``--build kid-v2=...``.
KID_V2 = WorkflowSpec(name="chain-kid", runtime_build_id="kid-v2", signal_names=("go",))


def _options(value: JSON) -> dict[str, JSON]:
    return dict(value) if isinstance(value, dict) else {}


def _parent(ctx: WorkflowContext) -> RuntimeCommand:
    if _options(ctx.input).get("wait_first") and not ctx.signal_received("first"):
        return ctx.wait_for_signal("first", "go")
    listed = _options(ctx.input).get("kids")
    kids = [_options(k) for k in listed] if isinstance(listed, list) else []
    outcomes = {str(k["id"]): ctx.child_workflow_outcome(str(k["id"])) for k in kids}
    if kids and any(o is None for o in outcomes.values()):
        return ctx.start_child_workflows(
            [
                ctx.child_workflow(
                    str(k["id"]),
                    KID_V2 if k.get("build") == KID_V2.runtime_build_id else KID,
                    {key: value for key, value in k.items() if key not in ("id", "build")},
                    ChildCancellationPolicy(str(k.get("policy", "request_cancellation"))),
                )
                for k in kids
            ]
        )
    if ctx.cancellation_request() is not None:
        return ctx.cancel()
    return ctx.complete(
        {
            kid: {"type": o.type, "output": o.output, "error": o.error}
            for kid, o in outcomes.items()
            if o is not None
        }
    )


def _kid(ctx: WorkflowContext) -> RuntimeCommand:
    options = _options(ctx.input)
    if ctx.cancellation_request() is not None:
        return ctx.cancel()
    if options.get("wait_first") and not ctx.signal_received("first"):
        return ctx.wait_for_signal("first", "go")
    hops = int(str(options.get("hops", 0)))
    if hops:
        successor = {k: v for k, v in options.items() if k != "wait_first"}
        return ctx.continue_as_new({**successor, "hops": hops - 1})
    if not ctx.step_completed("work"):
        return ctx.schedule_step("work", "work", {"hold_file": options.get("hold_file")})
    if options.get("wait") == "signal" and not ctx.signal_received("go"):
        return ctx.wait_for_signal("go", "go")
    if options.get("fail"):
        return ctx.fail(str(options["fail"]))
    return ctx.complete({"go": ctx.signal_payload("go")})


def _log(invocation: StepInvocation) -> None:
    path = os.environ.get("FLOWSTREAM_TEST_STEP_LOG")
    if path:
        line = orjson.dumps({"run": invocation.run_id, "step": invocation.step_id})
        with open(path, "ab") as handle:
            handle.write(line + b"\n")


class ChainRuntime:
    def run_workflow(self, invocation: WorkflowInvocation) -> RuntimeCommand:
        ctx = invocation.context()
        return _parent(ctx) if invocation.spec.name == PARENT.name else _kid(ctx)

    def run_step(self, invocation: StepInvocation) -> JSON:
        _log(invocation)
        options = _options(invocation.input)
        hold = options.get("hold_file")
        while hold and not os.path.exists(str(hold)):
            time.sleep(0.02)
        return {"worked": invocation.run_id}


runtime = ChainRuntime()
