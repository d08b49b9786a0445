"""Hooks (issue 4): resume by run and hook id or by token alone, idempotent repeats, conflicting
payloads, disposal, one active owner per token across runs, and tokens that never leak."""

from __future__ import annotations

import pytest

from flowstream.engine import FlowEngine
from flowstream.errors import (
    FlowError,
    HookTokenConflictError,
    InvalidTransitionError,
    RunConflictError,
)
from flowstream.model.commands import RuntimeCommand
from flowstream.model.snapshot import HookStatus, RunStatus
from flowstream.replay.context import WorkflowContext
from flowstream.replay.decide import token_digest
from flowstream.stores.base import EventStore
from tests.support import FakeClock, event_types, events_of, make_runtime, run, spec
from tests.support.stores import StoreFactory

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


def start(engine: FlowEngine, run_id: str, token: str = TOKEN) -> object:
    return run(engine.start(run_id, SPEC, {"token": token}))


def test_a_hook_suspends_until_resumed_by_run_and_hook_id(
    store: EventStore, clock: FakeClock
) -> None:
    runtime = make_runtime(approval)
    engine = FlowEngine(store, runtime, clock=clock)
    snapshot = start(engine, "r1")
    assert snapshot.status is RunStatus.SUSPENDED  # type: ignore[attr-defined]
    assert snapshot.hooks["approve"].status is HookStatus.ACTIVE  # type: ignore[attr-defined]
    assert snapshot.hooks["approve"].metadata == {"kind": "human_approval"}  # type: ignore[attr-defined]
    calls = len(runtime.workflow_calls)
    run(engine.drive("r1"))
    assert len(runtime.workflow_calls) == calls

    snapshot = run(engine.resume_hook("r1", "approve", {"ok": True}))
    assert snapshot.status is RunStatus.COMPLETED  # type: ignore[attr-defined]
    assert snapshot.output == {"ok": True}  # type: ignore[attr-defined]
    assert snapshot.hooks["approve"].status is HookStatus.RECEIVED  # type: ignore[attr-defined]


def test_a_hook_can_be_resumed_by_its_token_alone(store: EventStore, clock: FakeClock) -> None:
    engine = FlowEngine(store, make_runtime(approval), clock=clock)
    start(engine, "r1", "token-for-r1")
    start(engine, "r2", "token-for-r2")
    snapshot = run(engine.resume_hook_by_token("token-for-r2", "yes"))
    assert snapshot.run_id == "r2"
    assert snapshot.output == "yes"
    assert engine.snapshot("r1").status is RunStatus.SUSPENDED


def test_a_repeated_identical_resume_is_idempotent(store: EventStore, clock: FakeClock) -> None:
    engine = FlowEngine(store, make_runtime(approval), clock=clock)
    start(engine, "r1")
    run(engine.resume_hook("r1", "approve", "yes"))
    run(engine.resume_hook("r1", "approve", "yes"))
    run(engine.resume_hook_by_token(TOKEN, "yes"))
    assert len(events_of(store.read("r1"), "hook_received")) == 1


def test_a_different_payload_after_a_resume_conflicts(store: EventStore, clock: FakeClock) -> None:
    engine = FlowEngine(store, make_runtime(approval), clock=clock)
    start(engine, "r1")
    run(engine.resume_hook("r1", "approve", "yes"))
    before = store.read("r1")
    with pytest.raises(RunConflictError) as caught:
        run(engine.resume_hook("r1", "approve", "no"))
    assert TOKEN not in str(caught.value)
    with pytest.raises(RunConflictError) as caught:
        run(engine.resume_hook_by_token(TOKEN, "no"))
    assert TOKEN not in str(caught.value)
    assert store.read("r1") == before


def test_a_disposed_hook_is_seen_by_workflow_code_and_cannot_be_resumed(
    store: EventStore, clock: FakeClock
) -> None:
    engine = FlowEngine(store, make_runtime(approval), clock=clock)
    start(engine, "r1")
    snapshot = run(engine.dispose_hook("r1", "approve"))
    assert snapshot.output == "disposed"
    assert snapshot.hooks["approve"].status is HookStatus.DISPOSED
    with pytest.raises(FlowError) as caught:
        run(engine.resume_hook_by_token(TOKEN, "late"))
    assert TOKEN not in str(caught.value)
    with pytest.raises(InvalidTransitionError):
        run(engine.resume_hook("r1", "approve", "late"))
    assert "hook_received" not in event_types(store.read("r1"))


def test_an_active_token_belongs_to_one_hook_across_runs(
    store: EventStore, clock: FakeClock
) -> None:
    engine = FlowEngine(store, make_runtime(approval), clock=clock)
    start(engine, "owner")
    with pytest.raises(HookTokenConflictError) as caught:
        start(engine, "second")
    err = caught.value
    assert err.owner_run_id == "owner" and err.owner_hook_id == "approve"
    assert "owner" in str(err)
    assert TOKEN not in str(err) and TOKEN not in repr(err)
    assert token_digest(TOKEN) not in str(err)
    assert "hook_created" not in event_types(store.read("second"))

    # Once the owner's hook is settled the token is free again.
    run(engine.resume_hook("owner", "approve", "done"))
    assert run(engine.drive("second")).status is RunStatus.SUSPENDED
    assert run(engine.resume_hook_by_token(TOKEN, "second's")).run_id == "second"


def test_an_unknown_token_is_an_error_that_does_not_echo_it(store: EventStore) -> None:
    engine = FlowEngine(store, make_runtime(approval))
    with pytest.raises(FlowError) as caught:
        run(engine.resume_hook_by_token("never-issued-token", 1))
    assert "never-issued-token" not in str(caught.value)


def test_a_hook_can_be_created_from_a_token_digest(store: EventStore, clock: FakeClock) -> None:
    def by_digest(ctx: WorkflowContext) -> RuntimeCommand:
        if not ctx.hook_received("h"):
            return ctx.create_hook("h", token_digest=token_digest(TOKEN))
        return ctx.complete(ctx.hook_payload("h"))

    engine = FlowEngine(store, make_runtime(by_digest), clock=clock)
    run(engine.start("r1", SPEC))
    assert run(engine.resume_hook_by_token(TOKEN, 42)).output == 42


def test_resuming_an_unknown_hook_is_an_invalid_transition(
    store: EventStore, clock: FakeClock
) -> None:
    engine = FlowEngine(store, make_runtime(approval), clock=clock)
    start(engine, "r1")
    with pytest.raises(InvalidTransitionError):
        run(engine.resume_hook("r1", "nope", 1))


def test_tokens_never_appear_in_repr_snapshots_histories_or_storage(
    stores: StoreFactory, store: EventStore, clock: FakeClock
) -> None:
    seen_invocations: list[str] = []

    def observed(ctx: WorkflowContext) -> RuntimeCommand:
        # The token is a host secret known to the code, not part of the run's input.
        if not ctx.hook_received("approve"):
            command = ctx.create_hook("approve", TOKEN, {"kind": "human_approval"})
        else:
            command = ctx.complete(ctx.hook_payload("approve"))
        seen_invocations.append(repr(command))
        return command

    engine = FlowEngine(store, make_runtime(observed), clock=clock)
    snapshot = run(engine.start("r1", SPEC, {"order": 1}))
    texts = [
        repr(snapshot),
        snapshot.model_dump_json(),  # type: ignore[attr-defined]
        *seen_invocations,
        *(e.model_dump_json() for e in store.read("r1")),
        repr(store.read("r1")),
        repr(engine.list_open_suspensions()),
        engine.summary().model_dump_json(),
    ]
    for text in texts:
        assert TOKEN not in text
    assert any("approve" in text for text in texts)
    if stores.durable:
        raw = stores.stored_bytes(store)
        assert b"approve" in raw
        assert TOKEN.encode() not in raw
