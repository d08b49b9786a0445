"""Runtimes for the tests of the defects the processor review found (issue 15).

``poisoned``: one step ``a``, then complete. While ``FLOWSTREAM_TEST_POISON`` is ``on`` (or the
file ``FLOWSTREAM_TEST_POISON_FLAG`` names exists), the workflow code of the run named
:data:`POISON_RUN` raises ``KeyError`` once ``a`` has completed: a bug in user code that shows
only when a step outcome drives the run, outside any command. With the variable unset (or the
file removed: the bug fixed in a running worker), the same run completes.
"""

from __future__ import annotations

import os
from pathlib import Path

from flowstream.model.base import JSON
from flowstream.model.commands import RuntimeCommand
from flowstream.model.spec import WorkflowSpec
from flowstream.replay.context import StepInvocation, WorkflowInvocation
from tests.processor.apps import _log

POISON_ENV = "FLOWSTREAM_TEST_POISON"
POISON_FLAG_ENV = "FLOWSTREAM_TEST_POISON_FLAG"
POISON_RUN = "poison"
#: The ``KeyError``'s key: a missing configuration entry, as a real bug might look up.
MISSING_KEY = "region-of-customer"

ONE_STEP = WorkflowSpec(name="one-step")


def _bug_in() -> bool:
    flag = os.environ.get(POISON_FLAG_ENV)
    return os.environ.get(POISON_ENV) == "on" or bool(flag and Path(flag).exists())


class Poisoned:
    def run_workflow(self, invocation: WorkflowInvocation) -> RuntimeCommand:
        ctx = invocation.context()
        if not ctx.step_completed("a"):
            return ctx.schedule_step("a", "a", {"run": invocation.run_id})
        if invocation.run_id == POISON_RUN and _bug_in():
            settings: dict[str, str] = {}
            return ctx.complete(settings[MISSING_KEY])  # KeyError: the bug
        return ctx.complete({"a": ctx.step_output("a")})

    def run_step(self, invocation: StepInvocation) -> JSON:
        _log(invocation)
        return {"step": invocation.step_id}


poisoned = Poisoned()
