"""Where one run's latency goes on Kafka: the timeline of a sequential order run.

One worker; ``--runs`` runs one after another (after 5 warm-up runs). For every event of a run it
records when the processor stamped it (``timestamp``, the processor's clock at the append) and
when the client saw it committed on the events topic, both relative to the client's ``start``
call; prints the median of each over the runs, plus the worker's commit and decision means.

Usage: ``python -m benchmarks.latency_trace [--runs 30] [--set COMMIT_INTERVAL_MS=1] [--slowest 5]``
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.order_app import SPEC, make_input
from benchmarks.workload import worker_counters
from flowstream.client import FlowClient
from flowstream.settings import Settings


async def trace(
    runs: int, env: dict[str, str], gap: float
) -> tuple[list[list[tuple[str, float, float]]], Any]:
    prefix = harness.new_prefix("trace")
    harness.apply_topics(prefix)
    worker = harness.Worker("w1", prefix=prefix, state_root=Path(tempfile.mkdtemp()), env=env)
    client = FlowClient(
        Settings(bootstrap=harness.BOOTSTRAP, topic_prefix=prefix, group=f"{prefix}-client"),
        wait=False,
    )
    timelines: list[list[tuple[str, float, float]]] = []
    try:
        harness.wait_owned([worker], client.partitions)
        tracker = harness.RunTracker(client.settings, asyncio.get_running_loop())
        seen: dict[str, list[tuple[str, float, float]]] = {}
        tracker.listen(
            lambda e, now, p, w: seen.setdefault(e.run_id, []).append(
                (e.event.type, e.timestamp.timestamp(), time.time())
            )
        )
        for i in range(runs + 5):
            run_id = f"trace-{i}"
            future = tracker.expect(run_id)
            began = time.time()
            client.start(run_id, SPEC, make_input(i))
            await asyncio.wait_for(future, 60)
            await asyncio.sleep(gap)
            if i >= 5:
                timelines.append(
                    [
                        (kind, (ts - began) * 1000, (at - began) * 1000)
                        for kind, ts, at in seen[run_id]
                    ]
                )
        counters = worker_counters(worker)
        tracker.close()
    finally:
        client.close()
        worker.stop()
    return timelines, counters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument(
        "--gap-ms",
        type=float,
        default=0,
        help="pause between runs (0: back to back, as the workload)",
    )
    parser.add_argument(
        "--set", type=harness.setting, action="append", default=[], metavar="NAME=VALUE"
    )
    parser.add_argument(
        "--slowest", type=int, default=0, help="also print the timelines of the N slowest runs"
    )
    args = parser.parse_args()
    env = {f"FLOWSTREAM_{k.upper()}": v for k, v in args.set}
    started = harness.ensure_broker()
    try:
        timelines, counters = asyncio.run(trace(args.runs, env, args.gap_ms / 1000))
    finally:
        if started:
            harness.stop_broker()
    print(
        f"median over {len(timelines)} sequential runs {args.gap_ms:g} ms apart, ms after the "
        f"client's start call (settings: {env or 'defaults'})"
    )
    print(f"{'#':>3} {'event':<18} {'appended':>9} {'visible':>9}")
    for index in range(len(timelines[0])):
        kind = timelines[0][index][0]
        appended = statistics.median(t[index][1] for t in timelines)
        visible = statistics.median(t[index][2] for t in timelines)
        print(f"{index + 1:>3} {kind:<18} {appended:>9.1f} {visible:>9.1f}")
    print(f"worker: {counters}")
    if args.slowest:
        print(f"the {args.slowest} slowest runs (appended/visible ms per event):")
        for timeline in sorted(timelines, key=lambda t: t[-1][2])[-args.slowest :]:
            print("  " + " ".join(f"{a:.1f}/{v:.1f}" for _, a, v in timeline))


if __name__ == "__main__":
    main()
