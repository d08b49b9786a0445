"""Reference §2: the event types, the envelope, and the per-event rules the history enforces.

Each rule is checked through ``append_if_sequence``, which validates every batch with the run's
state machine before writing it: a refused event raises and leaves the history as it was.
"""

from __future__ import annotations

from datetime import timedelta
from typing import get_args

import pytest
from pydantic import ValidationError

from flowstream.errors import InvalidTransitionError, PayloadTooLargeError
from flowstream.model.events import (
    ChildWorkflowRequested,
    ChildWorkflowResolved,
    EventEnvelope,
    FlowEvent,
    HookCreated,
    RunCancellationRequested,
    RunCompleted,
    RunContinuedAsNew,
    RunCreated,
    RunProgressRecorded,
    RunRetryExhausted,
    RunStarted,
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
    WorkflowProgress,
)
from flowstream.model.snapshot import StepStatus
from flowstream.model.spec import RetryPolicy
from flowstream.replay.context import WorkflowContext
from flowstream.replay.decide import token_digest
from flowstream.stores.base import MAX_EVENT_BYTES, EventStore
from tests.semantics.helpers import SPEC, append, begin, engine_for, types_of
from tests.support import EPOCH, FakeClock, run, spec

NONE = RetryPolicy.none()
TWO = RetryPolicy.fixed(2, 0)


def _refused(store: EventStore, *events: object, run_id: str = "r1") -> None:
    """Appending ``events`` is refused and the history is unchanged."""
    before = store.read(run_id) if store.exists(run_id) else []
    with pytest.raises(InvalidTransitionError):
        append(store, run_id, *events)  # type: ignore[arg-type]
    assert (store.read(run_id) if store.exists(run_id) else []) == before


def _running(store: EventStore, step_id: str = "s", retry: RetryPolicy = NONE) -> None:
    begin(
        store,
        StepCreated(step_id=step_id, step_name="work", retry=retry),
        StepStarted(step_id=step_id, attempt=1),
    )


# -- the envelope --------------------------------------------------------------------------------


def test_envelope_sequences_are_one_based_contiguous_with_fresh_ids_and_commit_time(
    store: EventStore, clock: FakeClock
) -> None:
    """§2 envelope: sequence is 1-based and contiguous per run, event_id is fresh, timestamp is
    the store-assigned commit time, schema_version is 1."""
    engine, _ = engine_for(
        store,
        clock,
        lambda ctx: (
            ctx.complete(ctx.step_output("s"))
            if ctx.step_completed("s")
            else ctx.schedule_step("s", "work")
        ),
        {"work": lambda inv: clock.advance(seconds=1) and 1},
    )
    run(engine.start("r1", SPEC))
    history = store.read("r1")
    assert [e.sequence for e in history] == list(range(1, len(history) + 1))
    assert len({e.event_id for e in history}) == len(history)
    assert {e.schema_version for e in history} == {1}
    assert history[0].timestamp == EPOCH
    assert history[-1].timestamp == EPOCH + timedelta(seconds=1)  # commit time, not run start


@pytest.mark.parametrize("version", [0, 2])
def test_an_unsupported_schema_version_is_rejected(version: int) -> None:
    """§2 envelope: validate_schema_version() rejects 0 or >1."""
    with pytest.raises(ValidationError, match="schema version"):
        EventEnvelope(
            run_id="r1",
            sequence=1,
            event_id="e1",
            timestamp=EPOCH,
            event=RunCreated(spec=SPEC),
            schema_version=version,
        )


def test_an_event_over_one_mib_is_refused_and_nothing_is_written(store: EventStore) -> None:
    """§2 envelope: MAX_FLOW_EVENT_BYTES = 1 MiB of encoded event JSON, else PayloadTooLarge."""
    assert MAX_EVENT_BYTES == 1024 * 1024
    begin(store)
    with pytest.raises(PayloadTooLargeError):
        append(store, "r1", RunCompleted(output="x" * MAX_EVENT_BYTES))
    assert types_of(store) == ["run_created", "run_started"]


# Reference §2 keys of the events flowstream shares with it.
SHARED_KEYS = {
    "run_created": "flow.run.created",
    "run_started": "flow.run.started",
    "run_completed": "flow.run.completed",
    "run_failed": "flow.run.failed",
    "run_cancellation_requested": "flow.run.cancellation.requested",
    "run_cancelled": "flow.run.cancelled",
    "run_timed_out": "flow.run.timed_out",
    "run_retry_exhausted": "flow.run.retry_exhausted",
    "run_continued_as_new": "flow.run.continued_as_new",
    "run_progress_recorded": "flow.run.progress.recorded",
    "child_workflow_requested": "flow.child.workflow.requested",
    "child_workflow_resolved": "flow.child.workflow.resolved",
    "signal_received": "flow.signal.received",
    "signal_wait_created": "flow.signal.wait.created",
    "signal_wait_completed": "flow.signal.wait.completed",
    "step_created": "flow.step.created",
    "step_started": "flow.step.started",
    "step_completed": "flow.step.completed",
    "step_retrying": "flow.step.retrying",
    "step_failed": "flow.step.failed",
    "step_non_retryable": "flow.step.non_retryable",
    "step_cancelled": "flow.step.cancelled",
    "wait_created": "flow.wait.created",
    "wait_completed": "flow.wait.completed",
    "hook_created": "flow.hook.created",
    "hook_received": "flow.hook.received",
    "hook_disposed": "flow.hook.disposed",
}


#: Events flowstream has that the reference does not (deliberate, see docs/semantics.md).
OWN_KEYS = {"workflow_task_failed": "flow.workflow.task.failed"}


def _event_classes() -> list[type]:
    union = get_args(FlowEvent)[0]
    return list(get_args(union))


def test_events_are_the_core_subset_with_the_reference_dot_keys() -> None:
    """§2: each variant has a snake_case type and a stable dot key (event_key()). flowstream
    keeps the 27 core events of the seeds; activities, scopes, selects, updates, maps, child
    operation links, compensation markers, datasets, blobs, aggregates and host shutdown are not
    part of it (a deliberate difference, see docs/semantics.md). flowstream adds one of its own,
    the engine's record of a workflow task that failed."""
    keys = {cls.model_fields["type"].default: cls.KEY for cls in _event_classes()}
    assert keys == SHARED_KEYS | OWN_KEYS


def test_the_wire_form_is_tagged_by_type() -> None:
    """§2: wire form is tagged by "type" in snake_case, e.g. {"type":"run_created","spec":…}."""
    data = RunCreated(spec=SPEC, input={"a": 1}).model_dump(mode="json")
    assert data["type"] == "run_created"
    assert data["input"] == {"a": 1}


# -- run lifecycle -------------------------------------------------------------------------------


def test_run_created_must_be_first_and_only_first(store: EventStore) -> None:
    """§2.1: RunCreated must be first and only first."""
    _refused(store, RunStarted())
    begin(store)
    _refused(store, RunCreated(spec=SPEC))


def test_run_started_is_legal_only_from_pending(store: EventStore) -> None:
    """§2.2: RunStarted only from Pending."""
    begin(store)
    _refused(store, RunStarted())


def test_run_completed_is_refused_while_cancelling(store: EventStore) -> None:
    """§2.3: RunCompleted is rejected while Cancelling."""
    begin(store, RunCancellationRequested(reason="stop"))
    _refused(store, RunCompleted(output=1))


def test_a_cancellation_request_is_recorded_at_most_once(store: EventStore) -> None:
    """§2.5: RunCancellationRequested at most once."""
    begin(store, RunCancellationRequested(reason="a"))
    _refused(store, RunCancellationRequested(reason="a"))


def test_retry_exhausted_must_match_a_failed_fail_run_step(store: EventStore) -> None:
    """§2.8: RunRetryExhausted must match a Failed step with FailRun policy, same attempt and
    error."""
    _running(store)
    _refused(store, RunRetryExhausted(step_id="s", attempt=1, error="boom"))  # not failed yet
    append(store, "r1", StepFailed(step_id="s", attempt=1, error="boom"))
    _refused(store, RunRetryExhausted(step_id="s", attempt=2, error="boom"))
    _refused(store, RunRetryExhausted(step_id="s", attempt=1, error="other"))
    append(store, "r1", RunRetryExhausted(step_id="s", attempt=1, error="boom"))
    assert store.state("r1").outcome == TerminalOutcome(
        type="retry_exhausted", error="boom", step_id="s"
    )


def test_retry_exhausted_is_refused_for_a_continue_workflow_step(store: EventStore) -> None:
    """§2.8 / §5.4: run_retry_exhausted with a continue_workflow policy is rejected."""
    _running(store, retry=NONE.continue_workflow_on_failure())
    append(store, "r1", StepFailed(step_id="s", attempt=1, error="boom"))
    _refused(store, RunRetryExhausted(step_id="s", attempt=1, error="boom"))


def test_a_continuation_needs_a_running_run_with_nothing_open(store: EventStore) -> None:
    """§2.10 / §5.4: run_continued_as_new not from Running, or with an open child, an open
    signal wait or an unconsumed signal, is rejected."""
    link = RunContinuedAsNew(successor_run_id="next")
    begin(store, RunCancellationRequested(), run_id="cancelling")
    _refused(store, link, run_id="cancelling")
    begin(
        store,
        ChildWorkflowRequested(child_id="c", child_run_id="c1", spec=spec("child")),
        run_id="child",
    )
    _refused(store, link, run_id="child")
    begin(store, SignalWaitCreated(wait_id="w", signal_name="go"), run_id="waiting")
    _refused(store, link, run_id="waiting")
    begin(store, SignalReceived(signal_id="s", name="go"), run_id="unconsumed")
    _refused(store, link, run_id="unconsumed")
    begin(store, link)
    assert store.state("r1").outcome == TerminalOutcome(
        type="continued_as_new", successor_run_id="next"
    )


def test_progress_needs_completed_within_a_positive_total(store: EventStore) -> None:
    """§2.11 / §3.1 RecordProgress: completed ≤ total, total > 0."""
    with pytest.raises(ValidationError):
        WorkflowProgress(progress_id="p", completed=0, total=0)
    begin(store)
    _refused(
        store, RunProgressRecorded(progress=WorkflowProgress(progress_id="p", completed=3, total=2))
    )
    append(
        store,
        "r1",
        RunProgressRecorded(progress=WorkflowProgress(progress_id="p", completed=2, total=2)),
    )


def test_a_child_never_resolves_to_continued_as_new(store: EventStore) -> None:
    """§2.14: ChildWorkflowResolved outcome may not be continued_as_new."""
    begin(
        store,
        ChildWorkflowRequested(child_id="c", child_run_id="c1", spec=spec("child")),
    )
    _refused(
        store,
        ChildWorkflowResolved(
            child_id="c", outcome=TerminalOutcome(type="continued_as_new", successor_run_id="x")
        ),
    )
    append(
        store, "r1", ChildWorkflowResolved(child_id="c", outcome=TerminalOutcome(type="completed"))
    )
    _refused(store, ChildWorkflowResolved(child_id="c", outcome=TerminalOutcome(type="completed")))


def test_signal_wait_completion_pairs_in_fifo_order(store: EventStore) -> None:
    """§2.19: SignalWaitCompleted is FIFO-validated: the oldest waiting wait takes the oldest
    unconsumed signal of the same name."""
    begin(
        store,
        SignalWaitCreated(wait_id="w1", signal_name="go"),
        SignalWaitCreated(wait_id="w2", signal_name="go"),
        SignalReceived(signal_id="a", name="go"),
        SignalReceived(signal_id="b", name="go"),
    )
    _refused(store, SignalWaitCompleted(wait_id="w2", signal_id="a"))  # skips an older wait
    _refused(store, SignalWaitCompleted(wait_id="w1", signal_id="b"))  # skips an older signal
    append(store, "r1", SignalWaitCompleted(wait_id="w1", signal_id="a"))
    append(store, "r1", SignalWaitCompleted(wait_id="w2", signal_id="b"))


def test_a_signal_wait_pairs_only_a_signal_of_its_name(store: EventStore) -> None:
    """§2.19 / §5.4: signal-wait pairing with the wrong name, or a reused signal, is rejected."""
    begin(
        store,
        SignalWaitCreated(wait_id="w1", signal_name="go"),
        SignalWaitCreated(wait_id="w2", signal_name="go"),
        SignalReceived(signal_id="a", name="stop"),
        SignalReceived(signal_id="b", name="go"),
    )
    _refused(store, SignalWaitCompleted(wait_id="w1", signal_id="a"))
    append(store, "r1", SignalWaitCompleted(wait_id="w1", signal_id="b"))
    _refused(store, SignalWaitCompleted(wait_id="w2", signal_id="b"))


# -- steps ---------------------------------------------------------------------------------------


def test_a_step_attempt_must_be_the_previous_plus_one(store: EventStore) -> None:
    """§2.27: StepStarted attempt is 1-based and must be previous+1."""
    begin(store, StepCreated(step_id="s", step_name="work", retry=TWO))
    _refused(store, StepStarted(step_id="s", attempt=2))
    append(store, "r1", StepStarted(step_id="s", attempt=1))
    _refused(store, StepStarted(step_id="s", attempt=2))  # attempt 1 is still running
    append(store, "r1", StepRetrying(step_id="s", attempt=1, error="e"))
    append(store, "r1", StepStarted(step_id="s", attempt=2))


def test_step_retrying_carries_retry_after_exactly_when_the_policy_delays(
    store: EventStore,
) -> None:
    """§2.29: delayed policy ⇒ retry_after required; immediate ⇒ forbidden; attempt <
    max_attempts."""
    later = EPOCH + timedelta(seconds=5)
    begin(
        store,
        StepCreated(step_id="d", step_name="work", retry=RetryPolicy.fixed(2, 1000)),
        StepStarted(step_id="d", attempt=1),
        StepCreated(step_id="i", step_name="work", retry=TWO),
        StepStarted(step_id="i", attempt=1),
    )
    _refused(store, StepRetrying(step_id="d", attempt=1, error="e"))
    _refused(store, StepRetrying(step_id="i", attempt=1, error="e", retry_after=later))
    append(store, "r1", StepRetrying(step_id="d", attempt=1, error="e", retry_after=later))
    append(store, "r1", StepRetrying(step_id="i", attempt=1, error="e"))
    append(store, "r1", StepStarted(step_id="i", attempt=2))
    _refused(store, StepRetrying(step_id="i", attempt=2, error="e"))  # the budget is spent


def test_step_failed_only_once_the_budget_is_exhausted(store: EventStore) -> None:
    """§2.30: StepFailed only when attempt ≥ max_attempts."""
    _running(store, retry=TWO)
    _refused(store, StepFailed(step_id="s", attempt=1, error="e"))
    append(store, "r1", StepRetrying(step_id="s", attempt=1, error="e"))
    append(store, "r1", StepStarted(step_id="s", attempt=2))
    append(store, "r1", StepFailed(step_id="s", attempt=2, error="e"))
    assert store.state("r1").steps["s"].status is StepStatus.FAILED


def test_step_non_retryable_bypasses_the_budget(store: EventStore) -> None:
    """§2.31: StepNonRetryable bypasses the retry budget; the step status is Failed."""
    _running(store, retry=RetryPolicy.fixed(5, 0))
    append(store, "r1", StepNonRetryable(step_id="s", attempt=1, error="no"))
    step = store.state("r1").steps["s"]
    assert (step.status, step.attempt, step.error) == (StepStatus.FAILED, 1, "no")


def test_step_cancelled_only_from_pending_or_running(store: EventStore) -> None:
    """§2.32: StepCancelled only from Pending/Running."""
    begin(
        store,
        StepCreated(step_id="p", step_name="work"),
        StepCreated(step_id="r", step_name="work"),
        StepStarted(step_id="r", attempt=1),
        StepCreated(step_id="c", step_name="work"),
        StepStarted(step_id="c", attempt=1),
        StepCompleted(step_id="c", output=1),
    )
    append(store, "r1", StepCancelled(step_id="p", attempt=0, reason="unknown outcome"))
    append(store, "r1", StepCancelled(step_id="r", attempt=1, reason="unknown outcome"))
    _refused(store, StepCancelled(step_id="c", attempt=1, reason="late"))


# -- hooks ---------------------------------------------------------------------------------------


def test_hook_created_stores_the_token_digest_never_the_token(
    store: EventStore, clock: FakeClock
) -> None:
    """§2.50: HookCreated{hook_id, token, metadata}. flowstream stores the SHA-256 digest of the
    token instead (deliberate: the history never holds a bearer secret, §10)."""

    def workflow(ctx: WorkflowContext) -> object:
        if ctx.hook_received("h"):
            return ctx.complete(ctx.hook_payload("h"))
        return ctx.create_hook("h", "secret-token-123", {"kind": "approval"})

    engine, _ = engine_for(store, clock, workflow)
    run(engine.start("r1", SPEC))
    [created] = [e.event for e in store.read("r1") if isinstance(e.event, HookCreated)]
    assert created.token_digest == token_digest("secret-token-123")
    assert "secret-token-123" not in "".join(e.model_dump_json() for e in store.read("r1"))
    assert run(engine.resume_hook_by_token("secret-token-123", "ok")).output == "ok"
