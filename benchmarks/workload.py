"""The peers' workload on flowstream: prints one JSON line per result and a table.

Workload (``../shared/bench/peers/common.py``, copied: same steps, same timing, same percentile):
workflow ``order`` = validate → reserve → charge; 20 warm-up runs; (a) 200 runs one after another,
each timed from start to result: p50, p99, mean ms; (b) 1,000 runs with at most 100 in flight:
wall s, workflows/s, steps/s. Each mode does ``--runs`` runs (the peers do 2) against one
store or one set of workers, so run 2 starts with run 1's data.

Modes, durable settings only:

* ``embedded``: ``FlowEngine`` over ``RocksDBEventStore`` in this process; a run's result is
  the snapshot ``engine.start`` returns. ``--sync group`` (the store's default: appends are
  fsynced together, before any step runs and before a state is reported) or ``--sync always``
  (one fsync per append). ``--eager-steps`` starts a step before its ``step_started`` is
  fsynced (``FlowEngine(eager_steps=True)``); the state ``start`` returns is still durable.
* ``kafka``: ``--workers`` ``flowstream worker`` processes on the bench broker (replication 1,
  transactions on); runs are started with ``FlowClient.start`` and a result is the run's terminal
  event read back from the events topic (``read_committed``).

Resources are read like the peers' ``procstat.py``: peak RSS (VmHWM) and CPU seconds of each
worker process (kafka) or of this process (embedded, which is also the client there), plus the
broker's CPU seconds spent during the session.

Usage::

    python -m benchmarks.workload embedded
    python -m benchmarks.workload kafka --workers 1
    python -m benchmarks.workload kafka --workers 2 --set COMMIT_INTERVAL_MS=5
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.order_app import N_STEPS, SPEC, check_result, make_input, runtime

RunOne = Callable[[str, dict[str, Any]], Awaitable[Any]]


# -- the peers' measurement loop (common.py), unchanged ----------------------------------------


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    k = max(0, min(len(xs) - 1, int(round(p / 100.0 * len(xs) + 0.5)) - 1))  # noqa: RUF046
    return xs[k]


async def measure(run_one: RunOne, n_lat: int, n_tp: int, conc: int, warmup: int) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    for i in range(warmup):
        check_result(i, await run_one(f"warm-{tag}-{i}", make_input(i)))

    lat = []
    for i in range(n_lat):
        t0 = time.perf_counter()
        res = await run_one(f"lat-{tag}-{i}", make_input(i))
        lat.append((time.perf_counter() - t0) * 1000.0)
        check_result(i, res)

    sem = asyncio.Semaphore(conc)

    async def one(i: int) -> None:
        async with sem:
            res = await run_one(f"tp-{tag}-{i}", make_input(i))
            check_result(i, res)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n_tp)))
    wall = time.perf_counter() - t0

    return {
        "lat_n": n_lat,
        "lat_p50_ms": round(statistics.median(lat), 2),
        "lat_p99_ms": round(pct(lat, 99), 2),
        "lat_mean_ms": round(statistics.fmean(lat), 2),
        "tp_n": n_tp,
        "tp_conc": conc,
        "tp_wall_s": round(wall, 3),
        "tp_wf_per_s": round(n_tp / wall, 1),
        "tp_steps_per_s": round(n_tp * N_STEPS / wall, 1),
    }


# -- modes ---------------------------------------------------------------------------------------


async def run_embedded(args: argparse.Namespace) -> list[dict[str, Any]]:
    from flowstream.engine import FlowEngine
    from flowstream.stores.rocksdb import RocksDBEventStore

    records = []
    label = "flowstream-embedded" if args.sync == "group" else f"flowstream-embedded-{args.sync}"
    if args.eager_steps:
        label += "-eager"
    usage = harness.SelfUsage()
    context = harness.machine()
    if args.data_dir is not None:
        Path(args.data_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.data_dir) as directory:
        store = RocksDBEventStore(directory, sync=args.sync)
        engine = FlowEngine(store, runtime, eager_steps=args.eager_steps)

        async def run_one(run_id: str, inp: dict[str, Any]) -> Any:
            snapshot = await engine.start(run_id, SPEC, inp)
            return snapshot.output

        for run in range(1, args.runs + 1):
            result = await measure(run_one, args.lat, args.tp, args.conc, args.warmup)
            records.append({"peer": label, "run": str(run), **result, **context})
        store.close()
    records.append(usage.record(f"{label}-process"))
    return records


async def run_kafka(args: argparse.Namespace) -> list[dict[str, Any]]:
    from flowstream.client import FlowClient
    from flowstream.settings import Settings

    usage = harness.SelfUsage()
    started_broker = harness.ensure_broker()
    prefix = harness.new_prefix(f"wl{args.workers}")
    harness.apply_topics(prefix)
    env = {f"FLOWSTREAM_{key.upper()}": value for key, value in args.set}
    state_root = harness.scratch(f"{prefix}-", args.data_dir)
    broker = harness.broker_pid()
    broker_cpu = harness.cpu_seconds(broker) if broker else 0.0
    records: list[dict[str, Any]] = []
    client = FlowClient(
        Settings(bootstrap=harness.BOOTSTRAP, topic_prefix=prefix, group=f"{prefix}-client"),
        wait=False,
    )
    tracker = None
    workers: list[harness.Worker] = []
    try:
        for i in range(1, args.workers + 1):
            workers.append(
                harness.Worker(
                    f"w{i}",
                    prefix=prefix,
                    state_root=state_root,
                    env=env,
                    wrap=args.wrap.split() if args.wrap else None,
                )
            )
        ready_s = harness.wait_owned(workers, client.partitions)
        tracker = harness.RunTracker(client.settings, asyncio.get_running_loop())
        context = {
            **harness.machine(),
            "workers": args.workers,
            "ready_s": round(ready_s, 2),
            "settings": {k: v for k, v in env.items()},
        }

        async def run_one(run_id: str, inp: dict[str, Any]) -> Any:
            assert tracker is not None
            future = tracker.expect(run_id)
            client.start(run_id, SPEC, inp)
            kind, output = await asyncio.wait_for(future, args.timeout)
            return output if kind == "run_completed" else kind

        label = f"flowstream-kafka-x{args.workers}"
        for setting, suffix in (("EAGER_STEPS", "-eager"), ("INLINE_SYNC_STEPS", "-inline")):
            if env.get(f"FLOWSTREAM_{setting}", "").lower() in ("1", "true"):
                label += suffix
        for run in range(1, args.runs + 1):
            result = await measure(run_one, args.lat, args.tp, args.conc, args.warmup)
            records.append({"peer": label, "run": str(run), **result, **context})
        for worker in workers:
            record = harness.procstat(f"{label}-worker-{worker.name}", [worker.pid])
            records.append({**record, **worker_counters(worker)})
        if broker:
            records.append(
                {
                    "label": f"{label}-broker (CPU during this session only)",
                    "pids": [broker],
                    "peak_rss_mib_sum": harness.procstat("broker", [broker])["rss_now_mib_sum"],
                    "cpu_s": round(harness.cpu_seconds(broker) - broker_cpu, 2),
                }
            )
        records.append(usage.record(f"{label}-client-process"))
    finally:
        for worker in workers:
            worker.stop()
        if tracker is not None:
            tracker.close()
        client.close()
        if not args.data_dir:
            harness.remove_pass(prefix, state_root)
        if started_broker and not args.keep_broker:
            harness.stop_broker()
    return records


def worker_counters(worker: harness.Worker) -> dict[str, Any]:
    """Transactions, mean commit and decision time, events appended: from the worker's metrics."""
    m = worker.metrics()
    commits = m.get("flowstream_transaction_seconds_count", 0.0)
    decisions = m.get("flowstream_decision_seconds_count", 0.0)
    return {
        "transactions": int(commits),
        "mean_commit_ms": round(
            m.get("flowstream_transaction_seconds_sum", 0.0) / max(commits, 1) * 1000, 2
        ),
        "decisions": int(decisions),
        "mean_decision_ms": round(
            m.get("flowstream_decision_seconds_sum", 0.0) / max(decisions, 1) * 1000, 3
        ),
        "events_appended": int(m.get("flowstream_events_appended_total", 0.0)),
        "aborts": int(m.get("flowstream_transaction_aborts_total", 0.0)),
    }


# -- output --------------------------------------------------------------------------------------


def table(records: list[dict[str, Any]]) -> str:
    lines = [
        "| engine | run | seq p50 ms | seq p99 ms | seq mean ms | tput wf/s | tput steps/s "
        "| tput wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        if "lat_p50_ms" in r:
            lines.append(
                f"| {r['peer']} | {r['run']} | {r['lat_p50_ms']} | {r['lat_p99_ms']} | "
                f"{r['lat_mean_ms']} | {r['tp_wf_per_s']} | {r['tp_steps_per_s']} | "
                f"{r['tp_wall_s']} |"
            )
    lines += ["", "| process | peak RSS MiB | CPU s |", "|---|---|---|"]
    for r in records:
        if "cpu_s" in r:
            counters = (
                f" {r['transactions']} transactions, mean commit {r['mean_commit_ms']} ms,"
                f" mean decision {r['mean_decision_ms']} ms"
                if "transactions" in r
                else ""
            )
            lines.append(
                f"| {r['label']} ({len(r['pids'])} procs) | {r['peak_rss_mib_sum']} | "
                f"{r['cpu_s']} |{counters}"
            )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["embedded", "kafka"])
    parser.add_argument("--workers", type=int, default=1, help="kafka: processor processes")
    parser.add_argument(
        "--sync",
        choices=["group", "always"],
        default="group",
        help="embedded: RocksDB durability; group = one fsync shared by the appends waiting "
        "together (the store's default), always = one fsync per append",
    )
    parser.add_argument(
        "--eager-steps",
        action="store_true",
        help="embedded: start a step without waiting for the fsync of its step_started",
    )
    parser.add_argument("--lat", type=int, default=200)
    parser.add_argument("--tp", type=int, default=1000)
    parser.add_argument("--conc", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=120, help="seconds per run")
    parser.add_argument(
        "--set",
        type=harness.setting,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="kafka: a worker setting, passed as FLOWSTREAM_NAME (repeatable)",
    )
    parser.add_argument("--wrap", default="", help="kafka: prefix the worker command (py-spy)")
    parser.add_argument("--data-dir", default=None, help="where stores and state go (tmp)")
    parser.add_argument("--keep-broker", action="store_true")
    parser.add_argument("--out", default=None, help="append the JSON lines here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    mode = run_embedded if args.mode == "embedded" else run_kafka
    records = asyncio.run(mode(args))
    for record in records:
        harness.emit(record, args.out)
    print()
    print(table(records))
    return records


if __name__ == "__main__":
    main()
