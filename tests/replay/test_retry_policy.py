"""``RetryPolicy``: validation, and deterministic delays (same run, step, attempt: same delay)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from flowstream.model.spec import Backoff, ExhaustedAction, RetryPolicy


def test_the_default_is_three_immediate_attempts_that_fail_the_run() -> None:
    policy = RetryPolicy()
    assert (policy.max_attempts, policy.delay_ms, policy.backoff) == (3, 0, Backoff.FIXED)
    assert policy.on_exhausted is ExhaustedAction.FAIL_RUN
    assert RetryPolicy.none().max_attempts == 1
    assert RetryPolicy.fixed(0, 5).max_attempts == 1


def test_continue_workflow_keeps_the_rest_of_the_policy() -> None:
    policy = RetryPolicy.fixed(4, 250).continue_workflow_on_failure()
    assert policy.on_exhausted is ExhaustedAction.CONTINUE_WORKFLOW
    assert (policy.max_attempts, policy.delay_ms) == (4, 250)


@pytest.mark.parametrize(
    "fields",
    [
        {"max_attempts": 0},
        {"delay_ms": -1},
        {"backoff": "fixed", "max_delay_ms": 10},
        {"backoff": "exponential", "delay_ms": 0, "max_delay_ms": 10},
        {"backoff": "exponential", "delay_ms": 100, "max_delay_ms": 50},
        {"unknown": 1},
    ],
)
def test_invalid_policies_are_rejected(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        RetryPolicy(**fields)  # type: ignore[arg-type]


def test_fixed_delays_are_constant() -> None:
    policy = RetryPolicy.fixed(5, 750)
    assert {policy.delay_for("r", "s", attempt) for attempt in range(1, 5)} == {750}


def test_exponential_delays_are_deterministic_full_jitter_under_a_growing_cap() -> None:
    policy = RetryPolicy.exponential(10, 100, 1_000)
    delays = [policy.delay_for("run-1", "step-1", attempt) for attempt in range(1, 10)]
    assert delays == [policy.delay_for("run-1", "step-1", a) for a in range(1, 10)]
    for attempt, delay in enumerate(delays, start=1):
        assert 1 <= delay <= min(100 * 2 ** (attempt - 1), 1_000)
    # Jitter depends on the run, the step and the attempt.
    assert len(set(delays)) > 1
    others = [policy.delay_for("run-2", "step-1", a) for a in range(1, 10)]
    assert others != delays
    assert [policy.delay_for("run-1", "step-2", a) for a in range(1, 10)] != delays


def test_exponential_delay_survives_huge_attempt_numbers() -> None:
    policy = RetryPolicy.exponential(10_000, 1, 60_000)
    assert 1 <= policy.delay_for("r", "s", 9_999) <= 60_000


def test_a_policy_round_trips_through_json() -> None:
    policy = RetryPolicy.exponential(4, 100, 1000).continue_workflow_on_failure()
    assert RetryPolicy.model_validate_json(policy.model_dump_json()) == policy
