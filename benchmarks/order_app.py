"""The peers' workload as a flowstream runtime: ``order`` = validate → reserve → charge.

The step bodies are copied verbatim from ``../shared/bench/peers/common.py`` (pure functions on
small JSON dicts, no sleep, no I/O). ``runtime`` is what ``flowstream worker --app
benchmarks.order_app:runtime`` serves.
"""

from __future__ import annotations

from flowstream.model.base import JSON
from flowstream.model.commands import RuntimeCommand
from flowstream.model.spec import WorkflowSpec
from flowstream.replay.context import StepInvocation, WorkflowInvocation

__all__ = ["N_STEPS", "SPEC", "STEPS", "OrderRuntime", "check_result", "make_input", "runtime"]

SPEC = WorkflowSpec(name="order")


def step_validate(order: dict) -> dict:  # type: ignore[type-arg]
    return {"order_id": order["order_id"], "items": order["items"], "valid": True}


def step_reserve(v: dict) -> dict:  # type: ignore[type-arg]
    return {"order_id": v["order_id"], "reserved": len(v["items"]), "ok": v["valid"]}


def step_charge(r: dict) -> dict:  # type: ignore[type-arg]
    return {"order_id": r["order_id"], "charged": r["reserved"] * 10, "status": "done"}


STEPS = {"validate": step_validate, "reserve": step_reserve, "charge": step_charge}
N_STEPS = len(STEPS)


def make_input(i: int) -> dict:  # type: ignore[type-arg]
    return {"order_id": f"o-{i}", "items": ["a", "b", "c"]}


def check_result(i: int, res: object) -> None:
    assert res == {"order_id": f"o-{i}", "charged": 30, "status": "done"}, res


class OrderRuntime:
    """Schedules the first step not yet completed, feeding it the previous step's output."""

    def run_workflow(self, invocation: WorkflowInvocation) -> RuntimeCommand:
        ctx = invocation.context()
        previous: JSON = ctx.input
        for name in STEPS:
            if not ctx.step_completed(name):
                return ctx.schedule_step(name, name, previous)
            previous = ctx.step_output(name)
        return ctx.complete(previous)

    def run_step(self, invocation: StepInvocation) -> JSON:
        return STEPS[invocation.step_name](invocation.input)  # type: ignore[arg-type]


runtime = OrderRuntime()
