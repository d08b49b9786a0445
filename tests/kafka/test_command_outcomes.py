"""Every command answers (issue 17's command outcomes, and issue 16's rejected start input), on the
real broker: a ``flowstream worker`` serving the example order workflow applies what a
``FlowClient`` sends, writes each command's outcome to its events partition, and the client raises
the error the embedded engine raises for the same request."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from flowstream.client import FlowClient
from flowstream.errors import (
    CommandParkedError,
    InvalidInputError,
    InvalidTransitionError,
    RunConflictError,
    RunNotFoundError,
    RunNotStartedError,
)
from flowstream.examples.order import SPEC as ORDER
from flowstream.model.messages import OutcomeStatus
from flowstream.replay.decide import token_digest
from flowstream.settings import Settings
from tests.processor.harness import Cluster, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def cluster(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One processor serving the example order workflow; its client waits for outcomes."""
    prefix = f"t-outcomes-{uuid.uuid4().hex[:8]}"
    group = Cluster(kafka_bootstrap, prefix, tmp_path_factory.mktemp("outcomes"))
    group.client.close()
    group.client = FlowClient(
        Settings(bootstrap=kafka_bootstrap, topic_prefix=prefix, group=f"{prefix}-client"),
        timeout=60,
    )
    group.start("w1", app="flowstream.examples.order:runtime")
    try:
        yield group
    finally:
        group.close()


def order(run_id: str, *, token: str | None = None, **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"order_id": run_id, "sku": "sku-1", "quantity": 1, "amount_cents": 10}
    if token is not None:
        data["approval_token_digest"] = token_digest(token)
    return {**data, **changes}


def _hooked(cluster: Cluster, run_id: str, token: str) -> None:
    """Start an order run and wait until its approval hook is active."""
    cluster.client.start(run_id, ORDER, order(run_id, token=token))

    def active() -> bool:
        hooks = cluster.client.snapshot(run_id, timeout=10).hooks
        return "approval" in hooks and hooks["approval"].status.value == "active"

    wait_until(active, 60, f"run {run_id} never opened its hook")


def test_a_start_answers_applied_then_duplicate_and_another_input_conflicts(
    cluster: Cluster,
) -> None:
    client = cluster.client
    run_id = f"start-{uuid.uuid4().hex[:8]}"

    first = client.start(run_id, ORDER, order(run_id), command_id=f"{run_id}-first")
    assert first is not None and first.status is OutcomeStatus.APPLIED, first
    again = client.start(run_id, ORDER, order(run_id))
    assert again is not None and again.status is OutcomeStatus.NOOP
    assert again.reason == f"run {run_id} exists with the same spec and input"

    with pytest.raises(RunConflictError, match="workflow input differs") as raised:
        client.start(run_id, ORDER, order(run_id, quantity=7), command_id=f"{run_id}-other")
    assert raised.value.run_id == run_id

    # Any client reads any command's outcome, by its id and the run it addressed.
    other = FlowClient(cluster.client.settings, wait=False)
    try:
        (seen,) = other.outcomes(f"{run_id}-first", run_id)
        assert seen == first
        rejected = other.outcome(f"{run_id}-other", run_id)
        assert rejected is not None and rejected.status is OutcomeStatus.REJECTED
        assert rejected.error_kind == "RunConflictError" and rejected.command == "start_run"
        assert other.outcome("no-such-command", run_id) is None
    finally:
        other.close()
    created = [e for e in client.history(run_id) if e.event.type == "run_created"]
    assert len(created) == 1 and created[0].event.input == order(run_id)  # type: ignore[union-attr]


def test_a_start_whose_input_does_not_validate_is_rejected_before_anything_is_written(
    cluster: Cluster,
) -> None:
    """Issue 16: the client sees the rejection; the run is never created."""
    run_id = f"invalid-{uuid.uuid4().hex[:8]}"
    with pytest.raises(InvalidInputError, match="OrderInput") as raised:
        cluster.client.start(run_id, ORDER, {"order_id": run_id, "quantity": "many"})
    assert "sku" in str(raised.value) and "many" not in str(raised.value)
    with pytest.raises(RunNotFoundError):
        cluster.client.history(run_id, timeout=10)


def test_signals_hooks_and_cancels_to_an_unknown_run_raise(cluster: Cluster) -> None:
    client = cluster.client
    ghost = f"ghost-{uuid.uuid4().hex[:8]}"

    # A signal or a hook resumption waits (parked) for a run that may be starting.
    with pytest.raises(RunNotStartedError, match=f"run {ghost} does not exist") as signalled:
        client.signal(ghost, "shipped", {"x": 1}, id="s-1")
    assert isinstance(signalled.value, RunNotFoundError)
    assert isinstance(signalled.value, CommandParkedError)
    with pytest.raises(RunNotFoundError, match="hook resumption is parked"):
        client.resume_hook(ghost, "approval", {"ok": True})
    with pytest.raises(RunNotFoundError, match="hook disposal is parked"):
        client.dispose_hook(ghost, "approval")
    # A cancellation of a run that does not exist is refused, as embedded.
    with pytest.raises(RunNotFoundError, match=f"run {ghost} does not exist") as cancelled:
        client.cancel(ghost, "why not")
    assert not isinstance(cancelled.value, CommandParkedError)
    with pytest.raises(RunNotFoundError, match=f"run {ghost} does not exist"):
        client.cancel(ghost, force=True)
    assert client.parked(ghost, timeout=10)  # the signal and the hook commands wait

    # An existing run: an undeclared signal name is refused, a duplicate changes nothing.
    run_id = f"known-{uuid.uuid4().hex[:8]}"
    client.start(run_id, ORDER, order(run_id))
    with pytest.raises(InvalidTransitionError, match="not declared"):
        client.signal(run_id, "nope", id="s-1")
    sent = client.signal(run_id, "shipped", {"parcel": 1}, id="s-2")
    assert sent is not None and sent.status is OutcomeStatus.APPLIED
    repeat = client.signal(run_id, "shipped", {"parcel": 1}, id="s-2")
    assert repeat is not None and repeat.status is OutcomeStatus.NOOP
    with pytest.raises(RunConflictError, match="another name or payload"):
        client.signal(run_id, "shipped", {"parcel": 2}, id="s-2")


def test_a_parked_signal_answers_again_when_its_run_starts(cluster: Cluster) -> None:
    client = cluster.client
    run_id = f"early-{uuid.uuid4().hex[:8]}"
    command_id = f"{run_id}-signal"
    parked = client.signal(run_id, "shipped", {"c": 1}, command_id=command_id, wait=False, id="s-1")
    assert parked is None  # sent, not waited for
    wait_until(lambda: client.outcome(command_id, run_id, timeout=10), 60, "no outcome")
    client.start(run_id, ORDER, order(run_id))

    def both() -> list[Any]:
        return [o.status for o in client.outcomes(command_id, run_id, timeout=10)]

    wait_until(lambda: len(both()) == 2, 60, f"the parked signal never answered: {both()}")
    assert both() == [OutcomeStatus.PARKED, OutcomeStatus.APPLIED]
    assert client.wait(run_id, timeout=60).output["shipment"] == {"c": 1}  # type: ignore[index]


def test_a_hook_token_that_matches_no_hook_is_refused_and_a_right_one_goes_on_to_its_run(
    cluster: Cluster,
) -> None:
    client = cluster.client
    run_id = f"hooked-{uuid.uuid4().hex[:8]}"
    token = f"tok-{uuid.uuid4().hex}"
    _hooked(cluster, run_id, token)

    with pytest.raises(InvalidTransitionError, match="no hook is registered") as wrong:
        client.resume_hook_by_token(f"wrong-{uuid.uuid4().hex}", {"manager": "eve"})
    assert token not in str(wrong.value)
    # A hook the run has not created (yet) is waited for, as a run that has not started is.
    with pytest.raises(CommandParkedError, match="hook no-such-hook does not exist yet") as early:
        client.resume_hook(run_id, "no-such-hook", {"manager": "eve"})
    assert early.value.kind == "InvalidTransitionError"

    command_id = f"{run_id}-approve"
    done = client.resume_hook_by_token(token, {"manager": "dana"}, command_id=command_id)
    assert done is not None and done.status is OutcomeStatus.APPLIED and done.key == run_id
    trail = client.outcomes(command_id, token_digest(token))
    assert [o.status for o in trail] == [OutcomeStatus.FORWARDED, OutcomeStatus.APPLIED]
    assert trail[0].forwarded_to == run_id
    assert token not in orjson.dumps([o.model_dump(mode="json") for o in trail]).decode()
    # Resumed already: the same payload again changes nothing, another one conflicts.
    again = client.resume_hook(run_id, "approval", {"manager": "dana"})
    assert again is not None and again.status is OutcomeStatus.NOOP
    with pytest.raises(RunConflictError):
        client.resume_hook(run_id, "approval", {"manager": "mallory"})


def test_retry_and_cancel_answer(cluster: Cluster) -> None:
    client = cluster.client
    with pytest.raises(RunNotFoundError, match="run no-such-run does not exist"):
        client.retry("no-such-run")

    run_id = f"retry-{uuid.uuid4().hex[:8]}"
    _hooked(cluster, run_id, f"tok-{uuid.uuid4().hex}")
    driven = client.retry(run_id)
    assert driven is not None and driven.status is OutcomeStatus.APPLIED, driven
    cancelled = client.cancel(run_id, force=True)
    assert cancelled is not None and cancelled.status is OutcomeStatus.APPLIED
    assert client.wait(run_id, timeout=30).status.value == "cancelled"
    ended = client.retry(run_id)
    assert ended is not None and ended.status is OutcomeStatus.NOOP
    assert ended.reason == f"run {run_id} is cancelled: nothing to retry"
    again = client.cancel(run_id, force=True)
    assert again is not None and again.status is OutcomeStatus.NOOP


def test_waiting_for_a_run_that_does_not_exist_says_so(cluster: Cluster) -> None:
    with pytest.raises(RunNotFoundError, match="run nope-at-all does not exist"):
        cluster.client.wait("nope-at-all", timeout=30, must_exist=True)


def test_no_outcome_in_time_raises_timeout(tmp_path: Path, kafka_bootstrap: str) -> None:
    """No processor runs: the client says so instead of waiting for ever."""
    prefix = f"t-outcomes-idle-{uuid.uuid4().hex[:8]}"
    idle = Cluster(kafka_bootstrap, prefix, tmp_path)
    client = FlowClient(idle.client.settings, timeout=2)
    try:
        with pytest.raises(TimeoutError, match="is a processor running"):
            client.signal("r-1", "shipped", id="s")
    finally:
        client.close()
        idle.close()


def test_a_command_parked_past_its_time_to_live_answers_rejected(
    tmp_path: Path, kafka_bootstrap: str
) -> None:
    """Its second outcome says it was given up, why, and as what error (the parked one's)."""
    prefix = f"t-outcomes-ttl-{uuid.uuid4().hex[:8]}"
    group = Cluster(kafka_bootstrap, prefix, tmp_path)
    try:
        group.start(
            "w1",
            app="flowstream.examples.order:runtime",
            extra_env={"FLOWSTREAM_PARKED_TTL_MS": "3000"},
        )
        client = FlowClient(group.client.settings, timeout=60)
        try:
            with pytest.raises(RunNotStartedError):
                client.signal("never", "shipped", command_id="late-signal", id="s-1")

            def trail() -> list[Any]:
                return client.outcomes("late-signal", "never", timeout=10)

            wait_until(lambda: len(trail()) == 2, 60, "the parked signal was never given up")
            parked, given_up = trail()
            assert (parked.status, given_up.status) == (
                OutcomeStatus.PARKED,
                OutcomeStatus.REJECTED,
            )
            assert given_up.error_kind == "RunNotFoundError"
            assert given_up.reason is not None and "parked for" in given_up.reason
            assert "run does not exist yet" in given_up.reason
        finally:
            client.close()
    finally:
        group.close()
