"""Issue 16, Done when 2: runs driven through random crash points keep the liveness invariant.

A few hundred runs of a workflow mix (two steps with a retry, a timer, a signal, a hook, a child)
are driven on a store that "crashes" (raises ``Crash``, which no engine code catches) right
after a chosen append, each run at another append of its scenario. After a crash the process
is restarted: a new engine, and for RocksDB the store reopened from disk with the appends not
yet written lost (a process crash keeps what reached the write-ahead log, not the group
commit's batch in memory). Then the scheduler's tick scans the open runs, after which no run
may be stalled, and the clients retry their deliveries until every run has the outcome its
scenario promises.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path

import pytest

from flowstream.engine import FlowEngine
from flowstream.errors import InvalidTransitionError
from flowstream.model.commands import RuntimeCommand
from flowstream.model.events import FlowEvent
from flowstream.model.snapshot import RunStatus
from flowstream.model.spec import RetryPolicy
from flowstream.replay.context import StepInvocation, WorkflowContext
from flowstream.replay.liveness import ConditionKind
from flowstream.stores.base import AppendResult, EventStore
from flowstream.stores.memory import MemoryEventStore
from flowstream.stores.rocksdb import RocksDBEventStore
from tests.support import Crash, FakeClock, make_runtime, spec

SPEC = spec("mix", signal_names=("go",))
KINDS = ("steps", "timer", "signal", "hook", "child")
RUNS = 250
RETRY = RetryPolicy.fixed(3, 0)


def mix(ctx: WorkflowContext) -> RuntimeCommand:
    kind = ctx.input
    if kind == "steps":
        for step_id in ("a", "b"):
            if not ctx.step_completed(step_id):
                return ctx.schedule_step(step_id, step_id, ctx.run_id, RETRY)
        return ctx.complete([ctx.step_output("a"), ctx.step_output("b")])
    if kind == "timer":
        if not ctx.wait_completed("t1"):
            return ctx.wait_for("t1", timedelta(minutes=1))
        return ctx.complete("woke")
    if kind == "signal":
        if not ctx.signal_received("w1"):
            return ctx.wait_for_signal("w1", "go")
        return ctx.complete(ctx.signal_payload("w1"))
    if kind == "hook":
        if not ctx.hook_received("h1"):
            return ctx.create_hook("h1", f"token-{ctx.run_id}")
        return ctx.complete(ctx.hook_payload("h1"))
    outcome = ctx.child_workflow_outcome("c1")
    if outcome is None:
        return ctx.start_child_workflow("c1", SPEC, "steps")
    return ctx.complete(outcome.output)


def expected(host: Host, run_id: str, kind: str) -> object:
    """The output each scenario promises (a child's is its steps', named by the child run)."""
    if kind in ("steps", "child"):
        named = host.store.state(run_id).children["c1"].run_id if kind == "child" else run_id
        return [f"a:{named}", f"b:{named}"]
    return {"timer": "woke", "signal": run_id, "hook": run_id}[kind]


def steps() -> dict[str, Callable[[StepInvocation], object]]:
    failed_once: set[str] = set()

    def a(invocation: StepInvocation) -> object:
        if invocation.run_id not in failed_once:  # the first attempt of each run fails
            failed_once.add(invocation.run_id)
            raise RuntimeError("transient")
        return f"a:{invocation.input}"

    def b(invocation: StepInvocation) -> object:
        return f"b:{invocation.input}"

    return {"a": a, "b": b}


class CrashingStore:
    """Arms a store to raise ``Crash`` right after its n-th append from now."""

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self.left: int | None = None
        self.appends = 0
        original = store.append_if_sequence

        def append(run_id: str, expected: int, events: Sequence[FlowEvent]) -> AppendResult:
            written = original(run_id, expected, events)
            if written:
                self.appends += 1
                if self.left is not None:
                    self.left -= 1
                    if self.left <= 0:
                        self.left = None
                        raise Crash
            return written

        store.append_if_sequence = append  # type: ignore[method-assign]

    def arm(self, after: int | None) -> None:
        self.left = after


class Host:
    """One process's engine over the store; ``restart`` is a crash and a new process."""

    def __init__(self, kind: str, root: Path, clock: FakeClock) -> None:
        self.kind = kind
        self.path = root / "db"
        self.clock = clock
        self.runtime = make_runtime(mix, steps())
        self.memory = MemoryEventStore(clock=clock) if kind == "memory" else None
        self.restarts = 0
        self._open()

    def _open(self) -> None:
        store = self.memory or RocksDBEventStore(self.path, clock=self.clock)
        self.crashing = CrashingStore(store)
        self.store = store
        self.engine = FlowEngine(store, self.runtime, clock=self.clock)

    def restart(self) -> None:
        self.restarts += 1
        if isinstance(self.store, RocksDBEventStore):
            self.store._pending = None  # the group commit's batch dies with the process
            self.store.close()
        self._open()

    def close(self) -> None:
        self.store.close()


async def deliver(engine: FlowEngine, run_id: str, kind: str, clock: FakeClock) -> None:
    """What the run's client does: start it, then send the input its scenario waits for."""
    await engine.start(run_id, SPEC, kind)
    if kind == "signal":
        await engine.send_signal(run_id, "s1", "go", run_id)
    elif kind == "hook":
        await engine.resume_hook(run_id, "h1", run_id)
    elif kind == "timer":
        clock.advance(minutes=2)
        await engine.resume_wait(run_id, "t1")


def appends_per_scenario(tmp: Path) -> dict[str, int]:
    counts = {}
    clock = FakeClock()
    host = Host("memory", tmp, clock)
    for kind in KINDS:
        before = host.crashing.appends
        asyncio.run(deliver(host.engine, f"dry-{kind}", kind, clock))
        counts[kind] = host.crashing.appends - before
    return counts


@pytest.mark.timeout(120)
@pytest.mark.parametrize("store_kind", ["memory", "rocksdb"])
def test_runs_crashed_at_every_append_are_never_stalled_after_a_scan_and_all_finish(
    store_kind: str, tmp_path: Path
) -> None:
    counts = appends_per_scenario(tmp_path)
    assert all(count >= 3 for count in counts.values()), counts
    clock = FakeClock()
    host = Host(store_kind, tmp_path, clock)
    runs = {f"run-{i:03d}": KINDS[i % len(KINDS)] for i in range(RUNS)}
    crashed = 0

    async def phase_one() -> None:
        nonlocal crashed
        for index, (run_id, kind) in enumerate(runs.items()):
            host.crashing.arm(1 + (index // len(KINDS)) % counts[kind])
            try:
                await deliver(host.engine, run_id, kind, clock)
            except Crash:
                crashed += 1
                host.restart()
            host.crashing.arm(None)

    asyncio.run(phase_one())
    assert crashed >= RUNS * 0.8  # most crash points lie inside their scenario

    async def scan_then_retry() -> None:
        tick = await host.engine.resume_due()
        assert not tick.failed, tick.failed
        open_runs = host.store.open_runs(None, 10 * RUNS)
        stalled = [r for r in open_runs if host.engine.condition(r).is_stalled]
        assert stalled == [], [host.engine.condition(r).describe() for r in stalled]
        assert tick.repaired, "the crashes left no run for the scan to repair"
        for _ in range(3):  # clients retry what they never heard back about
            clock.advance(minutes=2)
            await host.engine.resume_due()
            for run_id, kind in runs.items():
                if not host.store.exists(run_id) or not host.store.state(run_id).is_terminal:
                    await retry(run_id, kind)

    async def retry(run_id: str, kind: str) -> None:
        try:
            await deliver(host.engine, run_id, kind, clock)
        except InvalidTransitionError:
            pass  # e.g. a timer not due yet: the next round

    asyncio.run(scan_then_retry())
    try:
        for run_id, kind in runs.items():
            state = host.store.state(run_id)
            assert state.status is RunStatus.COMPLETED, (run_id, kind, state.status)
            assert state.output == expected(host, run_id, kind), (run_id, kind)
        for run_id in host.store.list_runs():
            found = host.engine.condition(run_id)
            assert found.kind is ConditionKind.TERMINAL, found.describe()
    finally:
        host.close()
