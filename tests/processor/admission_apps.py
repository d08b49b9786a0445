"""A runtime for the admission tests: its workflow code raises until the file its input names
exists, which stands for the fix an operator deploys."""

from __future__ import annotations

import os

from flowstream.model.base import JSON
from flowstream.model.commands import RuntimeCommand
from flowstream.model.spec import WorkflowSpec
from flowstream.replay.context import StepInvocation, WorkflowInvocation

SPEC = WorkflowSpec(name="fragile")


class Fragile:
    """One step, then complete; ``run_workflow`` raises ``ValueError`` until ``fixed`` exists."""

    def run_workflow(self, invocation: WorkflowInvocation) -> RuntimeCommand:
        ctx = invocation.context()
        options = invocation.input
        assert isinstance(options, dict)
        if not os.path.exists(str(options["fixed"])):
            raise ValueError("the workflow code has a bug")
        if not ctx.step_completed("work"):
            return ctx.schedule_step("work", "work", None)
        return ctx.complete(ctx.step_output("work"))

    def run_step(self, invocation: StepInvocation) -> JSON:
        return {"worked": True}


runtime = Fragile()
