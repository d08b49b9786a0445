"""The pure decision core: ``decide(state, command, now)`` and ``engine_repair(state)``. No store,
no clock: the same history and command always give the same decision."""

from __future__ import annotations

from datetime import timedelta

import pytest

from flowstream.errors import InvalidIdentifierError, InvalidTransitionError, NonDeterministicError
from flowstream.model.commands import RuntimeCommand, StepCommand
from flowstream.model.events import (
    ChildCancellationPolicy,
    ChildWorkflowRequested,
    FlowEvent,
    HookCreated,
    RunCreated,
    RunStarted,
    SignalReceived,
    SignalWaitCreated,
    StepCompleted,
    StepCreated,
    StepFailed,
    StepNonRetryable,
    StepRetrying,
    StepStarted,
    WaitCreated,
)
from flowstream.model.spec import RetryPolicy
from flowstream.replay.decide import (
    BATCH_ABORT_REASON,
    decide,
    derived_run_id,
    engine_repair,
    is_suspended,
    step_outcome_events,
    token_digest,
)
from flowstream.replay.state import RunState
from tests.support import EPOCH, envelope, spec

SPEC = spec("decide", signal_names=("go",))
NOW = EPOCH + timedelta(seconds=10)
NONE = RetryPolicy.none()


def state_of(*events: FlowEvent, run_id: str = "r1") -> RunState:
    all_events = [RunCreated(spec=SPEC), RunStarted(), *events]
    return RunState.from_history(envelope(run_id, i, e) for i, e in enumerate(all_events, start=1))


def created(step_id: str, input: object = None, retry: RetryPolicy = NONE) -> StepCreated:
    return StepCreated(step_id=step_id, step_name="n", input=input, retry=retry)  # type: ignore[arg-type]


def test_the_same_state_and_command_give_the_same_decision() -> None:
    command = RuntimeCommand.schedule_steps(
        [StepCommand(step_id="a", step_name="n"), StepCommand(step_id="b", step_name="n")]
    )
    first = decide(state_of(), command, NOW)
    second = decide(state_of(), command, NOW)
    assert first == second
    assert [type(e).__name__ for e in first.events] == [
        "StepCreated",
        "StepCreated",
        "StepStarted",
        "StepStarted",
    ]
    assert first.run_steps == ["a", "b"]


def test_decide_does_not_change_the_state() -> None:
    state = state_of()
    decide(state, RuntimeCommand.schedule_step("a", "n"), NOW)
    assert state.steps == {} and state.last_sequence == 2


@pytest.mark.parametrize(
    ("history_input", "replay_input"),
    [
        ({"qty": 1}, {"qty": 2}),
        ({"qty": 1}, {"qty": "1"}),
        ([1, 2], [2, 1]),
        ({"a": None}, {}),
    ],
)
def test_a_drifted_step_input_is_nondeterministic(
    history_input: object, replay_input: object
) -> None:
    state = state_of(created("a", history_input))
    with pytest.raises(NonDeterministicError) as caught:
        decide(state, RuntimeCommand.schedule_step("a", "n", replay_input, NONE), NOW)  # type: ignore[arg-type]
    assert caught.value.run_id == "r1"
    assert "history=" in str(caught.value) and "replay=" in str(caught.value)


@pytest.mark.parametrize(
    ("history_input", "replay_input"),
    [({"qty": 1}, {"qty": True}), ({"flag": False}, {"flag": 0})],
)
def test_json_booleans_and_numbers_are_different_values(
    history_input: object, replay_input: object
) -> None:
    state = state_of(created("a", history_input))
    with pytest.raises(NonDeterministicError):
        decide(state, RuntimeCommand.schedule_step("a", "n", replay_input, NONE), NOW)  # type: ignore[arg-type]


def test_object_key_order_is_not_a_drift() -> None:
    state = state_of(created("a", {"x": 1, "y": 2}), StepStarted(step_id="a", attempt=1))
    decision = decide(state, RuntimeCommand.schedule_step("a", "n", {"y": 2, "x": 1}, NONE), NOW)
    assert decision.run_steps == ["a"] and decision.events == []


def test_a_batch_validates_every_identity_before_deciding_anything() -> None:
    state = state_of(created("old", {"v": 1}))
    command = RuntimeCommand.schedule_steps(
        [
            StepCommand(step_id="new", step_name="n", retry=NONE),
            StepCommand(step_id="old", step_name="n", input={"v": 2}, retry=NONE),
        ]
    )
    with pytest.raises(NonDeterministicError):
        decide(state, command, NOW)


def test_a_batch_skips_settled_and_future_siblings() -> None:
    delayed = RetryPolicy.fixed(3, 60_000)
    state = state_of(
        created("done"),
        created("later", retry=delayed),
        created("due", retry=delayed),
        StepStarted(step_id="done", attempt=1),
        StepStarted(step_id="later", attempt=1),
        StepStarted(step_id="due", attempt=1),
        StepCompleted(step_id="done"),
        StepRetrying(step_id="later", attempt=1, error="e", retry_after=NOW + timedelta(seconds=1)),
        StepRetrying(step_id="due", attempt=1, error="e", retry_after=NOW),
    )
    command = RuntimeCommand.schedule_steps(
        [
            StepCommand(step_id="done", step_name="n", retry=NONE),
            StepCommand(step_id="later", step_name="n", retry=delayed),
            StepCommand(step_id="due", step_name="n", retry=delayed),
            StepCommand(step_id="fresh", step_name="n", retry=NONE),
        ]
    )
    decision = decide(state, command, NOW)
    assert decision.run_steps == ["due", "fresh"]
    started = [(e.step_id, e.attempt) for e in decision.events if isinstance(e, StepStarted)]
    assert started == [("due", 2), ("fresh", 1)]


def test_a_batch_larger_than_the_limit_is_rejected() -> None:
    steps = [StepCommand(step_id=f"s{i}", step_name="n") for i in range(257)]
    with pytest.raises(InvalidTransitionError):
        decide(state_of(), RuntimeCommand.schedule_steps(steps), NOW)


def test_a_malformed_step_id_is_rejected() -> None:
    with pytest.raises(InvalidIdentifierError):
        decide(state_of(), RuntimeCommand.schedule_step("a\nb", "n"), NOW)


def test_continue_as_new_is_refused_with_open_children_or_signals() -> None:
    open_child = state_of(
        ChildWorkflowRequested(
            child_id="c",
            child_run_id="cr",
            spec=spec("child"),
            cancellation_policy=ChildCancellationPolicy.ABANDON,
        )
    )
    unconsumed = state_of(SignalReceived(signal_id="s", name="go"))
    waiting = state_of(SignalWaitCreated(wait_id="w", signal_name="go"))
    for state in (open_child, unconsumed, waiting):
        with pytest.raises(InvalidTransitionError):
            decide(state, RuntimeCommand.continue_as_new({"n": 1}), NOW)


def test_continuation_and_child_run_ids_are_derived_deterministically() -> None:
    first = decide(state_of(), RuntimeCommand.continue_as_new(1), NOW)
    second = decide(state_of(), RuntimeCommand.continue_as_new(1), NOW)
    assert first.events == second.events
    assert derived_run_id("r1", "child", "c") == derived_run_id("r1", "child", "c")
    assert derived_run_id("r1", "child", "c") != derived_run_id("r2", "child", "c")
    assert derived_run_id("r1", "child", "c") != derived_run_id("r1", "continue", "c")


def test_a_hook_token_and_its_digest_are_the_same_identity() -> None:
    state = state_of(HookCreated(hook_id="h", token_digest=token_digest("secret")))
    by_token = decide(state, RuntimeCommand.create_hook("h", "secret"), NOW)
    by_digest = decide(
        state, RuntimeCommand.create_hook("h", token_digest=token_digest("secret")), NOW
    )
    assert by_token.suspend and by_digest.suspend
    with pytest.raises(NonDeterministicError) as caught:
        decide(state, RuntimeCommand.create_hook("h", "other-secret"), NOW)
    assert "secret" not in str(caught.value).replace("(values redacted)", "")


def test_a_create_hook_needs_exactly_one_token_form() -> None:
    with pytest.raises(ValueError):
        RuntimeCommand.create_hook("h")
    with pytest.raises(ValueError):
        RuntimeCommand.create_hook("h", "t", token_digest=token_digest("t"))


def test_a_completed_wait_with_the_same_deadline_is_no_progress() -> None:
    from flowstream.model.events import WaitCompleted

    state = state_of(WaitCreated(wait_id="w", resume_at=NOW), WaitCompleted(wait_id="w"))
    with pytest.raises(InvalidTransitionError):
        decide(state, RuntimeCommand.wait_until("w", NOW), NOW)
    with pytest.raises(NonDeterministicError):
        decide(state, RuntimeCommand.wait_until("w", NOW + timedelta(seconds=1)), NOW)


# -- step outcomes -----------------------------------------------------------------------------


def test_a_stale_outcome_is_dropped() -> None:
    state = state_of(created("a"), StepStarted(step_id="a", attempt=1), StepCompleted(step_id="a"))
    assert step_outcome_events(state, "a", 1, output=2, now=NOW) == []
    assert step_outcome_events(state, "ghost", 1, output=2, now=NOW) == []


def test_outcomes_map_to_completion_retry_failure_and_non_retryable() -> None:
    fixed = RetryPolicy.fixed(2, 500)
    running = state_of(created("a", retry=fixed), StepStarted(step_id="a", attempt=1))
    [ok] = step_outcome_events(running, "a", 1, output={"r": 1}, now=NOW)
    assert isinstance(ok, StepCompleted) and ok.output == {"r": 1}
    [retry] = step_outcome_events(running, "a", 1, error="e", now=NOW)
    assert isinstance(retry, StepRetrying)
    assert retry.retry_after == NOW + timedelta(milliseconds=500)
    [fatal] = step_outcome_events(running, "a", 1, error="e", retryable=False, now=NOW)
    assert isinstance(fatal, StepNonRetryable)
    last = state_of(
        created("a", retry=fixed),
        StepStarted(step_id="a", attempt=1),
        StepRetrying(step_id="a", attempt=1, error="e", retry_after=NOW),
        StepStarted(step_id="a", attempt=2),
    )
    [failed] = step_outcome_events(last, "a", 2, error="e2", now=NOW)
    assert isinstance(failed, StepFailed) and failed.attempt == 2


# -- engine repairs and suspension -------------------------------------------------------------


def test_engine_repair_starts_a_pending_run() -> None:
    pending = RunState.from_history([envelope("r1", 1, RunCreated(spec=SPEC))])
    assert [type(e).__name__ for e in engine_repair(pending)] == ["RunStarted"]


def test_engine_repair_settles_a_fail_run_failure_in_order() -> None:
    state = state_of(
        created("a"),
        created("b"),
        created("c"),
        StepStarted(step_id="a", attempt=1),
        StepStarted(step_id="b", attempt=1),
        StepFailed(step_id="a", attempt=1, error="boom"),
    )
    events = engine_repair(state)
    assert [type(e).__name__ for e in events] == [
        "StepCancelled",
        "StepCancelled",
        "RunRetryExhausted",
    ]
    assert [e.step_id for e in events[:2]] == ["b", "c"]  # type: ignore[union-attr]
    assert events[0].reason == BATCH_ABORT_REASON.format("a")  # type: ignore[union-attr]
    # The repair is itself a legal continuation of the history.
    for event in events:
        state.apply(envelope("r1", state.last_sequence + 1, event))
    assert state.is_terminal


def test_engine_repair_pairs_waiting_signal_waits() -> None:
    state = state_of(
        SignalReceived(signal_id="s1", name="go"),
        SignalWaitCreated(wait_id="w1", signal_name="go"),
    )
    [pair] = engine_repair(state)
    assert (pair.wait_id, pair.signal_id) == ("w1", "s1")  # type: ignore[union-attr]


def test_suspension_is_decided_by_open_work_and_due_retries() -> None:
    delayed = RetryPolicy.fixed(2, 1000)
    retrying = state_of(
        created("a", retry=delayed),
        StepStarted(step_id="a", attempt=1),
        StepRetrying(step_id="a", attempt=1, error="e", retry_after=NOW),
    )
    assert is_suspended(retrying, NOW - timedelta(microseconds=1))
    assert not is_suspended(retrying, NOW)
    assert is_suspended(state_of(WaitCreated(wait_id="w", resume_at=NOW)), NOW + timedelta(days=1))
    assert not is_suspended(state_of(), NOW)
