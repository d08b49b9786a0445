"""The run index at scale (issues 19 and 21): how fast it is kept, built and queried.

Embedded (``--runs N``): N runs of ``benchmarks.scale_app`` go through the engine on a fresh
RocksDB store, 90% ``scale-park`` (suspended after one step, waiting for a signal) and 10%
``scale-one`` (completed), ``--concurrency`` at a time, so each append keeps the index in its
write. Then, on the store reopened: the time to open it, and the median of ``--repeat`` calls of
``counts()``, ``summary()``, list-by-status (the first page of 50 suspended runs, a page deep in
the listing by cursor, completed runs, a workflow, a workflow and status), ``get()`` and
``next_wakeup()``; one ``list_open_suspensions()`` (it returns every open suspension, so it is
linear in them). Last, the index is deleted and the store opened again, which builds it from
every history (the rate of that build; ``--no-build`` skips it).

Kafka (``--kafka-runs N``, on the bench broker or ``--bootstrap``): the same runs' histories are
made on memory stores a thousand at a time and produced to a fresh events topic, then a
``KafkaRunIndex`` builds its directory from offset 0 (events/s), and the queries are timed on it.

``--overhead N`` first times N runs created with the index kept and N without (best of 3), the
cost of keeping it.

``--bulk N`` writes N runs straight into a store (template histories under new ids, with the
index keys the append path computes) and times the same queries on it: the figures at 1,000,000
runs, which the engine cannot create on this machine in a session.

One JSON line per phase goes to stdout and to ``--out``, with the machine's load.

Usage: ``python -m benchmarks.run_index --runs 100000 [--bulk 1000000] [--kafka-runs 100000]``
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import shutil
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.scale_app import ONE, PARK, runtime
from benchmarks.scale_embedded import bulk_fill
from flowstream import codec
from flowstream.engine import FlowEngine
from flowstream.index import KafkaRunIndex, RunQuery, RunTable, row_of
from flowstream.index.table import BUILT_KEY
from flowstream.kafka import clients
from flowstream.model.snapshot import RunStatus
from flowstream.partitioning import partition_for
from flowstream.replay.state import RunState
from flowstream.settings import Settings
from flowstream.stores.memory import MemoryEventStore
from flowstream.stores.rocksdb import RocksDBEventStore
from flowstream.topology import EVENTS, load_topology

SUSPENDED = frozenset({RunStatus.SUSPENDED})


def _rss_mib() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _ms(work: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        work()
        times.append((time.perf_counter() - began) * 1000)
    return round(statistics.median(times), 3)


def _spec(n: int) -> Any:
    return ONE if n % 10 == 0 else PARK


async def _create(engine: FlowEngine, runs: int, concurrency: int, start: int = 0) -> None:
    for first in range(start, start + runs, concurrency):
        last = min(first + concurrency, start + runs)
        await asyncio.gather(
            *(engine.start(f"run-{n:07d}", _spec(n), n) for n in range(first, last))
        )


def _query_times(index: RunTable | KafkaRunIndex, repeat: int) -> dict[str, Any]:
    first = index.query(RunQuery(status=SUSPENDED))
    cursor = first.next_cursor
    for _ in range(99):  # walk to the 100th page
        cursor = index.query(RunQuery(status=SUSPENDED, cursor=cursor)).next_cursor
    deep = RunQuery(status=SUSPENDED, cursor=cursor)
    some = first.rows[0].run_id
    return {
        "counts_ms": _ms(index.counts, repeat),
        "list_suspended_first_page_ms": _ms(
            lambda: index.query(RunQuery(status=SUSPENDED)), repeat
        ),
        "list_suspended_page_100_ms": _ms(lambda: index.query(deep), repeat),
        "list_completed_ms": _ms(
            lambda: index.query(RunQuery(status=frozenset({RunStatus.COMPLETED}))), repeat
        ),
        "list_workflow_ms": _ms(
            lambda: index.query(RunQuery(workflow=frozenset({ONE.name}))), repeat
        ),
        "list_workflow_and_status_ms": _ms(
            lambda: index.query(RunQuery(workflow=frozenset({PARK.name}), status=SUSPENDED)),
            repeat,
        ),
        "list_limit_1000_ms": _ms(lambda: index.query(RunQuery(limit=1000)), repeat),
        "get_ms": _ms(lambda: index.get(some), repeat),
    }


class _Unindexed(RocksDBEventStore):
    keeps_run_index = False


def overhead(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Create rate with and without the index kept, ``--overhead`` runs each, in turn."""
    rates: dict[str, list[float]] = {"with_index": [], "without_index": []}
    for attempt in range(3):
        for name, kind in (("with_index", RocksDBEventStore), ("without_index", _Unindexed)):
            path = root / f"overhead-{name}-{attempt}"
            store = kind(path)
            began = time.perf_counter()
            asyncio.run(_create(FlowEngine(store, runtime), args.overhead, args.concurrency))
            rates[name].append(args.overhead / (time.perf_counter() - began))
            store.close()
            shutil.rmtree(path)
    best = {name: round(max(values)) for name, values in rates.items()}
    record = {
        "phase": "embedded create, index kept or not (best of 3)",
        "runs": args.overhead,
        "runs_per_s": best,
        "index_cost_pct": round(100 * (best["without_index"] / best["with_index"] - 1), 1),
        **harness.machine(),
    }
    print(record, flush=True)
    return record


def embedded(args: argparse.Namespace, root: Path) -> list[dict[str, Any]]:
    path = root / "store"
    records: list[dict[str, Any]] = []
    store = RocksDBEventStore(path)
    engine = FlowEngine(store, runtime)
    began = time.perf_counter()
    asyncio.run(_create(engine, args.runs, args.concurrency))
    created = time.perf_counter() - began
    store.close()
    records.append(
        {
            "phase": "embedded create",
            "runs": args.runs,
            "seconds": round(created, 1),
            "runs_per_s": round(args.runs / created),
            "rss_mib": _rss_mib(),
            "disk_mib": round(sum(f.stat().st_size for f in path.iterdir()) / 2**20, 1),
            **harness.machine(),
        }
    )
    print(records[-1], flush=True)

    began = time.perf_counter()
    store = RocksDBEventStore(path)
    opened = time.perf_counter() - began
    engine = FlowEngine(store, runtime)
    index = engine.run_index()
    figures = _query_times(index, args.repeat)
    figures["summary_ms"] = _ms(engine.summary, args.repeat)
    figures["next_wakeup_ms"] = _ms(store.next_wakeup, args.repeat)
    began = time.perf_counter()
    suspensions = len(engine.list_open_suspensions())
    figures["list_open_suspensions_s"] = round(time.perf_counter() - began, 2)
    figures["open_suspensions"] = suspensions
    summary = engine.summary()
    store.close()
    records.append(
        {
            "phase": "embedded queries",
            "runs": args.runs,
            "open_s": round(opened, 3),
            "by_status": {s.value: n for s, n in summary.by_status.items()},
            **figures,
            "rss_mib": _rss_mib(),
            **harness.machine(),
        }
    )
    print(records[-1], flush=True)
    if args.no_build:
        return records

    from rocksdict import Options, Rdict

    db = Rdict(str(path), options=Options(raw_mode=True))
    db.delete_range(b"v", b"w")
    del db[BUILT_KEY]
    db.close()
    began = time.perf_counter()
    store = RocksDBEventStore(path)
    built = time.perf_counter() - began
    counts = store.run_index().counts()
    store.close()
    assert sum(counts.values()) == args.runs, counts
    records.append(
        {
            "phase": "embedded index build on open",
            "runs": args.runs,
            "seconds": round(built, 1),
            "seconds_per_100k_runs": round(built * 100_000 / args.runs, 1),
            "runs_per_s": round(args.runs / built),
            "rss_mib": _rss_mib(),
            **harness.machine(),
        }
    )
    print(records[-1], flush=True)
    return records


def bulk(args: argparse.Namespace, root: Path) -> list[dict[str, Any]]:
    """``--bulk N``: N runs written straight into a store, for the queries' figures at a size
    the engine cannot create here in the time (``scale_embedded.bulk_fill``: each run's history
    is a copy of a template run's, made by the engine, a suspended ``scale-park`` run or every
    tenth a completed ``scale-one``, under its own id and event ids, with the index keys that
    ``RunTable.change``, the function every append calls, gives for its state)."""
    path = root / "bulk"
    store = RocksDBEventStore(path)
    began = time.perf_counter()
    bulk_fill(store, ((f"run-{n:07d}", _spec(n)) for n in range(args.bulk)))
    store.close()
    loaded = time.perf_counter() - began
    began = time.perf_counter()
    store = RocksDBEventStore(path)
    opened = time.perf_counter() - began
    engine = FlowEngine(store, runtime)
    sample = RunState.from_history(store.read("run-0000001"))
    assert engine.run_index().get("run-0000001") == row_of(sample)
    figures = _query_times(engine.run_index(), args.repeat)
    figures["summary_ms"] = _ms(engine.summary, args.repeat)
    figures["next_wakeup_ms"] = _ms(store.next_wakeup, args.repeat)
    began = time.perf_counter()
    figures["open_suspensions"] = len(engine.list_open_suspensions())
    figures["list_open_suspensions_s"] = round(time.perf_counter() - began, 2)
    summary = engine.summary()
    store.close()
    record = {
        "phase": "bulk-loaded store: queries",
        "runs": args.bulk,
        "load_s": round(loaded, 1),
        "disk_mib": round(sum(f.stat().st_size for f in path.iterdir()) / 2**20, 1),
        "open_s": round(opened, 3),
        "by_status": {s.value: n for s, n in summary.by_status.items()},
        **figures,
        "rss_mib": _rss_mib(),
        **harness.machine(),
    }
    print(record, flush=True)
    return [record]


def _produce_histories(bootstrap: str, topic: str, runs: int) -> int:
    """Make the runs' histories on memory stores and produce their events to ``topic``."""
    partitions = load_topology().run_partitions
    producer = clients.new_producer(bootstrap, {"linger.ms": 20, "batch.size": 1_000_000})
    sent = 0
    for first in range(0, runs, 1000):
        store = MemoryEventStore()
        engine = FlowEngine(store, runtime)
        asyncio.run(_create(engine, min(1000, runs - first), 1000, start=first))
        for run_id in store.list_runs():
            partition = partition_for(run_id, partitions)
            for envelope in store.read(run_id):
                while True:
                    try:
                        producer.produce(
                            topic,
                            codec.encode_event(envelope),
                            run_id.encode(),
                            partition=partition,
                        )
                        break
                    except BufferError:
                        producer.poll(0.05)
                sent += 1
        producer.poll(0)
    producer.flush(120)
    return sent


def kafka(args: argparse.Namespace, root: Path) -> list[dict[str, Any]]:
    bootstrap = args.bootstrap or harness.BOOTSTRAP
    started = False if args.bootstrap else harness.ensure_broker()
    prefix = harness.new_prefix("run-index")
    try:
        harness.apply_topics(prefix, bootstrap)
        topic = load_topology().name(EVENTS, prefix)
        began = time.perf_counter()
        events = _produce_histories(bootstrap, topic, args.kafka_runs)
        produced = time.perf_counter() - began
        settings = Settings(bootstrap=bootstrap, topic_prefix=prefix)
        began = time.perf_counter()
        index = KafkaRunIndex(settings, root / "kafka-index", refresh=None, timeout=120)
        taken = index.catch_up(timeout=120)
        built = time.perf_counter() - began
        figures = _query_times(index, args.repeat)
        figures["catch_up_nothing_new_ms"] = _ms(index.catch_up, args.repeat)
        counts = index.counts()
        index.close()
        record = {
            "phase": "kafka index build from offset 0",
            "runs": args.kafka_runs,
            "events": taken,
            "produce_s": round(produced, 1),
            "produced_events": events,
            "build_s": round(built, 1),
            "events_per_s": round(taken / built),
            "counts": {k: v for k, v in counts.items() if v},
            **figures,
            "rss_mib": _rss_mib(),
            **harness.machine(),
        }
        print(record, flush=True)
        return [record]
    finally:
        if started:
            harness.stop_broker()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000, help="embedded runs (0: skip)")
    parser.add_argument("--kafka-runs", type=int, default=0, help="runs on Kafka (0: skip)")
    parser.add_argument(
        "--bulk", type=int, default=0, help="runs to bulk-load for the query figures (0: skip)"
    )
    parser.add_argument("--bootstrap", help="a broker to use instead of the bench broker")
    parser.add_argument(
        "--overhead", type=int, default=0, help="runs to time with and without the index (0: skip)"
    )
    parser.add_argument("--concurrency", type=int, default=250)
    parser.add_argument(
        "--no-build", action="store_true", help="skip building the index of an unindexed store"
    )
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--dir", type=Path, help="where the stores go (default: a temp dir)")
    parser.add_argument("--out", default=f"benchmarks/results/{datetime.now(UTC):%Y-%m-%d}.jsonl")
    args = parser.parse_args()
    root = harness.scratch("run-index-", args.dir)
    try:
        records: list[dict[str, Any]] = []
        if args.overhead:
            records.append(overhead(args, root))
        if args.runs:
            records += embedded(args, root)
        if args.bulk:
            records += bulk(args, root)
        if args.kafka_runs:
            records += kafka(args, root)
        for record in records:
            harness.emit(record, args.out)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
