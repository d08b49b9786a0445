"""The audit replays every recorded decision against the current code."""

from __future__ import annotations

import asyncio
from typing import Any

from flowstream.engine import FlowEngine
from flowstream.examples.order import SPEC, OrderRuntime
from flowstream.model.commands import RuntimeCommand
from flowstream.model.events import EventEnvelope
from flowstream.model.spec import WorkflowSpec
from flowstream.replay.audit import audit_history
from flowstream.replay.context import WorkflowInvocation
from flowstream.runtime import FlowRuntime
from flowstream.stores.memory import MemoryEventStore

ORDER = {"order_id": "o-1", "sku": "sku-1", "quantity": 1, "amount_cents": 100}


class Drifted(OrderRuntime):
    """Today's code reserves two units where the recorded run reserved one."""

    def run_workflow(self, invocation: WorkflowInvocation) -> RuntimeCommand:
        ctx = invocation.context()
        if not ctx.step_completed("reserve-stock"):
            return ctx.schedule_step(
                "reserve-stock", "reserve_stock", {"sku": "sku-1", "quantity": 2}
            )
        return super().run_workflow(invocation)


def recorded_order_history() -> list[EventEnvelope]:
    async def scenario() -> list[EventEnvelope]:
        engine = FlowEngine(MemoryEventStore(), OrderRuntime())
        snapshot = await engine.start("o-1", SPEC, ORDER)
        while not snapshot.is_terminal:
            if any(w.status == "waiting" for w in snapshot.signal_waits.values()):
                snapshot = await engine.send_signal("o-1", "s-1", "shipped", {"carrier": "x"})
            else:
                wakeup = engine.next_wakeup()
                assert wakeup is not None
                await engine.resume_due(wakeup.due)
                snapshot = engine.snapshot("o-1")
        return engine.history("o-1")

    return asyncio.run(scenario())


def audit(history: list[EventEnvelope], runtime: FlowRuntime) -> Any:
    return asyncio.run(audit_history(history, lambda spec: runtime))


def test_the_same_code_replays_every_decision() -> None:
    history = recorded_order_history()
    report = audit(history, OrderRuntime())
    assert report.ok, report.problems
    assert report.decisions_checked >= 5
    assert history[-1].event.type == "run_completed"


def test_changed_code_is_reported_with_the_sequence_and_the_diff() -> None:
    report = audit(recorded_order_history(), Drifted())
    assert not report.ok
    assert report.nondeterministic
    assert "at sequence 3" in report.problems[0]
    assert "history=" in report.problems[0] and "replay=" in report.problems[0]


def test_a_corrupt_history_is_reported_not_replayed() -> None:
    history = recorded_order_history()
    broken = [history[0], *history[2:]]
    report = audit(broken, OrderRuntime())
    assert not report.ok
    assert "sequence" in report.problems[0]
    assert report.decisions_checked == 0


def test_runs_of_unserved_builds_are_skipped_not_failed() -> None:
    history = recorded_order_history()
    report = asyncio.run(audit_history(history, lambda spec: None))
    assert report.ok and report.skipped is not None
    assert isinstance(SPEC, WorkflowSpec)


def test_a_run_that_waits_on_nothing_is_reported_stalled() -> None:
    history = recorded_order_history()
    cut = next(i for i, e in enumerate(history) if e.event.type == "step_completed") + 1
    report = audit(history[:cut], OrderRuntime())
    assert report.stalled
    assert report.problems == ["stalled: nothing will move it; run `flowstream drive o-1`"]
    assert not report.nondeterministic


def test_a_suspended_or_finished_run_is_not_stalled() -> None:
    history = recorded_order_history()
    cut = next(i for i, e in enumerate(history) if e.event.type == "wait_created") + 1
    assert audit(history[:cut], OrderRuntime()).ok
    report = audit(history, OrderRuntime())
    assert report.condition is not None and report.condition.describe() == "completed"
