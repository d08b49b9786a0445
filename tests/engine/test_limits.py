"""Limits (issue 3): oversized events are rejected before anything is written, and run ids and
other identities are validated.

Every scenario runs in both modes (``tests.support.flows``): embedded, and on a real Kafka
processor through ``FlowClient``; the differences by design are in docs/parity.md."""

from __future__ import annotations

import pytest

from flowstream.errors import InvalidIdentifierError, PayloadTooLargeError
from flowstream.model.commands import RuntimeCommand
from flowstream.model.snapshot import RunStatus
from flowstream.replay.context import WorkflowContext
from flowstream.replay.state import RunState
from flowstream.stores.base import MAX_EVENT_BYTES
from tests.support import event_types, make_runtime, spec, task_failed
from tests.support.flows import Flow, Flows, KafkaFlow

SPEC = spec("limits", signal_names=("go",))
BIG = "x" * (MAX_EVENT_BYTES + 1)


def echo_workflow(ctx: WorkflowContext) -> RuntimeCommand:
    if ctx.input == "big-output":
        return ctx.complete(BIG)
    if ctx.input == "big-step":
        if not ctx.step_completed("s"):
            return ctx.schedule_step("s", "big")
        return ctx.complete()
    if ctx.input == "hook":
        if not ctx.hook_received("h"):
            return ctx.create_hook("h", "limits-token")
        return ctx.complete()
    return ctx.wait_for_signal("sw", "go")


def make_flow(flows: Flows) -> Flow:
    return flows(make_runtime(echo_workflow, {"big": lambda inv: BIG}))


def test_an_oversized_input_creates_no_run(flows: Flows) -> None:
    flow = make_flow(flows)
    with pytest.raises(PayloadTooLargeError) as caught:
        flow.start("r1", SPEC, BIG)
    assert caught.value.limit == MAX_EVENT_BYTES
    assert "reference" in str(caught.value)  # says what to do instead
    assert not flow.exists("r1")


def test_an_oversized_workflow_output_appends_nothing(flows: Flows) -> None:
    flow = make_flow(flows)
    with pytest.raises(PayloadTooLargeError):
        flow.start("r1", SPEC, "big-output")
    history = flow.history_now("r1")  # (the run waits for a fix: it never settles)
    assert event_types(history) == ["run_created", "run_started"]
    assert RunState.from_history(history).snapshot().status is RunStatus.RUNNING


def test_an_oversized_step_output_fails_the_step_for_good(flows: Flows) -> None:
    """The output is never committed, and the attempt is not retried into a crash loop."""
    flow = make_flow(flows)
    snapshot = flow.start("r1", SPEC, "big-step")
    history = flow.history("r1")
    kinds = event_types(history)
    assert "step_completed" not in kinds
    assert kinds.count("step_started") == 1
    failure = next(e.event for e in history if e.event.type == "step_non_retryable")
    assert "exceeds the limit" in failure.error  # type: ignore[union-attr]
    assert snapshot.status is RunStatus.FAILED


def test_oversized_signal_and_hook_payloads_append_nothing(flows: Flows) -> None:
    flow = make_flow(flows)
    flow.start("sig", SPEC, "signal")
    before = flow.history("sig")
    with pytest.raises(PayloadTooLargeError):
        flow.signal("sig", "go", BIG, id="s1")
    assert flow.history("sig") == before

    flow.start("hook", SPEC, "hook")
    before = flow.history("hook")
    with pytest.raises(PayloadTooLargeError):
        flow.resume_hook("hook", "h", BIG)
    assert flow.history("hook") == before
    assert flow.resume_hook("hook", "h", "small").status is RunStatus.COMPLETED


def real_id(flow: Flow, run_id: str) -> str:
    """``run_id`` as the test's mode sends it: on Kafka inside the test's namespace, a long one
    keeping its length."""
    if flow.mode == "embedded":
        return run_id
    prefix = flow.id("")
    return prefix + run_id[len(prefix) :] if len(run_id) > 100 else flow.id(run_id)


@pytest.mark.parametrize("run_id", ["", "white space", "semi;colon", "ünïcode", "a/b", "x" * 201])
def test_invalid_run_ids_are_rejected(flows: Flows, run_id: str) -> None:
    flow = make_flow(flows)
    with pytest.raises(InvalidIdentifierError) as caught:
        if isinstance(flow, KafkaFlow) and not run_id:
            flow.client.start(run_id, SPEC, "signal")  # not put in the test's namespace
        else:
            flow.start(real_id(flow, run_id), SPEC, "signal")
    assert "run id" in str(caught.value)
    assert not run_id or not flow.exists(real_id(flow, run_id))


def test_valid_run_ids_are_accepted(flows: Flows) -> None:
    flow = make_flow(flows)
    ids = [real_id(flow, run_id) for run_id in ("a", "order-2026-0001", "A_b-9", "x" * 200)]
    assert len(ids[-1]) == 200
    for run_id in ids:
        flow.start(run_id, SPEC, "signal")
    assert all(flow.exists(run_id) for run_id in ids)


@pytest.mark.parametrize(
    "command",
    [
        lambda ctx: ctx.schedule_step("bad\nid", "work"),
        lambda ctx: ctx.wait_for_signal("bad\tid", "go"),
        lambda ctx: ctx.create_hook("bad\x00id", "limits-token"),
        lambda ctx: ctx.start_child_workflow("bad\rid", spec("child")),
    ],
    ids=["step", "signal-wait", "hook", "child"],
)
def test_malformed_identities_are_rejected_before_appending(flows: Flows, command: object) -> None:
    flow = flows(make_runtime(command))  # type: ignore[arg-type]
    task_failed(flow.start("r1", SPEC), flow.history("r1"), error=InvalidIdentifierError)
    assert event_types(flow.history("r1")) == [
        "run_created",
        "run_started",
        "workflow_task_failed",
    ]
