"""Determinism (issues 3, 4 and 16): when a durable identity reappears with other parameters, the
drive records a failed workflow task of ``NonDeterministicError`` naming the run and showing
``history=…; replay=…`` (hook tokens never shown), and nothing else is appended.

Each case runs version 1 of a workflow until it parks on a running step (its handler "crashes"),
then drives the same history with version 2, whose decision for one identity has drifted."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import pytest

from flowstream.engine import FlowEngine
from flowstream.errors import NonDeterministicError
from flowstream.model.commands import RuntimeCommand
from flowstream.model.events import ChildCancellationPolicy
from flowstream.model.spec import RetryPolicy
from flowstream.replay.context import StepInvocation, WorkflowContext
from flowstream.stores.base import EventStore
from tests.support import EPOCH, Crash, FakeClock, make_runtime, run, spec, task_failed

SPEC = spec("drift", signal_names=("approve", "reject"))
CHILD = spec("child")
T1 = EPOCH + timedelta(minutes=5)
T2 = EPOCH + timedelta(minutes=6)
ABANDON = ChildCancellationPolicy.ABANDON

Decision = Callable[[WorkflowContext, int], RuntimeCommand | None]


@dataclass(frozen=True)
class Case:
    """``decide(ctx, version)`` returns the drifting command, or None once it is satisfied (v1)."""

    decide: Decision
    resume: Callable[[FlowEngine], object] | None = None
    fragment: str = ""
    redacted: tuple[str, ...] = ()


def _step(name: str = "work", input: object = 1, retry: RetryPolicy | None = None) -> Decision:
    def decide(ctx: WorkflowContext, version: int) -> RuntimeCommand | None:
        if version == 1 and ctx.step_completed("a"):
            return None
        return ctx.schedule_step("a", name, input, retry)  # type: ignore[arg-type]

    return decide


def _versioned(v1: Decision, v2: Decision) -> Decision:
    return lambda ctx, version: v1(ctx, 1) if version == 1 else v2(ctx, 2)


def _wait(deadline: object) -> Decision:
    def decide(ctx: WorkflowContext, version: int) -> RuntimeCommand | None:
        if version == 1 and ctx.wait_completed("w"):
            return None
        return ctx.wait_until("w", deadline)  # type: ignore[arg-type]

    return decide


def _hook(token: str, metadata: object) -> Decision:
    def decide(ctx: WorkflowContext, version: int) -> RuntimeCommand | None:
        if version == 1 and ctx.hook_received("h"):
            return None
        return ctx.create_hook("h", token, metadata)  # type: ignore[arg-type]

    return decide


def _signal_wait(name: str) -> Decision:
    def decide(ctx: WorkflowContext, version: int) -> RuntimeCommand | None:
        if version == 1 and ctx.signal_received("sw"):
            return None
        return ctx.wait_for_signal("sw", name)

    return decide


def _child(
    child_spec: object = CHILD,
    input: object = {"n": 1},
    policy: ChildCancellationPolicy = ChildCancellationPolicy.REQUEST_CANCELLATION,
) -> Decision:
    def decide(ctx: WorkflowContext, version: int) -> RuntimeCommand | None:
        if version == 1 and ctx.child_workflow_outcome("c") is not None:
            return None
        return ctx.start_child_workflow("c", child_spec, input, policy)  # type: ignore[arg-type]

    return decide


def _progress(completed: int) -> Decision:
    def decide(ctx: WorkflowContext, version: int) -> RuntimeCommand | None:
        if version == 1 and ctx.progress("p") is not None:
            return None
        return ctx.record_progress("p", completed, 10)

    return decide


CASES = {
    "step-name": Case(_versioned(_step(), _step(name="other")), fragment="step a name"),
    "step-input": Case(_versioned(_step(), _step(input=2)), fragment="step a input"),
    "step-retry": Case(
        _versioned(_step(), _step(retry=RetryPolicy.fixed(5, 10))), fragment="step a retry policy"
    ),
    "wait-deadline": Case(
        _versioned(_wait(T1), _wait(T2)),
        resume=lambda engine: engine.resume_wait("r1", "w", now=T2),
        fragment="wait w resume_at",
    ),
    "hook-token": Case(
        _versioned(_hook("secret-one", {"m": 1}), _hook("secret-two", {"m": 1})),
        resume=lambda engine: engine.resume_hook("r1", "h", "ok"),
        fragment="hook h token",
        redacted=("secret-one", "secret-two"),
    ),
    "hook-metadata": Case(
        _versioned(_hook("secret-one", {"m": 1}), _hook("secret-one", {"m": 2})),
        resume=lambda engine: engine.resume_hook("r1", "h", "ok"),
        fragment="hook h metadata",
        redacted=("secret-one",),
    ),
    "signal-wait-name": Case(
        _versioned(_signal_wait("approve"), _signal_wait("reject")),
        resume=lambda engine: engine.send_signal("r1", "sig-1", "approve", True),
        fragment="signal wait sw name",
    ),
    "child-spec": Case(
        _versioned(_child(), _child(child_spec=spec("child", version="2"))),
        fragment="child workflow c",
    ),
    "child-input": Case(_versioned(_child(), _child(input={"n": 2})), fragment="child workflow c"),
    "child-policy": Case(_versioned(_child(), _child(policy=ABANDON)), fragment="child workflow c"),
    "progress": Case(_versioned(_progress(1), _progress(2)), fragment="progress p"),
}


def _runtime(case: Case, version: dict[str, int]):  # type: ignore[no-untyped-def]
    crashes = {"left": 1}

    def parent(ctx: WorkflowContext) -> RuntimeCommand:
        command = case.decide(ctx, version["v"])
        if command is not None:
            return command
        if not ctx.step_completed("pause"):
            return ctx.schedule_step("pause", "pause")
        return ctx.complete("done")

    def pause(invocation: StepInvocation) -> object:
        if crashes["left"]:
            crashes["left"] -= 1
            raise Crash
        return None

    return make_runtime(
        {"drift": parent, "child": lambda ctx: ctx.complete(ctx.input)},
        {"work": lambda inv: "worked", "other": lambda inv: "other", "pause": pause},
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_drifted_definition_is_reported_and_nothing_is_appended(
    store: EventStore, clock: FakeClock, name: str
) -> None:
    case = CASES[name]
    version = {"v": 1}
    runtime = _runtime(case, version)
    engine = FlowEngine(store, runtime, clock=clock)
    if case.resume is None:
        with pytest.raises(Crash):
            run(engine.start("r1", SPEC))
    else:
        run(engine.start("r1", SPEC))
        with pytest.raises(Crash):
            run(case.resume(engine))  # type: ignore[arg-type]
    before = store.read("r1")
    assert before[-1].event.type == "step_started"  # parked on the running "pause" step
    pauses = len(runtime.calls_of("pause"))

    version["v"] = 2
    snapshot = run(engine.drive("r1"))

    failure = task_failed(snapshot, store.read("r1"), before, NonDeterministicError)
    message = failure.message
    assert "r1" in message
    assert case.fragment in message
    if case.redacted:
        assert "redacted" in message or "history=" in message
        for secret in case.redacted:
            assert secret not in message
            assert secret not in repr(failure)
    else:
        assert "history=" in message and "; replay=" in message
    assert len(runtime.calls_of("pause")) == pauses


def test_the_step_diff_shows_both_values(store: EventStore, clock: FakeClock) -> None:
    version = {"v": 1}
    runtime = _runtime(CASES["step-input"], version)
    engine = FlowEngine(store, runtime, clock=clock)
    with pytest.raises(Crash):
        run(engine.start("r1", SPEC))
    version["v"] = 2
    snapshot = run(engine.drive("r1"))
    failure = task_failed(snapshot, store.read("r1"), error=NonDeterministicError)
    assert "history=1; replay=2" in failure.message


def test_child_batch_order_drift_is_nondeterministic(store: EventStore, clock: FakeClock) -> None:
    version = {"v": 1}
    crashes = {"left": 1}

    def parent(ctx: WorkflowContext) -> RuntimeCommand:
        ids = ["x", "y"] if version["v"] == 1 else ["y", "x"]
        if version["v"] == 2 or any(ctx.child_workflow_outcome(i) is None for i in ids):
            return ctx.start_child_workflows([ctx.child_workflow(i, CHILD, i) for i in ids])
        return ctx.schedule_step("pause", "pause")

    def pause(invocation: StepInvocation) -> object:
        if crashes["left"]:
            crashes["left"] -= 1
            raise Crash
        return None

    runtime = make_runtime(
        {"drift": parent, "child": lambda ctx: ctx.complete(ctx.input)}, {"pause": pause}
    )
    engine = FlowEngine(store, runtime, clock=clock)
    with pytest.raises(Crash):
        run(engine.start("r1", SPEC))
    before = store.read("r1")
    version["v"] = 2
    snapshot = run(engine.drive("r1"))
    failure = task_failed(snapshot, store.read("r1"), before, NonDeterministicError)
    assert "order" in failure.message
