"""Reference §9: the behaviour of the public engine API (construction, the run lifecycle,
inspection, the store SPI and the error tree)."""

from __future__ import annotations

import inspect
import logging

import pytest

import flowstream.errors as errors
from flowstream.engine import FlowEngine, RuntimeBuilds
from flowstream.errors import FlowError, RunNotFoundError
from flowstream.model.events import EventEnvelope
from flowstream.model.snapshot import RunStatus
from flowstream.stores.base import EventStore
from tests.semantics.helpers import LATER, SPEC, engine_for, types_of
from tests.support import FakeClock, make_runtime, run, spec


def test_max_replay_iterations_is_at_least_one(store: EventStore) -> None:
    """§9 construction: with_max_replay_iterations (default 1024, min 1). flowstream's default
    is 1,000,000 (see docs/semantics.md)."""
    runtime = make_runtime(lambda ctx: ctx.complete())
    with pytest.raises(ValueError, match="at least 1"):
        FlowEngine(store, runtime, max_replay_iterations=0)
    assert FlowEngine(store, runtime)._max_iterations == 1_000_000


def test_start_with_an_existing_id_is_idempotent_and_drives(
    store: EventStore, clock: FakeClock
) -> None:
    """§9 run lifecycle: start_with_id(run_id, spec, input) is idempotent and drives."""
    engine, runtime = engine_for(store, clock, lambda ctx: ctx.complete(ctx.input))
    run(engine.start("r1", SPEC, 1, drive=False))
    assert run(engine.start("r1", SPEC, 1)).output == 1
    before = store.read("r1")
    assert run(engine.start("r1", SPEC, 1)).output == 1
    assert store.read("r1") == before and len(runtime.workflow_calls) == 1


def test_an_exact_restart_of_a_terminal_run_needs_no_admission(
    store: EventStore, clock: FakeClock
) -> None:
    """§8.4 / §9: exact start_with_id retries of fully terminal executions are admission-free."""
    pinned = spec("semantics", runtime_build_id="b1")
    serving, _ = engine_for(store, clock, lambda ctx: ctx.complete(), builds=RuntimeBuilds("b1"))
    run(serving.start("r1", pinned))
    other, _ = engine_for(store, clock, lambda ctx: ctx.complete())
    assert run(other.start("r1", pinned)).status is RunStatus.COMPLETED


def test_a_run_id_is_chosen_by_the_caller() -> None:
    """§9: start(spec, input) draws a UUIDv4 run id in the reference. flowstream has only the
    start_with_id form (deliberate: a caller-owned id is what makes a retried start
    idempotent, and in Kafka mode it is the message key)."""
    parameters = list(inspect.signature(FlowEngine.start).parameters)
    assert parameters[:3] == ["self", "run_id", "spec"]


def test_inspection_reads_without_appending(store: EventStore, clock: FakeClock) -> None:
    """§9 inspection: snapshot(run_id), history(run_id), list_run_ids() (sorted),
    run_summary(), list_open_suspensions(now) read only."""
    engine, _ = engine_for(store, clock, lambda ctx: ctx.wait_until("w", LATER))
    for run_id in ("r2", "r1"):
        run(engine.start(run_id, SPEC))
    before = {r: store.read(r) for r in ("r1", "r2")}
    assert engine.list_runs() == ["r1", "r2"]
    assert engine.snapshot("r1").status is RunStatus.SUSPENDED
    assert engine.history("r1") == before["r1"]
    assert engine.summary().by_status == {RunStatus.SUSPENDED: 2}
    assert len(engine.list_open_suspensions(LATER)) == 2
    assert {r: store.read(r) for r in ("r1", "r2")} == before


def test_an_unknown_run_is_run_not_found(store: EventStore, clock: FakeClock) -> None:
    """§9 FlowError::RunNotFound for every entry point given an unknown run."""
    engine, _ = engine_for(store, clock, lambda ctx: ctx.complete())
    for call in (
        lambda: engine.snapshot("nope"),
        lambda: engine.history("nope"),
        lambda: run(engine.drive("nope")),
        lambda: run(engine.send_signal("nope", "s", "go")),
        lambda: run(engine.request_cancellation("nope")),
    ):
        with pytest.raises(RunNotFoundError) as caught:
            call()
        assert caught.value.run_id == "nope"


def test_a_store_listener_sees_each_commit_and_cannot_undo_it(
    store: EventStore, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """§9 / §10 observers: an observer runs after commit and cannot roll it back; its failure is
    isolated (logged)."""
    seen: list[list[str]] = []

    def listener(batch: list[EventEnvelope]) -> None:
        seen.append([e.event.type for e in batch])
        raise RuntimeError("observer bug")

    store.add_listener(listener)
    engine, _ = engine_for(store, clock, lambda ctx: ctx.complete())
    with caplog.at_level(logging.ERROR, logger="flowstream.store"):
        assert run(engine.start("r1", SPEC)).status is RunStatus.COMPLETED
    assert [t for batch in seen for t in batch] == types_of(store)
    assert "a store listener failed" in caplog.text


def test_every_error_is_a_flow_error() -> None:
    """§9 FlowError variants: one root; structured attributes (run_id, expected_sequence…)."""
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), FlowError), name
    conflict = errors.EventConflictError("r1", 3, 5)
    assert (conflict.run_id, conflict.expected_sequence, conflict.actual_sequence) == ("r1", 3, 5)
    unavailable = errors.RuntimeBuildUnavailableError("r1", "b2", "b1")
    assert (unavailable.required_build_id, unavailable.current_build_id) == ("b2", "b1")
    assert errors.NonDeterministicError("r1", "x differs").reason == "x differs"


def test_only_non_retryable_and_unknown_outcome_skip_the_retry_budget() -> None:
    """§9: is_retryable() is false only for NonRetryable and UnknownOutcome (both StepErrors
    here); every other error a handler raises is retried."""
    assert issubclass(errors.NonRetryableError, errors.StepError)
    assert issubclass(errors.UnknownOutcomeError, errors.StepError)
    assert [
        name
        for name in errors.__all__
        if issubclass(getattr(errors, name), errors.StepError) and name != "StepError"
    ] == ["NonRetryableError", "UnknownOutcomeError"]
