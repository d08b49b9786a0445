"""``FlowRuntime``: the two entry points user code implements.

``run_workflow`` decides the next command from history and has no side effects; ``run_step``
performs side effects and runs at least once. Either may be a coroutine function.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol, runtime_checkable

from flowstream.model.base import JSON
from flowstream.model.commands import RuntimeCommand
from flowstream.replay.context import StepInvocation, WorkflowInvocation

__all__ = ["FlowRuntime"]


@runtime_checkable
class FlowRuntime(Protocol):
    """What the engine calls: one decision per replay cycle, and step handlers."""

    def run_workflow(
        self, invocation: WorkflowInvocation
    ) -> RuntimeCommand | Awaitable[RuntimeCommand]: ...

    def run_step(self, invocation: StepInvocation) -> JSON | Awaitable[JSON]: ...
