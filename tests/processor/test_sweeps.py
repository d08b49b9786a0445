"""The processor's liveness scan (``Sweeper.scan``), on a partition store with no broker: every
scan interval a budget of the partition's open runs is looked at, the stalled ones are driven
and counted in ``flowstream_runs_repaired``, and one run's failing repair stops nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from flowstream.model.commands import RuntimeCommand
from flowstream.model.events import RunCreated, RunStarted, SignalReceived
from flowstream.processor import sweeps
from flowstream.processor.boundary import FailureBoundary
from flowstream.processor.engine import PartitionEngine
from flowstream.processor.metrics import ProcessorMetrics
from flowstream.processor.sweeps import Sweeper
from flowstream.processor.tasks import PartitionTask
from flowstream.replay.context import WorkflowContext
from flowstream.replay.liveness import ConditionKind
from flowstream.stores.partition import PartitionStore
from tests.support import FakeClock, make_runtime, spec

SPEC = spec("scan", signal_names=("go",))


def waits_for_go(ctx: WorkflowContext) -> RuntimeCommand:
    if ctx.input == "broken":
        raise KeyError("x")
    if not ctx.signal_received("w1"):
        return ctx.wait_for_signal("w1", "go")
    return ctx.complete(ctx.signal_payload("w1"))


class Partition:
    """One owned partition with a sweeper around it (no Kafka: the sink drops the records)."""

    def __init__(self, root: Path) -> None:
        self.clock = FakeClock()
        self.store = PartitionStore(0, root / "p0", lambda *record: None, clock=self.clock)
        self.runtime = make_runtime(waits_for_go)
        self.engine = PartitionEngine(
            self.store,
            {None: self.runtime},
            dispatch=lambda run_id, steps: None,
            emit=lambda command, behind_start=False: None,
            clock=self.clock,
        )
        self.task = PartitionTask(0, self.store, self.engine, {}, {}, restoring=False)
        self.metrics = ProcessorMetrics()
        self.dead: list[str] = []
        ctx: Any = SimpleNamespace(
            metrics=self.metrics,
            clock=self.clock,
            pipeline=SimpleNamespace(begin=lambda: None),
        )
        letters: Any = SimpleNamespace(for_run=lambda p, run_id, reason: self.dead.append(run_id))
        tasks: Any = SimpleNamespace(active=lambda: [self.task])
        self.sweeper = Sweeper(ctx, tasks, FailureBoundary(ctx, letters), None, None)  # type: ignore[arg-type]

    def stalled(self, run_id: str, kind: str = "ok") -> None:
        """A run its last owner left right after its signal, before the decision."""
        self.store.append_if_sequence(run_id, 0, [RunCreated(spec=SPEC, input=kind), RunStarted()])
        self.store.append_if_sequence(run_id, 2, [SignalReceived(signal_id="s", name="go")])
        self.store.commit_local(None)

    def scan_and_sweep(self) -> None:
        self.sweeper.scan()
        while self.sweeper.pending():
            asyncio.run(self.sweeper.sweep())
        self.store.commit_local(None)

    def repaired(self) -> float:
        return self.metrics.registry.get_sample_value("flowstream_runs_repaired_total") or 0.0


@pytest.fixture
def partition(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(sweeps, "SCAN_INTERVAL_S", 0.0)
    monkeypatch.setattr(sweeps, "SCAN_BUDGET", 3)
    owned = Partition(tmp_path)
    owned.sweeper.scan()  # the first look only starts the partition's scan
    yield owned
    owned.store.close()


def test_the_scan_drives_the_stalled_runs_and_counts_them(partition: Partition) -> None:
    for index in range(5):
        partition.stalled(f"r{index}")
    asyncio.run(partition.engine.start("waiting", SPEC, "ok"))
    partition.store.commit_local(None)
    partition.scan_and_sweep()  # r0, r1, r2 (the budget)
    assert partition.repaired() == 3
    partition.scan_and_sweep()  # r3, r4, waiting: the lap ends
    assert partition.repaired() == 5
    for index in range(5):
        assert partition.store.state(f"r{index}").status.value == "completed"
    assert partition.engine.condition("waiting").describe() == "waiting for signal 'go' (wait w1)"
    partition.scan_and_sweep()
    assert partition.repaired() == 5


def test_a_run_whose_code_fails_is_repaired_into_failing_and_left_to_its_retry(
    partition: Partition,
) -> None:
    partition.stalled("a-broken", "broken")
    partition.stalled("b-fine")
    partition.scan_and_sweep()
    assert partition.repaired() == 2  # both now in a named condition
    assert partition.store.state("b-fine").status.value == "completed"
    failing = partition.engine.condition("a-broken")
    assert failing.kind is ConditionKind.FAILING, failing.describe()
    calls = len(partition.runtime.workflow_calls_of("a-broken"))
    for _ in range(3):
        partition.scan_and_sweep()
    # The scan does not hammer a run whose code fails on it: its task retry is a deadline.
    assert len(partition.runtime.workflow_calls_of("a-broken")) == calls


def test_a_repair_that_raises_stops_no_other_and_is_not_retried_until_its_run_changes(
    partition: Partition, monkeypatch: pytest.MonkeyPatch
) -> None:
    partition.stalled("a-raises")
    partition.stalled("b-fine")
    advance = partition.engine.advance
    tried: list[str] = []

    async def raising(run_id: str, **options: Any) -> Any:
        if run_id == "a-raises":
            tried.append(run_id)
            raise RuntimeError("the engine around the code failed")
        return await advance(run_id, **options)

    monkeypatch.setattr(partition.engine, "advance", raising)
    partition.scan_and_sweep()
    assert partition.repaired() == 1
    assert partition.store.state("b-fine").status.value == "completed"
    for _ in range(3):
        partition.scan_and_sweep()
    assert tried == ["a-raises"]
    assert partition.dead == ["a-raises"]
