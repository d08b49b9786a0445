"""Runtimes the processor tests run inside real ``flowstream worker`` processes.

Every step execution is appended to the file named by ``FLOWSTREAM_TEST_STEP_LOG`` (one JSON line:
run, step, attempt, pid), so tests can count how often a step really ran.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

import orjson

from flowstream.model.base import JSON
from flowstream.model.commands import RuntimeCommand
from flowstream.model.spec import RetryPolicy, WorkflowSpec
from flowstream.replay.context import StepInvocation, WorkflowInvocation

SPEC = WorkflowSpec(name="three-steps", signal_names=("go",))
SPEC_V1 = WorkflowSpec(name="three-steps", runtime_build_id="build-1", signal_names=("go",))
SPEC_V2 = WorkflowSpec(name="three-steps", runtime_build_id="build-2", signal_names=("go",))


def _log(invocation: StepInvocation) -> None:
    path = os.environ.get("FLOWSTREAM_TEST_STEP_LOG")
    if path:
        line = orjson.dumps(
            {
                "run": invocation.run_id,
                "step": invocation.step_id,
                "attempt": invocation.attempt,
                "key": invocation.idempotency_key,
                "pid": os.getpid(),
                "started": time.time(),
                "build": os.environ.get("FLOWSTREAM_TEST_BUILD", ""),
            }
        )
        with open(path, "ab") as handle:
            handle.write(line + b"\n")


class ThreeSteps:
    """validate → reserve → charge; options in the input add a signal, a timer, slow steps,
    steps held until a file exists, a failing-once step with a delayed retry."""

    def run_workflow(self, invocation: WorkflowInvocation) -> RuntimeCommand:
        ctx = invocation.context()
        options = invocation.input if isinstance(invocation.input, dict) else {}
        if options.get("signal") and not ctx.signal_received("go"):
            return ctx.wait_for_signal("go", "go")
        if options.get("hook_digest") and not ctx.hook_received("approval"):
            return ctx.create_hook("approval", token_digest=str(options["hook_digest"]))
        if options.get("child") and ctx.child_workflow_outcome("kid") is None:
            kid: dict[str, JSON] = {"parent": invocation.run_id}
            if options.get("child_hops"):  # the child continues as new that many times
                kid["continue_hops"] = options["child_hops"]
            if options.get("child_timer_ms"):  # then waits that long
                kid["timer_ms"] = options["child_timer_ms"]
            return ctx.start_child_workflow("kid", SPEC, kid)
        hops = int(options.get("continue_hops", 0))
        if hops:
            return ctx.continue_as_new({**options, "continue_hops": hops - 1})
        if options.get("timer_ms") and not ctx.wait_completed("pause"):
            return ctx.wait_for("pause", timedelta(milliseconds=int(options["timer_ms"])))
        previous: JSON = invocation.input
        for name in ("validate", "reserve", "charge"):
            if not ctx.step_completed(name):
                retry = RetryPolicy.fixed(3, 200) if options.get("flaky") == name else None
                return ctx.schedule_step(name, name, {"from": previous}, retry)
            previous = ctx.step_output(name)
        return ctx.complete(
            {
                "charged": previous,
                "go": ctx.signal_payload("go"),
                "approval": ctx.hook_payload("approval"),
                "kid": None if ctx.child_workflow_outcome("kid") is None else "done",
            }
        )

    def run_step(self, invocation: StepInvocation) -> JSON:
        _log(invocation)
        origin = invocation.input
        options = {}
        history_input = invocation.history[0].event
        raw = getattr(history_input, "input", None)
        if isinstance(raw, dict):
            options = raw
        if options.get("step_sleep_ms"):
            time.sleep(int(options["step_sleep_ms"]) / 1000)
        if options.get("hold_file"):  # the test creates it to let held steps finish
            while not os.path.exists(str(options["hold_file"])):
                time.sleep(0.02)
        for _ in range(int(options.get("step_io", 0))):  # short system calls, as a client makes
            os.stat(".")
        if options.get("flaky") == invocation.step_id and invocation.attempt == 1:
            raise ConnectionError("flaky dependency")
        return {"step": invocation.step_id, "attempt": invocation.attempt, "n": len(str(origin))}


runtime = ThreeSteps()


runtime_v1 = ThreeSteps()
runtime_v2 = ThreeSteps()


class Drifted(ThreeSteps):
    """Today's code validates other input than the code that wrote the histories."""

    def run_workflow(self, invocation: WorkflowInvocation) -> RuntimeCommand:
        ctx = invocation.context()
        if not ctx.step_completed("validate"):
            return ctx.schedule_step("validate", "validate", {"from": "somewhere else"})
        return super().run_workflow(invocation)


drifted = Drifted()
