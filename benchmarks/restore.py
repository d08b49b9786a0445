"""Restore: how long a fresh processor takes to restore a partition holding 100,000 events.

1. Fill: one ``flowstream worker`` drives order runs whose ids all hash to partition 0 until
   that partition of the events topic holds ``--events`` events (12 per run).
2. The filler stops (SIGTERM, it leaves the group). A fresh worker joins the same group with an
   empty state directory, so it restores every partition from the events topic before its first
   decision. Timed from its spawn until its ``flowstream_owned_partitions`` gauge says all 8
   partitions are active (sampled every 20 ms).
3. The same fresh start on a prefix whose topics are empty gives the fixed cost (interpreter,
   imports, group join); restore time = (1) − (3). Each is measured ``--repeats`` times, best kept.

Prints the restore time, events/s, and the worker's own ``flowstream_restore_seconds`` sum.

Usage: ``python -m benchmarks.restore [--events 100000]``
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.order_app import SPEC, make_input
from flowstream.client import FlowClient
from flowstream.partitioning import partition_for
from flowstream.settings import Settings

EVENTS_PER_RUN = 12


def run_ids_on(partition: int, count: int, partitions: int, tag: str) -> list[str]:
    found = []
    index = 0
    while len(found) < count:
        run_id = f"restore-{tag}-{index}"
        if partition_for(run_id, partitions) == partition:
            found.append(run_id)
        index += 1
    return found


async def fill(prefix: str, events: int, state_root: Path, in_flight: int) -> dict[str, Any]:
    """Drive runs on partition 0 until it holds ``events`` events; returns what was written."""
    client = FlowClient(
        Settings(bootstrap=harness.BOOTSTRAP, topic_prefix=prefix, group=f"{prefix}-client"),
        wait=False,
    )
    worker = harness.Worker("filler", prefix=prefix, state_root=state_root)
    counted = {"events": 0}
    try:
        harness.wait_owned([worker], client.partitions)
        tracker = harness.RunTracker(client.settings, asyncio.get_running_loop())
        tracker.listen(lambda e, now, p, w: counted.__setitem__("events", counted["events"] + 1))
        runs = -(-events // EVENTS_PER_RUN)
        ids = run_ids_on(0, runs, client.partitions, prefix[-8:])
        slots = asyncio.Semaphore(in_flight)
        began = time.perf_counter()

        async def one(run_id: str) -> None:
            async with slots:
                future = tracker.expect(run_id)
                client.start(run_id, SPEC, make_input(0))
                kind, _ = await asyncio.wait_for(future, 600)
                assert kind == "run_completed", kind

        await asyncio.gather(*(one(r) for r in ids))
        elapsed = time.perf_counter() - began
        await asyncio.sleep(0.5)
        tracker.close()
    finally:
        worker.stop()
        client.close()
    print(f"filled partition 0 with {runs} runs, {counted['events']} events in {elapsed:.1f} s")
    return {"runs": runs, "events": counted["events"], "fill_s": round(elapsed, 1)}


def fresh_start(prefix: str, name: str, partitions: int = 8) -> tuple[float, dict[str, float]]:
    """Seconds from spawning a fresh worker (empty state dir) until all ``partitions`` are
    active."""
    state_root = Path(tempfile.mkdtemp(prefix=f"{prefix}-{name}-"))
    began = time.monotonic()
    worker = harness.Worker(name, prefix=prefix, state_root=state_root)
    try:
        while True:
            if worker.process.poll() is not None:
                raise SystemExit(f"worker {name} exited:\n{worker.output()[-3000:]}")
            metrics = worker.metrics()
            if metrics.get("flowstream_owned_partitions", 0) >= partitions:
                metrics["worker_cpu_s"] = harness.cpu_seconds(worker.pid)
                return time.monotonic() - began, metrics
            if time.monotonic() - began > 600:
                raise SystemExit("restore did not finish in 600 s")
            time.sleep(0.02)
    finally:
        worker.stop()
        import shutil

        shutil.rmtree(state_root, ignore_errors=True)


def run(events: int, repeats: int, in_flight: int, out: str | None) -> dict[str, Any]:
    started_broker = harness.ensure_broker()
    try:
        prefix = harness.new_prefix("restore")
        harness.apply_topics(prefix)
        empty = harness.new_prefix("restore-empty")
        harness.apply_topics(empty)
        with tempfile.TemporaryDirectory(dir=harness.ROOT / "benchmarks") as directory:
            filled = asyncio.run(fill(prefix, events, Path(directory), in_flight))
        context = harness.machine()
        full_runs, empty_runs = [], []
        metrics: dict[str, float] = {}
        for i in range(repeats):
            seconds, metrics = fresh_start(prefix, f"fresh{i}")
            full_runs.append(seconds)
            empty_runs.append(fresh_start(empty, f"empty{i}")[0])
            print(
                f"  fresh worker: {seconds:.2f} s to own all partitions, "
                f"{metrics['worker_cpu_s']:.2f} CPU s (empty topics: {empty_runs[-1]:.2f} s)"
            )
    finally:
        if started_broker:
            harness.stop_broker()
    restore = min(full_runs) - min(empty_runs)
    rate = filled["events"] / restore if restore > 0 else float("inf")
    record = {
        "figure": "restore",
        **filled,
        "fresh_start_s": round(min(full_runs), 2),
        "empty_start_s": round(min(empty_runs), 2),
        "restore_s": round(restore, 2),
        "events_per_s": round(rate),
        "worker_restore_seconds_sum": round(metrics.get("flowstream_restore_seconds_sum", 0.0), 2),
        "worker_restore_seconds_count": metrics.get("flowstream_restore_seconds_count", 0.0),
        "worker_cpu_s_last": round(metrics.get("worker_cpu_s", 0.0), 2),
        **context,
    }
    print(
        f"restore of {filled['events']} events: {restore:.2f} s = {rate:,.0f} events/s "
        f"(fresh start {min(full_runs):.2f} s − empty start {min(empty_runs):.2f} s; "
        f"the worker's flowstream_restore_seconds sum over 8 partitions: "
        f"{record['worker_restore_seconds_sum']} s)"
    )
    harness.emit(record, out)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--in-flight", type=int, default=300)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    run(args.events, args.repeats, args.in_flight, args.out)


if __name__ == "__main__":
    main()
