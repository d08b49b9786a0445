"""The kafka mode's runtime routing (``tests.support.processors.RoutingRuntime``): the tests of a
session share a processor, and each run's decisions and steps go to the runtime of the test that
started it, a child's and a successor's (whose ids are derived) to their parent's."""

from __future__ import annotations

import pytest

from flowstream.model.events import ParentLink, RunCreated, RunStarted
from flowstream.replay.context import WorkflowInvocation
from flowstream.replay.decide import derived_run_id
from flowstream.replay.state import RunState
from tests.support import envelope, make_runtime, spec
from tests.support.processors import RoutingRuntime


def invocation(run_id: str, parent: str | None = None) -> WorkflowInvocation:
    link = None if parent is None else ParentLink(run_id=parent, child_id="c")
    history = [
        envelope(run_id, 1, RunCreated(spec=spec("wf"), parent=link)),
        envelope(run_id, 2, RunStarted()),
    ]
    state = RunState.from_history(history)
    return WorkflowInvocation(run_id, spec("wf"), None, history, state)


def test_runs_go_to_their_tests_runtime_and_derived_runs_to_their_parents() -> None:
    router = RoutingRuntime()
    first = make_runtime(lambda ctx: ctx.complete("first"))
    second = make_runtime(lambda ctx: ctx.complete("second"))
    router.register("kaaa", first)
    router.register("kbbb", second)

    router.run_workflow(invocation("kaaa-r1"))
    router.run_workflow(invocation("kbbb-r1"))
    child = derived_run_id("kbbb-r1", "child", "c")
    router.run_workflow(invocation(child, parent="kbbb-r1"))
    grandchild = derived_run_id(child, "child", "c")
    router.run_workflow(invocation(grandchild, parent=child))

    assert [c.run_id for c in first.workflow_calls] == ["kaaa-r1"]
    assert [c.run_id for c in second.workflow_calls] == ["kbbb-r1", child, grandchild]
    with pytest.raises(LookupError, match="no test runtime"):
        router.run_workflow(invocation("kzzz-r1"))
