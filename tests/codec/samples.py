"""One filled-in sample of every event and message, and hypothesis strategies for JSON values.

Samples set every optional field, so a field the codec dropped would show up as a difference.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any, get_args

from hypothesis import strategies as st
from pydantic import BaseModel, SecretStr

from flowstream.model.base import JSON
from flowstream.model.events import (
    ChildCancellationPolicy,
    ChildWorkflowRequested,
    ChildWorkflowResolved,
    EventEnvelope,
    FlowEvent,
    HookCreated,
    HookDisposed,
    HookReceived,
    ParentLink,
    RunCancellationRequested,
    RunCancelled,
    RunCompleted,
    RunContinuedAsNew,
    RunCreated,
    RunFailed,
    RunProgressRecorded,
    RunRetryExhausted,
    RunStarted,
    RunTimedOut,
    SignalReceived,
    SignalWaitCompleted,
    SignalWaitCreated,
    StepCancelled,
    StepCompleted,
    StepCreated,
    StepFailed,
    StepNonRetryable,
    StepRetrying,
    StepStarted,
    TerminalOutcome,
    WaitCompleted,
    WaitCreated,
    WorkflowProgress,
    WorkflowTaskFailed,
)
from flowstream.model.messages import (
    CancelRun,
    CommandMessage,
    DeadLetter,
    DeadLetterHeader,
    DisposeHook,
    FireTimer,
    HookTokenRejected,
    RegisterHookToken,
    ReleaseHookToken,
    ResolveChild,
    ResumeHook,
    RetryRun,
    SendSignal,
    StartRun,
)
from flowstream.model.spec import RetryPolicy, WorkflowSpec

T0 = datetime(2026, 3, 1, 12, 30, 45, 123456, tzinfo=UTC)
TOKEN = "hk_live_9f8e7d6c5b4a39281706f5e4d3c2b1a0"  # a recognisable fake bearer token
DIGEST = "5e" * 32

SPEC = WorkflowSpec(
    name="order",
    version="7",
    runtime_build_id="build-2026.03/a",
    patch_markers=("fix-tax", "v2.retry"),
    signal_names=("approve", "reject"),
)
PAYLOAD: JSON = {
    "amount": 4200,
    "ratio": 0.1,
    "ok": True,
    "none": None,
    "tags": ["a", "ü", "😀"],
    "nested": {"empty": {}, "list": []},
}
OUTCOME = TerminalOutcome(
    type="continued_as_new",
    output=[1, 2.5, "three"],
    error="boom",
    step_id="s1",
    successor_run_id="order-1-next",
)

EVENT_TYPES: tuple[type[BaseModel], ...] = get_args(get_args(FlowEvent)[0])
COMMAND_TYPES: tuple[type[BaseModel], ...] = get_args(get_args(CommandMessage)[0])


def sample_events() -> list[Any]:
    """One instance of every event type, optional fields set."""
    return [
        RunCreated(
            spec=SPEC,
            input=PAYLOAD,
            parent=ParentLink(run_id="parent-1", child_id="c1", continued=False),
            depth=2,
        ),
        RunStarted(),
        RunCompleted(output="done"),
        RunFailed(error="it broke: ValueError('x')"),
        RunCancellationRequested(reason="user asked"),
        RunCancelled(reason="forced"),
        RunTimedOut(deadline=T0 + timedelta(hours=1), reason="deadline"),
        RunRetryExhausted(step_id="charge", attempt=3, error="card declined"),
        RunContinuedAsNew(successor_run_id="order-1-2", input={"page": 2}),
        RunProgressRecorded(
            progress=WorkflowProgress(progress_id="rows", completed=10, total=20, message="half")
        ),
        StepCreated(
            step_id="charge",
            step_name="charge_card",
            input=PAYLOAD,
            retry=RetryPolicy.exponential(5, 100, 10_000).continue_workflow_on_failure(),
        ),
        StepStarted(step_id="charge", attempt=2),
        StepCompleted(step_id="charge", output={"charge_id": "ch_1"}),
        StepRetrying(step_id="charge", attempt=1, error="timeout", retry_after=T0),
        StepFailed(step_id="charge", attempt=5, error="declined"),
        StepNonRetryable(step_id="charge", attempt=1, error="invalid card"),
        StepCancelled(step_id="charge", attempt=2, reason="run cancelled"),
        WaitCreated(wait_id="sleep-1", resume_at=T0 + timedelta(days=3)),
        WaitCompleted(wait_id="sleep-1"),
        SignalReceived(signal_id="sig-1", name="approve", payload=PAYLOAD),
        SignalWaitCreated(wait_id="w-approve", signal_name="approve"),
        SignalWaitCompleted(wait_id="w-approve", signal_id="sig-1"),
        HookCreated(hook_id="approval", token_digest=DIGEST, metadata={"kind": "human"}),
        HookReceived(hook_id="approval", payload=[True, None]),
        HookDisposed(hook_id="approval"),
        ChildWorkflowRequested(
            child_id="c1",
            child_run_id="order-1-c1",
            spec=SPEC,
            input=12,
            cancellation_policy=ChildCancellationPolicy.ABANDON,
        ),
        ChildWorkflowResolved(child_id="c1", outcome=OUTCOME),
        WorkflowTaskFailed(attempt=2, error_type="KeyError", message="'region'", retry_at=T0),
    ]


def envelope(event: Any, sequence: int = 1, *, run_id: str = "order-1") -> EventEnvelope:
    return EventEnvelope(
        run_id=run_id,
        sequence=sequence,
        event_id=f"{run_id}:{sequence}",
        timestamp=T0 + timedelta(microseconds=sequence),
        event=event,
    )


def sample_messages() -> list[Any]:
    """Every command message (both hook addressing forms) and a dead letter."""
    return [
        StartRun(
            run_id="order-1-c1",
            spec=SPEC,
            input=PAYLOAD,
            parent=ParentLink(run_id="order-1", child_id="c1"),
            depth=1,
        ),
        StartRun(run_id="order-2", spec=WorkflowSpec(name="order")),
        SendSignal(run_id="order-1", signal_id="sig-1", name="approve", payload=PAYLOAD),
        ResumeHook(run_id="order-1", hook_id="approval", payload={"approved": True}),
        ResumeHook(token=SecretStr(TOKEN), payload={"approved": False}),
        DisposeHook(run_id="order-1", hook_id="approval"),
        CancelRun(run_id="order-1", reason="user asked", force=True),
        CancelRun(run_id="order-1"),
        RetryRun(run_id="order-1"),
        FireTimer(run_id="order-1", kind="wait", subject_id="sleep-1", due=T0),
        FireTimer(
            run_id="order-1",
            kind="retry",
            subject_id="charge",
            due=T0.astimezone(timezone(timedelta(hours=-5))),
        ),
        ResolveChild(run_id="order-1", child_id="c1", child_run_id="order-1-c1", outcome=OUTCOME),
        RegisterHookToken(token_digest="ab" * 32, run_id="order-1", hook_id="approval"),
        ResumeHook(run_id="order-1", hook_id="approval", token_digest="cd" * 32, payload=1),
        RegisterHookToken(token_digest="ab" * 32, run_id="order-1", hook_id="h2", sequence=7),
        ReleaseHookToken(token_digest="ab" * 32, run_id="order-1", hook_id="approval"),
        HookTokenRejected(
            run_id="order-2",
            hook_id="approval",
            sequence=4,
            owner_run_id="order-1",
            owner_hook_id="approval",
        ),
        DeadLetter(
            source_topic="flowstream.cmd.hook",
            partition=3,
            offset=1234567890123,
            key=b"order-1",
            reason="cannot decode flowstream.message.ResumeHook",
            value=b"\xc3\x01garbage",
            headers=(DeadLetterHeader(key="trace", value=b"abc"), DeadLetterHeader(key="x")),
        ),
    ]


def json_values() -> st.SearchStrategy[JSON]:
    """Arbitrary JSON as orjson writes it: finite floats, integers within 64 bits."""
    scalars = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**63), max_value=2**64 - 1)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text()
    )
    return st.recursive(
        scalars,
        lambda children: (
            st.lists(children, max_size=5)
            | st.dictionaries(st.text(max_size=10), children, max_size=5)
        ),
        max_leaves=25,
    )


def aware_datetimes() -> st.SearchStrategy[datetime]:
    """Aware datetimes whose microseconds since the epoch fit a long."""
    return st.datetimes(
        min_value=datetime(1, 1, 2),
        max_value=datetime(9999, 12, 30),
        timezones=st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30))]),
    )
