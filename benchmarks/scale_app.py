"""The runtime of ``benchmarks/scale.py``: two one-step workflows.

* ``scale-park`` runs step ``touch``, then waits for the signal ``go``, then completes: started
  and left alone, a run stays suspended with six events in its history.
* ``scale-one`` runs step ``touch`` and completes.

The step returns its input. ``runtime`` is what ``flowstream worker --app
benchmarks.scale_app:runtime`` serves.
"""

from __future__ import annotations

from flowstream.model.base import JSON
from flowstream.model.commands import RuntimeCommand
from flowstream.model.spec import WorkflowSpec
from flowstream.replay.context import StepInvocation, WorkflowInvocation

__all__ = ["ONE", "PARK", "SIGNAL", "ScaleRuntime", "runtime"]

SIGNAL = "go"
PARK = WorkflowSpec(name="scale-park", signal_names=(SIGNAL,))
ONE = WorkflowSpec(name="scale-one")


class ScaleRuntime:
    """One step; ``scale-park`` then waits for ``go``."""

    def run_workflow(self, invocation: WorkflowInvocation) -> RuntimeCommand:
        ctx = invocation.context()
        if not ctx.step_completed("touch"):
            return ctx.schedule_step("touch", "touch", ctx.input)
        if ctx.spec.name == PARK.name and not ctx.signal_received(SIGNAL):
            return ctx.wait_for_signal(SIGNAL, SIGNAL)
        return ctx.complete(ctx.step_output("touch"))

    def run_step(self, invocation: StepInvocation) -> JSON:
        return invocation.input


runtime = ScaleRuntime()
