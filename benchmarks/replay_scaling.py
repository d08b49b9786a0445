"""Replay scaling: one run of N sequential steps; prints total time and time per decision.

The per-decision cost must stay flat as the history grows (the cached projection is advanced
event by event, never rebuilt). Usage: ``python benchmarks/replay_scaling.py [--store rocksdb]``.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time

from flowstream.engine import FlowEngine
from flowstream.model.spec import WorkflowSpec
from flowstream.replay.context import StepInvocation, WorkflowInvocation
from flowstream.model.commands import RuntimeCommand
from flowstream.model.base import JSON
from flowstream.stores.base import EventStore
from flowstream.stores.memory import MemoryEventStore


class Sequential:
    """Step i+1 is scheduled once step i completed; the count comes from the run input."""

    def run_workflow(self, invocation: WorkflowInvocation) -> RuntimeCommand:
        ctx = invocation.context()
        total = int(invocation.input["steps"])  # type: ignore[index, call-overload]
        done = ctx.progress("done")
        index = len(ctx._state.steps)  # noqa: SLF001 - count of scheduled steps, O(1)
        if index and not ctx.step_completed(f"s{index - 1:06d}"):
            return ctx.schedule_step(f"s{index - 1:06d}", "noop", index - 1)
        if index < total:
            return ctx.schedule_step(f"s{index:06d}", "noop", index)
        del done
        return ctx.complete(index)

    def run_step(self, invocation: StepInvocation) -> JSON:
        return invocation.input


def make_store(kind: str, directory: str) -> EventStore:
    if kind == "memory":
        return MemoryEventStore()
    from flowstream.stores.rocksdb import RocksDBEventStore

    return RocksDBEventStore(directory, sync=True)


async def measure(kind: str, steps: int) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as directory:
        store = make_store(kind, directory)
        engine = FlowEngine(store, Sequential())
        began = time.perf_counter()
        snapshot = await engine.start(f"seq-{steps}", WorkflowSpec(name="seq"), {"steps": steps})
        elapsed = time.perf_counter() - began
        assert snapshot.status == "completed", snapshot.status
        store.close()
        return elapsed, steps + 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--store", choices=["memory", "rocksdb"], default="rocksdb")
    parser.add_argument("--sizes", default="100,1000,10000")
    args = parser.parse_args()
    print(f"replay scaling, store={args.store}")
    print(f"{'steps':>8} {'total s':>9} {'µs/decision':>12}")
    base = None
    for size in (int(s) for s in args.sizes.split(",")):
        elapsed, decisions = asyncio.run(measure(args.store, size))
        per = elapsed / decisions * 1e6
        base = base or elapsed
        print(f"{size:>8} {elapsed:>9.3f} {per:>12.1f}   ({elapsed / base:.1f}x the first)")


if __name__ == "__main__":
    main()
