"""What a partition count costs on one worker, and what moving between counts costs.

For each count (``--counts 8,32``) on topics of a topology that declares it:

* **empty start**: a worker with an empty state directory on empty topics, from its spawn until
  it owns every partition (fence, restore, activation of each): the floor of any failover;
* **the workload** (``workload.py kafka --workers 1``'s measure: 200 sequential runs, 1,000 runs
  100 in flight): latency, throughput, the worker's transactions and mean commit time (every
  transaction carries the positions of every command partition it owns: 5 × count of them);
* **restore**: then a second worker with an empty state directory on the filled topics, until
  it owns every partition, minus the empty start: the rebuild of a lost disk, per event.

Then the filled topics of the first count are moved to the last count
(``flowstream.repartition``: copy, carry, audit), timed per phase.

Usage::

    python -m benchmarks.partition_count [--counts 8,32] [--lat 200] [--tp 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import harness, restore, workload
from flowstream.topology import default_topology_path


def topology_file(directory: Path, partitions: int) -> Path:
    text = default_topology_path().read_text()
    path = directory / f"topics-{partitions}.toml"
    path.write_text(re.sub(r"(?m)^partitions = \d+$", f"partitions = {partitions}", text))
    return path


def start_time(prefix: str, partitions: int, name: str) -> float:
    """Seconds from spawning a worker with an empty state directory until it owns every
    partition of ``prefix``."""
    return restore.fresh_start(prefix, name, partitions)[0]


def measure_count(partitions: int, directory: Path, args: argparse.Namespace) -> dict[str, Any]:
    os.environ["FLOWSTREAM_TOPOLOGY"] = str(topology_file(directory, partitions))
    empty = harness.new_prefix(f"pc{partitions}-empty")
    harness.apply_topics(empty)
    empty_s = min(start_time(empty, partitions, f"empty{i}") for i in range(2))
    prefix = harness.new_prefix(f"pc{partitions}")
    chosen = iter([prefix])
    original = harness.new_prefix
    harness.new_prefix = lambda kind: next(chosen)  # type: ignore[assignment]
    try:
        records = asyncio.run(
            workload.run_kafka(
                workload.parse_args(
                    [
                        "kafka",
                        "--workers",
                        "1",
                        "--runs",
                        "1",
                        "--lat",
                        str(args.lat),
                        "--tp",
                        str(args.tp),
                        "--keep-broker",
                    ]
                )
            )
        )
    finally:
        harness.new_prefix = original
    run = next(r for r in records if "lat_p50_ms" in r)
    counters = next(r for r in records if "mean_commit_ms" in r)
    filled_s = min(start_time(prefix, partitions, f"full{i}") for i in range(2))
    events = counters["events_appended"]
    record = {
        "figure": "partition-count",
        "partitions": partitions,
        "empty_start_s": round(empty_s, 2),
        "lat_p50_ms": run["lat_p50_ms"],
        "lat_p99_ms": run["lat_p99_ms"],
        "tp_wf_per_s": run["tp_wf_per_s"],
        "transactions": counters["transactions"],
        "mean_commit_ms": counters["mean_commit_ms"],
        "worker_cpu_s": counters["cpu_s"],
        "worker_peak_rss_mib": counters["peak_rss_mib_sum"],
        "events": events,
        "full_start_s": round(filled_s, 2),
        "restore_s": round(filled_s - empty_s, 2),
        "prefix": prefix,
        **harness.machine(),
    }
    print(
        f"{partitions} partitions: empty start {empty_s:.2f} s; p50 {run['lat_p50_ms']} ms, "
        f"p99 {run['lat_p99_ms']} ms, {run['tp_wf_per_s']} wf/s; {counters['transactions']} "
        f"transactions, mean commit {counters['mean_commit_ms']} ms, worker peak RSS "
        f"{counters['peak_rss_mib_sum']} MiB; restore of {events} events "
        f"{filled_s - empty_s:.2f} s (start {filled_s:.2f} s)",
        flush=True,
    )
    return record


def measure_move(source: dict[str, Any], partitions: int, directory: Path) -> dict[str, Any]:
    from flowstream.repartition.audit import audit_move
    from flowstream.repartition.move import run_move
    from flowstream.repartition.plan import MovePlan
    from flowstream.topology import load_topology

    os.environ["FLOWSTREAM_TOPOLOGY"] = str(topology_file(directory, source["partitions"]))
    target = f"{source['prefix']}-to{partitions}"
    plan = MovePlan.prepare(
        harness.BOOTSTRAP,
        load_topology(),
        source=source["prefix"],
        target=target,
        group=f"{source['prefix']}-group",
        partitions=partitions,
        replication_factor=1,
    )
    began = time.monotonic()
    report = run_move(plan, stop=lambda: False, forward=False, say=print)
    moved_s = time.monotonic() - began
    began = time.monotonic()
    audit = audit_move(plan)
    audit_s = time.monotonic() - began
    for line in audit.lines():
        print(line)
    record = {
        "figure": "repartition",
        "from": source["partitions"],
        "to": partitions,
        "records_copied": report.copied,
        "copy_s": round(report.copy_seconds, 2),
        "move_s": round(moved_s, 2),
        "audit_s": round(audit_s, 2),
        "audit_ok": audit.ok,
        "runs": audit.runs,
        **harness.machine(),
    }
    print(
        f"moved {report.copied} records {source['partitions']} -> {partitions} in {moved_s:.2f} s "
        f"(copy {report.copy_seconds:.2f} s); audit {audit_s:.2f} s: "
        f"{'ok' if audit.ok else 'FAILED'}"
    )
    return record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", default="8,32")
    parser.add_argument("--lat", type=int, default=200)
    parser.add_argument("--tp", type=int, default=1000)
    parser.add_argument("--out", default=None, help="append the JSON lines here")
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.counts.split(",")]
    started = harness.ensure_broker()
    try:
        with tempfile.TemporaryDirectory() as directory:
            records = [measure_count(n, Path(directory), args) for n in counts]
            for record in records:
                harness.emit(record, args.out)
            if len(counts) > 1:
                harness.emit(measure_move(records[0], counts[-1], Path(directory)), args.out)
    finally:
        if started:
            harness.stop_broker()


if __name__ == "__main__":
    main()
