"""Hooks (issue 4): resume by run and hook id or by token alone, idempotent repeats, conflicting
payloads, disposal, one active owner per token across runs, and tokens that never leak.

Every scenario runs in both modes (``tests.support.flows``): embedded, and on a real Kafka
processor through ``FlowClient``; the differences by design are in docs/parity.md."""

from __future__ import annotations

import pytest

from flowstream.errors import (
    CommandParkedError,
    FlowError,
    HookTokenConflictError,
    InvalidTransitionError,
    RunConflictError,
)
from flowstream.model.commands import RuntimeCommand
from flowstream.model.snapshot import HookStatus, RunStatus
from flowstream.replay.context import WorkflowContext
from flowstream.replay.decide import token_digest
from tests.support import event_types, events_of, make_runtime, spec
from tests.support.flows import EmbeddedFlow, Flow, Flows

SPEC = spec("approval")
TOKEN = "tok-9f8e7d6c5b4a-secret"


def approval(ctx: WorkflowContext) -> RuntimeCommand:
    """Creates hook ``approve`` with the token from the input, then completes with its payload."""
    assert isinstance(ctx.input, dict)
    if ctx.hook_disposed("approve"):
        return ctx.complete("disposed")
    if not ctx.hook_received("approve"):
        return ctx.create_hook("approve", ctx.input["token"], {"kind": "human_approval"})
    return ctx.complete(ctx.hook_payload("approve"))


def start(flow: Flow, run_id: str, token: str = TOKEN) -> object:
    return flow.start(run_id, SPEC, {"token": token})


def test_a_hook_suspends_until_resumed_by_run_and_hook_id(flows: Flows) -> None:
    runtime = make_runtime(approval)
    flow = flows(runtime)
    snapshot = start(flow, "r1")
    assert snapshot.status is RunStatus.SUSPENDED  # type: ignore[attr-defined]
    assert snapshot.hooks["approve"].status is HookStatus.ACTIVE  # type: ignore[attr-defined]
    assert snapshot.hooks["approve"].metadata == {"kind": "human_approval"}  # type: ignore[attr-defined]
    calls = len(runtime.workflow_calls)
    flow.retry("r1")
    assert len(runtime.workflow_calls) == calls

    snapshot = flow.resume_hook("r1", "approve", {"ok": True})
    assert snapshot.status is RunStatus.COMPLETED  # type: ignore[attr-defined]
    assert snapshot.output == {"ok": True}  # type: ignore[attr-defined]
    assert snapshot.hooks["approve"].status is HookStatus.RECEIVED  # type: ignore[attr-defined]


def test_a_hook_can_be_resumed_by_its_token_alone(flows: Flows) -> None:
    flow = flows(make_runtime(approval))
    start(flow, "r1", "token-for-r1")
    start(flow, "r2", "token-for-r2")
    snapshot = flow.resume_hook_by_token("token-for-r2", "yes")
    assert snapshot.run_id == flow.id("r2")
    assert snapshot.output == "yes"
    assert flow.snapshot("r1").status is RunStatus.SUSPENDED


def test_a_repeated_identical_resume_is_idempotent(flows: Flows) -> None:
    flow = flows(make_runtime(approval))
    start(flow, "r1")
    flow.resume_hook("r1", "approve", "yes")
    flow.resume_hook("r1", "approve", "yes")
    flow.resume_hook_by_token(TOKEN, "yes")
    assert len(events_of(flow.history("r1"), "hook_received")) == 1


def test_a_different_payload_after_a_resume_conflicts(flows: Flows) -> None:
    flow = flows(make_runtime(approval))
    start(flow, "r1")
    flow.resume_hook("r1", "approve", "yes")
    before = flow.history("r1")
    with pytest.raises(RunConflictError) as caught:
        flow.resume_hook("r1", "approve", "no")
    assert TOKEN not in str(caught.value)
    with pytest.raises(RunConflictError) as caught:
        flow.resume_hook_by_token(TOKEN, "no")
    assert TOKEN not in str(caught.value)
    assert flow.history("r1") == before


def test_a_disposed_hook_is_seen_by_workflow_code_and_cannot_be_resumed(flows: Flows) -> None:
    flow = flows(make_runtime(approval))
    start(flow, "r1")
    snapshot = flow.dispose_hook("r1", "approve")
    assert snapshot.output == "disposed"
    assert snapshot.hooks["approve"].status is HookStatus.DISPOSED
    with pytest.raises(FlowError) as caught:
        flow.resume_hook_by_token(TOKEN, "late")
    assert TOKEN not in str(caught.value)
    with pytest.raises(InvalidTransitionError):
        flow.resume_hook("r1", "approve", "late")
    assert "hook_received" not in event_types(flow.history("r1"))


def test_an_active_token_belongs_to_one_hook_across_runs(flows: Flows) -> None:
    flow = flows(make_runtime(approval))
    start(flow, "owner")
    if isinstance(flow, EmbeddedFlow):
        with pytest.raises(HookTokenConflictError) as caught:
            start(flow, "second")
        err = caught.value
        assert err.owner_run_id == "owner" and err.owner_hook_id == "approve"
        assert "owner" in str(err)
        assert TOKEN not in str(err) and TOKEN not in repr(err)
        assert token_digest(TOKEN) not in str(err)
        assert "hook_created" not in event_types(flow.history("second"))
    else:
        # Difference by design (docs/parity.md, "a hook token taken elsewhere"): the token's
        # claim is decided on its digest's partition after the start, and the refusal comes
        # back to the claimant as a recorded HookTokenConflictError that undoes its hook.
        start(flow, "second")
        second = flow.until("second", lambda s: s.task_failure is not None)
        assert second.task_failure is not None
        assert second.task_failure.error_type == "HookTokenConflictError"
        message = second.task_failure.message
        assert flow.id("owner") in message and "approve" in message
        assert TOKEN not in message and token_digest(TOKEN) not in message
        assert "approve" not in second.hooks or second.hooks["approve"].status is not (
            HookStatus.ACTIVE
        )

    # Once the owner's hook is settled the token is free again.
    flow.resume_hook("owner", "approve", "done")
    assert flow.retry("second").status is RunStatus.SUSPENDED
    assert flow.resume_hook_by_token(TOKEN, "second's").run_id == flow.id("second")


def test_an_unknown_token_is_an_error_that_does_not_echo_it(flows: Flows) -> None:
    flow = flows(make_runtime(approval))
    with pytest.raises(FlowError) as caught:
        flow.resume_hook_by_token("never-issued-token", 1)
    assert "never-issued-token" not in str(caught.value)


def test_a_hook_can_be_created_from_a_token_digest(flows: Flows) -> None:
    def by_digest(ctx: WorkflowContext) -> RuntimeCommand:
        if not ctx.hook_received("h"):
            return ctx.create_hook("h", token_digest=token_digest(TOKEN))
        return ctx.complete(ctx.hook_payload("h"))

    flow = flows(make_runtime(by_digest))
    flow.start("r1", SPEC)
    assert flow.resume_hook_by_token(TOKEN, 42).output == 42


def test_resuming_an_unknown_hook_is_an_invalid_transition(flows: Flows) -> None:
    flow = flows(make_runtime(approval))
    start(flow, "r1")
    if isinstance(flow, EmbeddedFlow):
        with pytest.raises(InvalidTransitionError):
            flow.resume_hook("r1", "nope", 1)
    else:
        # Difference by design (docs/parity.md, "a hook that does not exist yet"): the
        # resumption waits in the run's inbox for the hook, and says why.
        with pytest.raises(CommandParkedError) as parked:
            flow.resume_hook("r1", "nope", 1)
        assert parked.value.kind == InvalidTransitionError.__name__


def test_tokens_never_appear_in_repr_snapshots_histories_or_storage(flows: Flows) -> None:
    seen_invocations: list[str] = []

    def observed(ctx: WorkflowContext) -> RuntimeCommand:
        # The token is a host secret known to the code, not part of the run's input.
        if not ctx.hook_received("approve"):
            command = ctx.create_hook("approve", TOKEN, {"kind": "human_approval"})
        else:
            command = ctx.complete(ctx.hook_payload("approve"))
        seen_invocations.append(repr(command))
        return command

    flow = flows(make_runtime(observed))
    snapshot = flow.start("r1", SPEC, {"order": 1})
    texts = [
        repr(snapshot),
        snapshot.model_dump_json(),
        *seen_invocations,
        *(e.model_dump_json() for e in flow.history("r1")),
        repr(flow.history("r1")),
    ]
    if isinstance(flow, EmbeddedFlow):
        texts += [
            repr(flow.engine.list_open_suspensions()),
            flow.engine.summary().model_dump_json(),
        ]
    # (On Kafka every topic and state directory is scanned for the token by
    # tests/processor/test_hook_tokens.py.)
    for text in texts:
        assert TOKEN not in text
    assert any("approve" in text for text in texts)
    if isinstance(flow, EmbeddedFlow) and flows.stores is not None and flows.stores.durable:
        raw = flows.stores.stored_bytes(flow.store)
        assert b"approve" in raw
        assert TOKEN.encode() not in raw
