"""What a command that applied without raising did (``processor.outcomes.judge``), judged from
its run before and after it: applied, or a no-op (a duplicate, or nothing to do). The run lives
in an embedded engine's memory store, as a partition's would in its store; the outcome records
themselves are proven on the broker (``tests/kafka/test_command_outcomes.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flowstream.engine import FlowEngine
from flowstream.model.commands import RuntimeCommand
from flowstream.model.messages import (
    CancelRun,
    CommandMessage,
    DisposeHook,
    OutcomeStatus,
    ResumeHook,
    RetryRun,
    SendSignal,
    StartRun,
)
from flowstream.processor.outcomes import Before, judge
from flowstream.replay.context import WorkflowContext
from flowstream.stores.memory import MemoryEventStore
from tests.support import FakeClock, make_runtime, run, spec

WF = spec("wf", signal_names=("go",))


def waits(ctx: WorkflowContext) -> RuntimeCommand:
    if ctx.cancellation_request() is not None:
        return ctx.cancel("asked")
    if not ctx.hook_received("h"):
        return ctx.create_hook("h", f"token-{ctx.run_id}")
    if not ctx.signal_received("s"):
        return ctx.wait_for_signal("s", "go")
    return ctx.complete(ctx.input)


@dataclass
class Task:
    store: MemoryEventStore


def applied(engine: FlowEngine, command: CommandMessage, work: Any) -> tuple[OutcomeStatus, Any]:
    """Apply ``work`` (the engine call for ``command``) and judge it."""
    task = Task(engine.store)  # type: ignore[arg-type]
    before = Before.of(task, command)
    if work is not None:
        run(work)
    return judge(task, command, before)


def test_commands_that_record_something_applied_and_their_repeats_are_noops() -> None:
    engine = FlowEngine(MemoryEventStore(), make_runtime(waits), clock=FakeClock())
    start = StartRun(run_id="r", spec=WF, input={"a": 1})
    assert applied(engine, start, engine.start("r", WF, {"a": 1})) == (OutcomeStatus.APPLIED, None)
    assert applied(engine, start, engine.start("r", WF, {"a": 1})) == (
        OutcomeStatus.NOOP,
        "run r exists with the same spec and input",
    )

    hook = ResumeHook(run_id="r", hook_id="h", payload=1)
    assert applied(engine, hook, engine.resume_hook("r", "h", 1))[0] is OutcomeStatus.APPLIED
    assert applied(engine, hook, engine.resume_hook("r", "h", 1)) == (
        OutcomeStatus.NOOP,
        "a duplicate: the run holds it already",
    )
    signal = SendSignal(run_id="r", signal_id="s-1", name="go", payload=2)
    assert applied(engine, signal, engine.send_signal("r", "s-1", "go", 2))[0] is (
        OutcomeStatus.APPLIED
    )
    assert engine.snapshot("r").status.value == "completed"
    # Redelivered to a run that ended: a duplicate still.
    assert applied(engine, signal, engine.send_signal("r", "s-1", "go", 2))[0] is (
        OutcomeStatus.NOOP
    )
    assert applied(engine, RetryRun(run_id="r"), None) == (
        OutcomeStatus.NOOP,
        "run r is completed: nothing to retry",
    )
    cancel = CancelRun(run_id="r", force=True)
    assert applied(engine, cancel, engine.force_cancel("r")) == (
        OutcomeStatus.NOOP,
        "a duplicate: the run holds it already",
    )


def test_a_cancellation_and_a_disposal_apply_once() -> None:
    engine = FlowEngine(MemoryEventStore(), make_runtime(waits), clock=FakeClock())
    run(engine.start("c", WF, None))
    assert applied(engine, RetryRun(run_id="c"), None) == (
        OutcomeStatus.APPLIED,
        "run c is driven again",
    )
    dispose = DisposeHook(run_id="c", hook_id="h")
    assert applied(engine, dispose, engine.dispose_hook("c", "h"))[0] is OutcomeStatus.APPLIED
    cancel = CancelRun(run_id="c", reason="why")
    assert applied(engine, cancel, engine.request_cancellation("c", "why"))[0] is (
        OutcomeStatus.APPLIED
    )
    assert applied(engine, cancel, engine.request_cancellation("c", "why"))[0] is (
        OutcomeStatus.NOOP
    )
