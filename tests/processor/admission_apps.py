"""Runtimes for the admission tests: ``runtime``, whose workflow code raises until the file its
input names exists (the fix an operator deploys), and ``family``, a parent and a child that
declares its input model."""

from __future__ import annotations

import os

from pydantic import BaseModel

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


class KidInput(BaseModel):
    count: int


PARENT = WorkflowSpec(name="parent")
KID = WorkflowSpec(name="kid")


class Family:
    """``parent`` starts the child ``kid`` with the input its own input names and completes
    with how the child ended; ``kid`` declares its input model."""

    workflow_inputs = {"parent": None, "kid": KidInput}

    def run_workflow(self, invocation: WorkflowInvocation) -> RuntimeCommand:
        ctx = invocation.context()
        if invocation.spec.name == "kid":
            return ctx.complete(ctx.input_as(KidInput).count)
        assert isinstance(invocation.input, dict)
        outcome = ctx.child_workflow_outcome("k")
        if outcome is None:
            return ctx.start_child_workflow("k", KID, invocation.input["kid"])
        return ctx.complete(
            {"type": outcome.type, "output": outcome.output, "error": outcome.error}
        )

    def run_step(self, invocation: StepInvocation) -> JSON:
        raise LookupError(invocation.step_name)


family = Family()
