"""Plain-code workflows on the seeds' contract: one command per cycle, answers from history."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from datetime import timedelta
from typing import Any, TypeVar

import pytest

import flowstream
from flowstream.examples import shop
from flowstream.model.events import StepCreated, WaitCreated
from flowstream.testing import EPOCH, Replayer, WorkflowEnvironment
from tests.api import hosted
from tests.api import workflows as wf
from tests.api.workflows import Item

T = TypeVar("T")


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


def events_of(env: WorkflowEnvironment, run_id: str) -> list[str]:
    return [e.event.type for e in env.engine.history(run_id)]


def test_the_readme_workflow_sleeps_an_hour_and_waits_for_its_signal_in_a_test() -> None:
    env = WorkflowEnvironment(shop.app)

    async def scenario() -> tuple[str, float]:
        handle = await env.client.start(shop.order, shop.Order(order_id="7", cents=990), id="o-7")
        await handle.signal("shipped", "DHL-7", id="o-7-shipped")
        began = time.monotonic()
        shipped = await handle.result(timeout=10)
        return shipped, time.monotonic() - began

    shipped, took = run(scenario())
    assert shipped == "shipped as DHL-7"
    assert took < 1.0, took  # the hour passed on the virtual clock
    snapshot = env.engine.snapshot("o-7")
    assert list(snapshot.steps) == ["reserve_stock", "charge_card", "ship"]
    assert snapshot.steps["charge_card"].retry.max_attempts == 5
    assert snapshot.waits["sleep"].resume_at == EPOCH + timedelta(hours=1)
    assert env.clock() >= snapshot.waits["sleep"].resume_at


def test_a_failing_attempt_is_retried_after_its_delay_on_the_virtual_clock() -> None:
    env = WorkflowEnvironment(hosted.app)
    handle = run(env.client.start(hosted.napper, id="nap-1"))
    assert run(handle.result(timeout=5)) == "nap@2"
    step = env.engine.snapshot("nap-1").steps["wobbly"]
    # The 50 ms timer, then the 50 ms retry delay: both skipped on the virtual clock.
    assert step.attempt == 2 and env.clock() == EPOCH + timedelta(milliseconds=100)


def test_each_cycle_returns_the_command_of_the_first_unanswered_operation() -> None:
    env = WorkflowEnvironment(wf.app)
    items = [Item("a", 1), Item("b", 2)]
    result = run(env.client.start(wf.basket, items, id="basket-1"))
    assert run(result.result(timeout=5)) == {"a": 1, "b": 2, "total": 300}
    history = env.engine.history("basket-1")
    created = [e for e in history if isinstance(e.event, StepCreated)]
    # Derived ids: the step's name, then name#2 in call order; each gather one atomic batch.
    assert [e.event.step_id for e in created] == ["reserve", "reserve#2", "price", "price#2"]
    assert created[0].sequence + 1 == created[1].sequence
    assert created[0].event.input == {"sku": "a", "quantity": 1}


def test_a_changed_input_of_an_answered_step_is_nondeterministic() -> None:
    env = WorkflowEnvironment(wf.app)
    run(env.client.start(wf.basket, [Item("a", 1)], id="basket-2"))
    # Same history, new code: the first step of the run now reserves another quantity.
    changed = flowstream.App()

    @changed.step(name="reserve")
    def reserve(item: Item) -> dict[str, int]:
        return {}

    @changed.workflow(name="basket")
    async def basket(ctx: flowstream.Context, items: list[Item]) -> None:
        await ctx.step(reserve, Item(items[0].sku, 99))
        await ctx.sleep(1)

    report = run(Replayer(changed).replay([env.engine.history("basket-2")]))
    assert not report.ok
    problems = " ".join(report.failures[0].problems)
    assert "at sequence 3: the decision differs" in problems and '"quantity":99' in problems
    # Live, the answered operation is checked too: the task fails and records why.
    live = WorkflowEnvironment(changed)
    for envelope in env.engine.history("basket-2")[:5]:  # created .. reserve completed
        live.store.append_if_sequence("basket-2", envelope.sequence - 1, [envelope.event])
    snapshot = run(live.engine.drive("basket-2"))
    assert snapshot.task_failure is not None
    assert snapshot.task_failure.error_type == "NonDeterministicError"
    assert '"quantity":99' in snapshot.task_failure.message


def test_a_step_whose_policy_continues_the_workflow_raises_step_failed() -> None:
    env = WorkflowEnvironment(wf.app)
    handle = run(env.client.start(wf.tolerant, id="tolerant-1"))
    assert run(handle.result(timeout=5)) == "fell back after: ConnectionError: always down"


def test_application_error_fails_the_run_and_the_handle_raises() -> None:
    env = WorkflowEnvironment(wf.app)
    handle = run(env.client.start(wf.rejecting, 50, id="reject-1"))
    with pytest.raises(flowstream.RunFailedError, match="over the limit") as caught:
        run(handle.result(timeout=5))
    assert caught.value.outcome == "failed"
    assert run(env.client.start(wf.rejecting, 5, id="accept-1")).run_id == "accept-1"
    assert env.engine.snapshot("accept-1").status is flowstream.RunStatus.COMPLETED


def test_awaiting_anything_but_an_operation_is_a_workflow_task_failure() -> None:
    env = WorkflowEnvironment(wf.app)
    run(env.client.start(wf.impatient, id="impatient-1"))
    failure = env.engine.snapshot("impatient-1").task_failure
    assert failure is not None and failure.error_type == "TypeError"
    assert "await only the operations of its context" in failure.message


def test_hooks_and_repeated_signal_waits_take_derived_ids() -> None:
    env = WorkflowEnvironment(wf.app)

    async def scenario() -> object:
        handle = await env.client.start(wf.approval, "secret-token", id="approval-1")
        await handle.resume_hook("manager", {"name": "Ada"})
        await handle.signal("approve", "first", id="s1")
        await handle.signal("approve", "second", id="s2")
        return await handle.result(timeout=5)

    assert run(scenario()) == {
        "who": {"name": "Ada"},
        "notes": ["first", "second"],
        "key": "flow:approval-1:stamp",
    }
    assert set(env.engine.snapshot("approval-1").signal_waits) == {"approve", "approve#2"}


def test_a_cancellation_request_raises_cancelled_error_at_the_open_operation() -> None:
    env = WorkflowEnvironment(wf.app)

    async def scenario() -> None:
        handle = await env.client.start(wf.cleanup, id="cleanup-1")
        await handle.cancel("customer left")
        with pytest.raises(flowstream.RunFailedError, match="cancelled"):
            await handle.result(timeout=5)

    run(scenario())
    snapshot = env.engine.snapshot("cleanup-1")
    assert snapshot.status is flowstream.RunStatus.CANCELLED
    assert snapshot.steps["cleanup-stamp"].status.value == "completed"


def test_children_gather_as_one_batch_and_outputs_decode_by_annotation() -> None:
    env = WorkflowEnvironment(wf.app)
    handle = run(env.client.start(wf.parent, [Item("a", 1), Item("b", 2)], id="parent-1"))
    assert run(handle.result(timeout=5)) == [{"a": 1, "total": 100}, {"b": 2, "total": 200}]
    assert list(env.engine.snapshot("parent-1").children) == ["basket", "rest"]
    failed = run(env.client.start(wf.failing_child, id="failing-parent"))
    assert run(failed.result(timeout=5)) == "failed"


def test_continue_as_new_and_the_handle_follows_the_chain() -> None:
    env = WorkflowEnvironment(wf.app)
    handle = run(env.client.start(wf.counter, 0, id="counter-1"))
    assert run(handle.result(timeout=5)) == 3
    assert len(env.engine.continuation_chain("counter-1")) == 4


def test_the_one_hour_timer_of_a_test_finishes_well_under_a_second() -> None:
    env = WorkflowEnvironment(wf.app)
    began = time.monotonic()
    handle = run(env.client.start(wf.honest_timer, id="timer-1"))
    run(env.run_until_idle())
    assert run(handle.result(timeout=5)) == "woke"
    assert time.monotonic() - began < 1.0
    waits = [e for e in env.engine.history("timer-1") if isinstance(e.event, WaitCreated)]
    assert waits[0].event.resume_at == EPOCH + timedelta(minutes=5)


def test_registration_refuses_what_cannot_run_and_steps_belong_to_their_app() -> None:
    app = flowstream.App()
    with pytest.raises(TypeError, match="async def"):
        app.workflow(lambda ctx: None)

    def plain() -> str:
        return "plain"

    @app.workflow
    async def uses_plain(ctx: flowstream.Context) -> str:
        return await ctx.step(plain)

    env = WorkflowEnvironment(app)
    run(env.client.start(uses_plain, id="unregistered"))
    failure = env.engine.snapshot("unregistered").task_failure
    assert failure is not None and "not a step of this app" in failure.message
    app.step(plain)
    with pytest.raises(ValueError, match="already registered"):
        app.step(name="plain")(lambda: None)
    # The same function may be a step of another app, with its own policy.
    other = flowstream.App()
    other.step(retry=flowstream.RetryPolicy.none())(plain)
    assert run(run(env.client.start(uses_plain, id="registered")).result(timeout=5)) == "plain"
    assert env.engine.snapshot("registered").steps["plain"].retry == flowstream.RetryPolicy()


def test_the_engine_speaks_the_cli_order_for_signals_and_one_verb_for_cancelling() -> None:
    env = WorkflowEnvironment(wf.app)

    async def scenario() -> None:
        spec = wf.app.spec(wf.approval)
        await env.engine.start("verbs-1", spec, "t-1")
        await env.engine.resume_hook("verbs-1", "manager", {"name": "Lin"})
        await env.engine.signal("verbs-1", "approve", "yes", id="verbs-1-a")
        await env.engine.signal("verbs-1", "approve", "yes", id="verbs-1-a")  # a repeat: no-op
        assert len(env.engine.snapshot("verbs-1").signals) == 1
        await env.engine.cancel("verbs-1", "not needed", force=True)

    run(scenario())
    assert env.engine.snapshot("verbs-1").status is flowstream.RunStatus.CANCELLED


def test_what_the_context_refuses_is_a_task_failure_that_says_what_to_do() -> None:
    env = WorkflowEnvironment(wf.app)
    run(env.client.start(wf.mixed, id="mixed-1"))
    run(env.client.start(wf.undeclared, id="undeclared-1"))
    mixed = env.engine.snapshot("mixed-1").task_failure
    undeclared = env.engine.snapshot("undeclared-1").task_failure
    assert mixed is not None and "one or more steps, or one or more child" in mixed.message
    assert undeclared is not None and "@app.workflow(signals=[...])" in undeclared.message


def test_an_answered_timer_whose_deadline_moved_is_nondeterministic() -> None:
    env = WorkflowEnvironment(wf.app)
    handle = run(env.client.start(wf.fixed_deadline, 5, id="deadline-1"))
    assert run(handle.result(timeout=5)) == "woke"
    history = env.engine.history("deadline-1")
    # The same history read by code whose deadline is a minute later: the fired timer differs.
    moved = WorkflowEnvironment(wf.app)
    for envelope in history[:-1]:  # all but run_completed
        event = envelope.event
        if envelope.sequence == 1:
            event = event.model_copy(update={"input": 6})
        moved.store.append_if_sequence("deadline-1", envelope.sequence - 1, [event])
    failure = run(moved.engine.drive("deadline-1")).task_failure
    assert failure is not None and failure.error_type == "NonDeterministicError"
    assert "wait sleep resume_at differs" in failure.message


def test_a_start_whose_input_does_not_fit_the_annotation_is_refused_before_writing() -> None:
    env = WorkflowEnvironment(wf.app)
    with pytest.raises(flowstream.InvalidInputError, match=r"list\[Item\]|0\.quantity"):
        run(env.client.start(wf.basket, [{"sku": "a"}], id="bad-basket"))
    assert "bad-basket" not in env.engine.list_runs()
    with pytest.raises(flowstream.WorkflowNotServedError):
        run(env.client.start(shop.order, {"order_id": "1", "cents": 1}, id="elsewhere"))
    shop_env = WorkflowEnvironment(shop.app)
    with pytest.raises(flowstream.InvalidInputError, match="cents"):
        run(shop_env.client.start(shop.order, {"order_id": "1"}, id="bad-order"))
    assert env.engine.list_runs() == [] and shop_env.engine.list_runs() == []


def test_the_raw_contract_takes_models_and_dataclasses_as_payloads() -> None:
    from tests.api.typed_example import RawRuntime

    env = WorkflowEnvironment(RawRuntime())
    spec = flowstream.WorkflowSpec(name="raw")
    snapshot = run(env.engine.start("raw-1", spec, Item("x", 1)))  # a dataclass start input
    assert snapshot.input == {"sku": "x", "quantity": 1}
    assert snapshot.steps["count"].input == {"order_id": "1", "lines": {"a": 1}}  # a model
    assert snapshot.output == {"a": 1}
