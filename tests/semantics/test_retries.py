"""Reference §6: retry policies, the single-step lifecycle, concurrent batches with their
``step_cancelled`` settlement, timeouts, and idempotency identities."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from pydantic import ValidationError

from flowstream.errors import (
    InvalidIdentifierError,
    InvalidTransitionError,
    NonRetryableError,
    UnknownOutcomeError,
)
from flowstream.model.commands import RuntimeCommand
from flowstream.model.events import StepCreated, StepRetrying, StepStarted
from flowstream.model.snapshot import RunStatus, StepStatus
from flowstream.model.spec import Backoff, ExhaustedAction, RetryPolicy
from flowstream.replay.context import StepInvocation, WorkflowContext
from flowstream.replay.decide import BATCH_ABORT_REASON, decide
from flowstream.stores.base import EventStore
from tests.engine.test_steps import failing
from tests.semantics.helpers import SPEC, begin, engine_for, types_of
from tests.support import EPOCH, Crash, FakeClock, events_of, run
from tests.support.stores import StoreFactory

NONE = RetryPolicy.none()


def one_step(retry: RetryPolicy | None = None):  # type: ignore[no-untyped-def]
    """Runs step ``s`` (handler ``work``); completes with its output, or its failure."""

    def workflow(ctx: WorkflowContext) -> RuntimeCommand:
        if ctx.step_completed("s"):
            return ctx.complete(ctx.step_output("s"))
        if ctx.step_failed("s") is not None:
            return ctx.complete({"failed": ctx.step_failed("s")})
        return ctx.schedule_step("s", "work", None, retry)

    return workflow


# -- §6.1 the policy -----------------------------------------------------------------------------


def test_the_default_policy_is_three_immediate_fail_run_attempts() -> None:
    """§6.1: RetryPolicy::default() = 3 attempts, 0 delay, fixed, FailRun; none() = 1 attempt;
    fixed(n, d) clamps n ≥ 1."""
    default = RetryPolicy()
    assert (default.max_attempts, default.delay_ms, default.backoff, default.on_exhausted) == (
        3,
        0,
        Backoff.FIXED,
        ExhaustedAction.FAIL_RUN,
    )
    assert RetryPolicy.none().max_attempts == 1
    assert RetryPolicy.fixed(0, 10).max_attempts == 1
    assert RuntimeCommand.schedule_step("s", "n").step.retry == default


@pytest.mark.parametrize(
    "fields",
    [
        {"backoff": "exponential", "delay_ms": 0, "max_delay_ms": 10},
        {"backoff": "exponential", "delay_ms": 10, "max_delay_ms": 5},
        {"backoff": "fixed", "delay_ms": 10, "max_delay_ms": 20},
    ],
    ids=["initial-below-1ms", "max-below-initial", "max-delay-on-fixed"],
)
def test_invalid_policies_are_rejected(fields: dict[str, object]) -> None:
    """§6.1: exponential needs initial ≥ 1 ms and max ≥ initial; max_delay_ms must be 0 for
    fixed."""
    with pytest.raises(ValidationError):
        RetryPolicy.model_validate({"max_attempts": 3, **fields})


def test_the_reference_json_forms_decode() -> None:
    """§6.1 JSON examples: {"max_attempts":1,"delay_ms":0} and with
    "on_exhausted":"continue_workflow" (omitted fields take their defaults). flowstream writes
    every field (the Avro record has them all)."""
    assert RetryPolicy.model_validate({"max_attempts": 1, "delay_ms": 0}) == RetryPolicy.none()
    continuing = RetryPolicy.model_validate(
        {"max_attempts": 1, "delay_ms": 0, "on_exhausted": "continue_workflow"}
    )
    assert continuing == RetryPolicy.none().continue_workflow_on_failure()


def test_exponential_delay_is_deterministic_full_jitter_under_the_cap() -> None:
    """§6.1: exponential → cap = min(delay_ms·2^(k-1), max_delay_ms), delay = 1 + hash mod cap,
    the hash over (run, step, attempt): the same inputs give the same delay."""
    policy = RetryPolicy.exponential(10, 100, 1000)
    for attempt in range(1, 8):
        cap = min(100 * 2 ** (attempt - 1), 1000)
        delay = policy.delay_for("r1", "s", attempt)
        assert 1 <= delay <= cap
        assert delay == policy.delay_for("r1", "s", attempt)
    spread = {policy.delay_for("r1", f"s{i}", 5) for i in range(20)}
    assert len(spread) > 1  # jitter, not a constant


def test_retry_after_is_anchored_at_the_later_of_the_clock_and_the_drive_cutoff(
    store: EventStore, clock: FakeClock
) -> None:
    """§6.1: retry_after = max(wall_clock_now, drive_now) + delay."""
    policy = RetryPolicy.fixed(3, 1000)
    engine, _ = engine_for(store, clock, one_step(policy), {"work": failing(2)})
    clock.advance(seconds=5)
    snapshot = run(engine.start("r1", SPEC))
    assert snapshot.steps["s"].retry_after == EPOCH + timedelta(seconds=6)
    cutoff = EPOCH + timedelta(minutes=10)  # a scheduler running late
    snapshot = run(engine.resume_due(cutoff)) and engine.snapshot("r1")
    assert snapshot.steps["s"].retry_after == cutoff + timedelta(seconds=1)


def test_the_engine_schedules_the_policys_exponential_delay(
    store: EventStore, clock: FakeClock
) -> None:
    """§6.1: the deadline of a failed attempt k is the policy's delay for (run, step, k) after
    the failure."""
    policy = RetryPolicy.exponential(3, 1000, 10_000)
    engine, _ = engine_for(store, clock, one_step(policy), {"work": failing(1)})
    snapshot = run(engine.start("r1", SPEC))
    delay = timedelta(milliseconds=policy.delay_for("r1", "s", 1))
    assert snapshot.steps["s"].retry_after == EPOCH + delay


def test_a_zero_delay_retries_at_once_in_the_same_drive(
    store: EventStore, clock: FakeClock
) -> None:
    """§6.1: delay == 0 ⇒ retry_after = None ⇒ immediate retry in the same drive."""
    engine, _ = engine_for(store, clock, one_step(), {"work": failing(2)})
    snapshot = run(engine.start("r1", SPEC))
    assert snapshot.output == {"attempt": 3}
    assert [e.retry_after for e in events_of(store.read("r1"), "step_retrying")] == [None, None]


def test_an_unrepresentable_retry_deadline_is_refused_before_the_step_exists(
    store: EventStore,
) -> None:
    """§6.1: a retry delay that cannot be a UTC deadline is refused before StepCreated:
    InvalidTransition "retry delay {ms}ms cannot be represented as a UTC deadline"."""
    begin(store)
    huge = RetryPolicy.fixed(2, 10**15)
    with pytest.raises(InvalidTransitionError, match="cannot be represented as a UTC deadline"):
        decide(store.state("r1"), RuntimeCommand.schedule_step("s", "work", None, huge), EPOCH)


# -- §6.2 one step -------------------------------------------------------------------------------


def test_a_step_is_created_started_and_completed(store: EventStore, clock: FakeClock) -> None:
    """§6.2: Create (StepCreated) → StepStarted{attempt} → run → StepCompleted."""
    engine, _ = engine_for(store, clock, one_step(), {"work": lambda inv: "out"})
    assert run(engine.start("r1", SPEC)).output == "out"
    assert types_of(store) == [
        "run_created",
        "run_started",
        "step_created",
        "step_started",
        "step_completed",
        "run_completed",
    ]


@pytest.mark.parametrize("exc", [NonRetryableError, UnknownOutcomeError])
def test_a_non_retryable_failure_skips_the_budget_and_fails_the_run(
    store: EventStore, clock: FakeClock, exc: type[Exception]
) -> None:
    """§6.2 / §3.3: a non-retryable error (NonRetryable, UnknownOutcome) → StepNonRetryable
    [+ RunFailed if FailRun]; every other error is retryable."""
    engine, runtime = engine_for(store, clock, one_step(), {"work": failing(1, exc)})
    snapshot = run(engine.start("r1", SPEC))
    assert len(runtime.step_calls) == 1
    assert types_of(store)[-2:] == ["step_non_retryable", "run_failed"]
    assert snapshot.status is RunStatus.FAILED
    assert snapshot.error == f"step s failed: {exc.__name__}: failure 1"


def test_a_delayed_retry_records_retry_after_and_suspends(
    store: EventStore, clock: FakeClock
) -> None:
    """§6.2: a retryable failure below max_attempts records StepRetrying{retry_after} and
    suspends if delayed."""
    engine, runtime = engine_for(
        store, clock, one_step(RetryPolicy.fixed(3, 2000)), {"work": failing(1)}
    )
    snapshot = run(engine.start("r1", SPEC))
    [retrying] = events_of(store.read("r1"), "step_retrying")
    assert (retrying.attempt, retrying.error) == (1, "ConnectionError: failure 1")
    assert retrying.retry_after == EPOCH + timedelta(seconds=2)
    assert snapshot.status is RunStatus.SUSPENDED and len(runtime.step_calls) == 1
    clock.advance(seconds=2)
    run(engine.resume_due())
    assert engine.snapshot("r1").output == {"attempt": 2}


def test_an_exhausted_fail_run_step_ends_the_run_retry_exhausted(
    store: EventStore, clock: FakeClock
) -> None:
    """§6.2: (exhausted) StepFailed + RunRetryExhausted if FailRun. Errors are stored as text
    (flowstream: "<ExceptionType>: <message>")."""
    engine, runtime = engine_for(
        store, clock, one_step(RetryPolicy.fixed(2, 0)), {"work": failing(9)}
    )
    snapshot = run(engine.start("r1", SPEC))
    assert len(runtime.step_calls) == 2
    assert types_of(store)[-2:] == ["step_failed", "run_retry_exhausted"]
    assert snapshot.outcome is not None
    assert (snapshot.outcome.type, snapshot.outcome.step_id, snapshot.error) == (
        "retry_exhausted",
        "s",
        "ConnectionError: failure 2",
    )


def test_continue_workflow_hands_the_failure_back_to_workflow_code(
    store: EventStore, clock: FakeClock
) -> None:
    """§6.2: with continue_workflow the run is replayed so workflow code reads step_failed(id)."""
    policy = RetryPolicy.none().continue_workflow_on_failure()
    engine, _ = engine_for(store, clock, one_step(policy), {"work": failing(1)})
    snapshot = run(engine.start("r1", SPEC))
    assert snapshot.output == {"failed": "ConnectionError: failure 1"}
    assert "run_retry_exhausted" not in types_of(store)


def test_a_running_step_is_redelivered_as_the_same_attempt(
    store: EventStore, clock: FakeClock
) -> None:
    """§6.2 crash redelivery: a step already running when the engine resumes is re-invoked with
    the same attempt (no new StepStarted), so an idempotent handler can reconcile."""
    crash = {"on": True}

    def work(invocation: StepInvocation) -> object:
        if crash["on"]:
            raise Crash  # the process dies inside the handler
        return invocation.attempt

    engine, runtime = engine_for(store, clock, one_step(), {"work": work})
    with pytest.raises(Crash):
        run(engine.start("r1", SPEC))
    crash["on"] = False
    engine, runtime2 = engine_for(store, clock, one_step(), {"work": work})
    assert run(engine.drive("r1")).output == 1
    assert types_of(store).count("step_started") == 1
    first, again = runtime.step_calls[0], runtime2.step_calls[0]
    assert (again.attempt, again.idempotency_key) == (first.attempt, first.idempotency_key)


def test_a_committed_step_is_never_invoked_again(stores: StoreFactory, clock: FakeClock) -> None:
    """Seeds "Physical step delivery": Flow prevents a committed successful step from being
    invoked again during replay, also after a crash right after StepCompleted."""
    store = stores.open(clock=clock)
    crash = {"on": True}

    def workflow(ctx: WorkflowContext) -> RuntimeCommand:
        if ctx.step_completed("s"):
            if crash["on"]:
                raise Crash  # the process dies before the next decision is appended
            return ctx.complete(ctx.step_output("s"))
        return ctx.schedule_step("s", "work")

    engine, runtime = engine_for(store, clock, workflow, {"work": lambda inv: "once"})
    with pytest.raises(Crash):
        run(engine.start("r1", SPEC))
    crash["on"] = False
    if stores.durable:
        store = stores.reopen(store, clock=clock)
    engine, again = engine_for(store, clock, workflow, {"work": lambda inv: "twice"})
    assert run(engine.drive("r1")).output == "once"
    assert (len(runtime.step_calls), len(again.step_calls)) == (1, 0)


def test_a_pending_step_with_a_future_retry_is_skipped(store: EventStore) -> None:
    """§6.2: a pending step whose retry_after > now is skipped (the run suspends)."""
    later = EPOCH + timedelta(minutes=1)
    begin(
        store,
        StepCreated(step_id="s", step_name="work", retry=RetryPolicy.fixed(3, 60_000)),
        StepStarted(step_id="s", attempt=1),
        StepRetrying(step_id="s", attempt=1, error="e", retry_after=later),
    )
    command = RuntimeCommand.schedule_step("s", "work", None, RetryPolicy.fixed(3, 60_000))
    early = decide(store.state("r1"), command, later - timedelta(seconds=1))
    assert (early.events, early.run_steps, early.suspend) == ([], [], True)
    due = decide(store.state("r1"), command, later)
    assert due.run_steps == ["s"] and due.events == [StepStarted(step_id="s", attempt=2)]


# -- §6.3 concurrent batches ---------------------------------------------------------------------


def _batch(ids: list[str], retry: RetryPolicy = NONE):  # type: ignore[no-untyped-def]
    def workflow(ctx: WorkflowContext) -> RuntimeCommand:
        if all(ctx.step_completed(i) for i in ids):
            return ctx.complete([ctx.step_output(i) for i in ids])
        return ctx.schedule_steps([ctx.step(i, i, None, retry) for i in ids])

    return workflow


def _policies(retries: dict[str, RetryPolicy]):  # type: ignore[no-untyped-def]
    """A batch of one step per entry (handler named as the step) with its policy."""

    def workflow(ctx: WorkflowContext) -> RuntimeCommand:
        if all(ctx.step_completed(i) for i in retries):
            return ctx.complete()
        return ctx.schedule_steps([ctx.step(i, i, None, retry) for i, retry in retries.items()])

    return workflow


def test_a_batch_makes_every_identity_and_start_durable_before_any_handler(
    store: EventStore, clock: FakeClock
) -> None:
    """§6.3.1-2: StepCreated for every missing sibling first, then StepStarted for each, so every
    start is durable before any completion."""
    seen: list[list[str]] = []

    def handler(invocation: StepInvocation) -> object:
        seen.append(types_of(store))
        return invocation.step_id

    engine, _ = engine_for(store, clock, _batch(["a", "b", "c"]), {i: handler for i in "abc"})
    assert run(engine.start("r1", SPEC)).output == ["a", "b", "c"]
    prefix = ["run_created", "run_started", *["step_created"] * 3, *["step_started"] * 3]
    assert seen[0] == prefix


def test_a_fast_sibling_completes_durably_while_another_still_runs(
    store: EventStore, clock: FakeClock
) -> None:
    """§6.3.3: run all active siblings concurrently; commit each outcome as it settles (a fast
    sibling completes durably while another hangs)."""

    async def fast(invocation: StepInvocation) -> object:
        return "fast"

    async def slow(invocation: StepInvocation) -> object:
        for _ in range(200):
            if store.state("r1").steps["fast"].status is StepStatus.COMPLETED:
                return "slow"
            await asyncio.sleep(0.005)
        raise AssertionError("the fast sibling's outcome was not committed while slow ran")

    engine, _ = engine_for(store, clock, _batch(["fast", "slow"]), {"fast": fast, "slow": slow})
    assert run(engine.start("r1", SPEC)).output == ["fast", "slow"]


def test_a_crashed_batch_reruns_only_its_unsettled_siblings_with_their_attempts(
    store: EventStore, clock: FakeClock
) -> None:
    """§6.3.2: for each sibling: skip terminal; Running → reuse the attempt (no new
    StepStarted)."""
    crash = {"on": True}

    async def fast(invocation: StepInvocation) -> object:
        return "fast"

    async def slow(invocation: StepInvocation) -> object:
        while crash["on"]:  # the process dies once fast's outcome is committed
            if store.state("r1").steps["fast"].status is StepStatus.COMPLETED:
                raise Crash
            await asyncio.sleep(0.005)
        return "slow"

    handlers = {"fast": fast, "slow": slow}
    engine, _ = engine_for(store, clock, _batch(["fast", "slow"]), handlers)
    begin(store)  # started, so the crash below happens inside the batch
    with pytest.raises(Crash):
        run(engine.drive("r1"))
    crash["on"] = False
    engine, runtime = engine_for(store, clock, _batch(["fast", "slow"]), handlers)
    assert run(engine.drive("r1")).output == ["fast", "slow"]
    assert [(c.step_id, c.attempt) for c in runtime.step_calls] == [("slow", 1)]
    assert types_of(store).count("step_started") == 2


def test_a_due_sibling_is_not_blocked_by_a_future_one(store: EventStore, clock: FakeClock) -> None:
    """§6.3.4: delayed retries suspend individually; a due sibling is not blocked by a future
    sibling; immediate retries re-run in the next round."""
    workflow = _policies(
        {"quick": RetryPolicy.fixed(3, 1000), "later": RetryPolicy.fixed(3, 60_000)}
    )
    engine, _ = engine_for(store, clock, workflow, {"quick": failing(1), "later": failing(1)})
    run(engine.start("r1", SPEC))
    clock.advance(seconds=1)
    run(engine.resume_due())
    snapshot = engine.snapshot("r1")
    assert snapshot.steps["quick"].status is StepStatus.COMPLETED
    assert snapshot.steps["later"].status is StepStatus.PENDING
    assert snapshot.status is RunStatus.SUSPENDED


def test_an_immediate_retry_is_not_held_by_a_delayed_sibling(
    store: EventStore, clock: FakeClock
) -> None:
    """§6.3.4: immediate retries are re-run in the next round (new StepStarted) while a sibling
    waits for its delayed retry (found by this pass: the run used to suspend until the delayed
    sibling was due)."""

    workflow = _policies({"now": RetryPolicy.fixed(3, 0), "later": RetryPolicy.fixed(3, 60_000)})
    engine, _ = engine_for(store, clock, workflow, {"now": failing(1), "later": failing(1)})
    snapshot = run(engine.start("r1", SPEC))
    assert snapshot.steps["now"].status is StepStatus.COMPLETED
    assert snapshot.steps["now"].attempt == 2
    assert snapshot.steps["later"].status is StepStatus.PENDING
    assert snapshot.status is RunStatus.SUSPENDED


def test_a_sibling_exhausting_fail_run_settles_every_peer_before_the_terminal_event(
    store: EventStore, clock: FakeClock
) -> None:
    """§6.3.5: a terminal sibling failure appends StepCancelled{reason: "concurrent batch aborted
    after sibling failure {id}; step outcome is unknown"} for every still Pending/Running step
    (including one parked in a delayed retry), then RunRetryExhausted."""

    workflow = _policies({"bad": RetryPolicy.fixed(2, 0), "parked": RetryPolicy.fixed(3, 60_000)})
    engine, _ = engine_for(store, clock, workflow, {"bad": failing(9), "parked": failing(9)})
    snapshot = run(engine.start("r1", SPEC))
    [cancelled] = events_of(store.read("r1"), "step_cancelled")
    assert cancelled.step_id == "parked"
    assert cancelled.reason == BATCH_ABORT_REASON.format("bad")
    assert types_of(store)[-2:] == ["step_cancelled", "run_retry_exhausted"]
    assert snapshot.outcome is not None and snapshot.outcome.type == "retry_exhausted"


def test_a_non_retryable_sibling_fails_the_run_after_settlement(
    store: EventStore, clock: FakeClock
) -> None:
    """§6.3.5: a FailRun non-retryable sibling → StepCancelled markers, then RunFailed{error}."""

    async def hang(invocation: StepInvocation) -> object:
        await asyncio.sleep(30)
        return None

    engine, _ = engine_for(
        store, clock, _batch(["bad", "hang"]), {"bad": failing(1, NonRetryableError), "hang": hang}
    )
    snapshot = run(engine.start("r1", SPEC))
    assert types_of(store)[-2:] == ["step_cancelled", "run_failed"]
    assert snapshot.status is RunStatus.FAILED
    assert snapshot.steps["hang"].status is StepStatus.CANCELLED


# -- §6.6 idempotency identities -----------------------------------------------------------------


def test_the_idempotency_key_is_stable_across_attempts_of_a_step(
    store: EventStore, clock: FakeClock
) -> None:
    """§6.6: the reference's step key includes the attempt ("flow.step.v1/…/{attempt}");
    flowstream's is flow:{run_id}:{step_id}, the same for every attempt (deliberate: the seeds'
    business key "combines run ID, step ID and target", and a retry of an unknown outcome must
    find the first attempt's effect)."""
    engine, runtime = engine_for(store, clock, one_step(), {"work": failing(2)})
    run(engine.start("r1", SPEC))
    assert [(c.attempt, c.idempotency_key) for c in runtime.step_calls] == [
        (1, "flow:r1:s"),
        (2, "flow:r1:s"),
        (3, "flow:r1:s"),
    ]


@pytest.mark.parametrize("run_id", ["", "has space", "slash/y", "dot.ted", "x" * 201])
def test_run_ids_follow_the_grammar(store: EventStore, clock: FakeClock, run_id: str) -> None:
    """§6.6: run id grammar is non-empty [A-Za-z0-9_-]+ (InvalidRunId); flowstream also caps it
    at 200 characters (it becomes a Kafka key and a path)."""
    engine, _ = engine_for(store, clock, lambda ctx: ctx.complete())
    with pytest.raises(InvalidIdentifierError):
        run(engine.start(run_id, SPEC))
    assert store.list_runs() == []
