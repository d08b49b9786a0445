"""``WorkflowContext``: replay-safe reads derived only from the history, typed decoding that fails
loudly, and command builders."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from pydantic import BaseModel

from flowstream.errors import SerializationError
from flowstream.model.commands import (
    CompleteCommand,
    ScheduleStepCommand,
    ScheduleStepsCommand,
    WaitUntilCommand,
)
from flowstream.model.events import (
    FlowEvent,
    HookCreated,
    HookReceived,
    RunCreated,
    RunStarted,
    SignalReceived,
    SignalWaitCompleted,
    SignalWaitCreated,
    StepCompleted,
    StepCreated,
    StepFailed,
    StepStarted,
    WaitCreated,
)
from flowstream.model.spec import RetryPolicy
from flowstream.replay.context import WorkflowContext, WorkflowInvocation
from flowstream.replay.decide import token_digest
from flowstream.replay.state import RunState
from tests.support import EPOCH, envelope, spec

SPEC = spec("ctx", patch_markers=("new-branch",), signal_names=("go",))


class Order(BaseModel):
    order_id: str
    quantity: int


def context(*events: FlowEvent, input: object = None, run_id: str = "r1") -> WorkflowContext:
    all_events = [RunCreated(spec=SPEC, input=input), RunStarted(), *events]
    envelopes = [
        envelope(run_id, i, e, at=EPOCH + timedelta(seconds=i))
        for i, e in enumerate(all_events, start=1)
    ]
    state = RunState.from_history(envelopes)
    return WorkflowInvocation(run_id, SPEC, input, state.history, state).context()


def test_input_decodes_into_a_model_or_fails_loudly() -> None:
    ctx = context(input={"order_id": "o-1", "quantity": 2})
    assert ctx.input_as(Order) == Order(order_id="o-1", quantity=2)
    with pytest.raises(SerializationError) as caught:
        context(input={"order_id": "o-1"}).input_as(Order)
    assert "Order" in str(caught.value)


def test_step_reads_reflect_committed_events_only() -> None:
    ctx = context(
        StepCreated(step_id="done", step_name="n"),
        StepStarted(step_id="done", attempt=1),
        StepCompleted(step_id="done", output={"order_id": "o", "quantity": 1}),
        StepCreated(step_id="running", step_name="n", retry=RetryPolicy.none()),
        StepStarted(step_id="running", attempt=1),
        StepCreated(step_id="failed", step_name="n", retry=RetryPolicy.none()),
        StepStarted(step_id="failed", attempt=1),
        StepFailed(step_id="failed", attempt=1, error="nope"),
    )
    assert ctx.step_completed("done") and ctx.step_output("done") == {
        "order_id": "o",
        "quantity": 1,
    }
    assert ctx.step_output_as("done", Order) == Order(order_id="o", quantity=1)
    assert not ctx.step_completed("running") and ctx.step_output("running") is None
    assert ctx.step_output_as("running", Order) is None
    assert ctx.step_failed("failed") == "nope" and ctx.step_failed("done") is None
    assert ctx.step_failed("missing") is None


def test_typed_reads_of_signals_and_hooks_fail_loudly() -> None:
    ctx = context(
        SignalReceived(signal_id="s", name="go", payload={"wrong": 1}),
        SignalWaitCreated(wait_id="w", signal_name="go"),
        SignalWaitCompleted(wait_id="w", signal_id="s"),
        HookCreated(hook_id="h", token_digest=token_digest("t")),
        HookReceived(hook_id="h", payload=[1, 2]),
    )
    assert ctx.signal_received("w") and ctx.signal_payload("w") == {"wrong": 1}
    assert ctx.hook_received("h") and ctx.hook_payload("h") == [1, 2]
    with pytest.raises(SerializationError):
        ctx.signal_payload_as("w", Order)
    with pytest.raises(SerializationError):
        ctx.hook_payload_as("h", Order)
    assert ctx.signal_payload_as("other", Order) is None


def test_logical_time_is_the_commit_time_of_the_last_event() -> None:
    assert context().logical_time() == EPOCH + timedelta(seconds=2)
    assert context(StepCreated(step_id="s", step_name="n")).logical_time() == EPOCH + timedelta(
        seconds=3
    )


def test_deterministic_ids_are_stable_and_distinct() -> None:
    first = context(run_id="r1").deterministic_id("payment")
    assert first == context(run_id="r1").deterministic_id("payment")
    assert first != context(run_id="r1").deterministic_id("refund")
    assert first != context(run_id="r2").deterministic_id("payment")
    # Lengths are part of the derivation: shifting characters between run id and name differs.
    assert context(run_id="ab").deterministic_id("c") != context(run_id="a").deterministic_id("bc")
    assert uuid.UUID(first).version == 5


def test_patch_markers_come_from_the_pinned_spec() -> None:
    ctx = context()
    assert ctx.has_patch_marker("new-branch")
    assert not ctx.has_patch_marker("other")


def test_wait_for_reuses_the_durable_deadline() -> None:
    fresh = context().wait_for("w", timedelta(minutes=5))
    assert fresh.resume_at == EPOCH + timedelta(seconds=2, minutes=5)
    durable = EPOCH + timedelta(hours=3)
    replayed = context(WaitCreated(wait_id="w", resume_at=durable)).wait_for(
        "w", timedelta(minutes=5)
    )
    assert isinstance(replayed, WaitUntilCommand) and replayed.resume_at == durable


def test_builders_make_the_documented_commands() -> None:
    ctx = context()
    assert isinstance(ctx.complete(1), CompleteCommand)
    step = ctx.schedule_step("a", "n", {"x": 1})
    assert isinstance(step, ScheduleStepCommand) and step.step.retry == RetryPolicy()
    batch = ctx.schedule_steps([ctx.step("a", "n"), ctx.step("b", "n", retry=RetryPolicy.none())])
    assert isinstance(batch, ScheduleStepsCommand)
    assert [s.step_id for s in batch.steps] == ["a", "b"]
    hook = ctx.create_hook("h", "bearer-secret")
    assert "bearer-secret" not in repr(hook)
    assert "bearer-secret" not in hook.model_dump_json()
