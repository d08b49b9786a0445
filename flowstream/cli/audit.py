"""``flowstream audit``: re-read runs (from the events topic or the embedded store), check their
histories and replay every decision against the current code; exit 1 if anything is wrong.

A run that is not terminal and waits on nothing is ``STALLED``: it violates the liveness
invariant (embedded, ``flowstream drive RUN`` moves it on; on Kafka its owner's scan does).

A record of the events topic that does not decode is listed: a run its key names is reported
``CORRUPT`` (its history cannot be read completely, so it is not replayed), and the other runs are
audited as usual; a bad record without a run key is listed on its own.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from flowstream.cli.options import print_json
from flowstream.cli.worker import runtimes_from
from flowstream.model.events import EventEnvelope
from flowstream.model.spec import WorkflowSpec
from flowstream.replay.audit import RunAudit, audit_history
from flowstream.runtime import FlowRuntime, serves
from flowstream.settings import Settings
from flowstream.topology import TopologyError
from flowstream.wire import BadRecord


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "audit", help="check histories and replay their decisions against the current code"
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--bootstrap", help="read the Kafka events topic (FLOWSTREAM_BOOTSTRAP)")
    source.add_argument("--data", help="read an embedded store directory instead")
    parser.add_argument("--prefix", dest="topic_prefix", help="topic prefix")
    parser.add_argument("--run", dest="run_id", help="audit only this run")
    parser.add_argument("--app", default=None, help="module:attribute of the unpinned runtime")
    parser.add_argument("--build", action="append", default=[], metavar="BUILD=module:attr")
    parser.add_argument(
        "--json",
        action="store_true",
        help="the verdicts as one JSON object {runs, unreadable_records}",
    )
    parser.add_argument(
        "--timeout", type=float, default=10.0, help="seconds to wait for a broker (default 10)"
    )
    parser.set_defaults(handler=_audit)


def _kafka_histories(
    settings: Settings, run_id: str | None, timeout: float
) -> tuple[dict[str, list[EventEnvelope]], list[BadRecord]]:
    """Every run's events (or ``run_id``'s) and the records that did not decode (those of
    ``run_id`` and those of no run, when one run is asked for)."""
    from flowstream.client import EventTail
    from flowstream.kafka.clients import probe_brokers
    from flowstream.partitioning import partition_for
    from flowstream.topology import EVENTS, load_topology

    topology = load_topology()
    if probe_brokers(settings.bootstrap, timeout) is None:
        raise TopologyError(
            f"no Kafka broker answered at {settings.bootstrap} within {timeout:g} s (set "
            "--bootstrap or FLOWSTREAM_BOOTSTRAP; --data DIR audits an embedded store)"
        )
    partitions = list(range(topology.run_partitions))
    if run_id is not None:
        partitions = [partition_for(run_id, topology.run_partitions)]
    tail = EventTail(settings, partitions, topic=topology.name(EVENTS, settings.topic_prefix))
    histories: dict[str, list[EventEnvelope]] = {}
    read = 0
    began = time.monotonic()
    try:
        for envelope in tail.read_to_end(timeout=600, progress=_progress(began)):
            read += 1
            if run_id is None or envelope.run_id == run_id:
                histories.setdefault(envelope.run_id, []).append(envelope)
    finally:
        tail.close()
    bad = [b for b in tail.bad_records if run_id is None or b.run_id in (run_id, None)]
    skipped = f", skipped {len(bad)} record(s) that do not decode" if bad else ""
    print(f"read {read} events of {len(histories)} run(s){skipped}", file=sys.stderr)
    return histories, bad


def _progress(began: float) -> Any:
    def report(count: int) -> None:
        print(
            f"  … {count} events read ({time.monotonic() - began:.1f}s)",
            file=sys.stderr,
            flush=True,
        )

    return report


def _store_histories(path: str, run_id: str | None) -> dict[str, list[EventEnvelope]]:
    from flowstream.stores.rocksdb import RocksDBEventStore

    with RocksDBEventStore(path, read_only=True) as store:
        runs: Iterable[str] = [run_id] if run_id else store.list_runs()
        return {r: store.read(r) for r in runs}


def _audit(args: argparse.Namespace) -> int:
    runtimes = runtimes_from(args.app or "flowstream.examples.order:runtime", args.build)

    def runtime_for(spec: WorkflowSpec) -> FlowRuntime | None:
        runtime = runtimes.get(spec.runtime_build_id)
        return runtime if runtime is not None and serves(runtime, spec.name) else None

    unreadable: list[BadRecord] = []
    if args.data:
        histories = _store_histories(args.data, args.run_id)
    else:
        settings = Settings.from_env(bootstrap=args.bootstrap, topic_prefix=args.topic_prefix)
        histories, unreadable = _kafka_histories(settings, args.run_id, args.timeout)
    corrupt: dict[str, list[BadRecord]] = {}
    for record in unreadable:
        if record.run_id is not None:
            corrupt.setdefault(record.run_id, []).append(record)
    keyless = [record for record in unreadable if record.run_id is None]

    now = datetime.now(UTC)

    async def work() -> list[RunAudit]:
        reports = []
        for run_id in sorted(histories.keys() | corrupt.keys()):
            history = histories.get(run_id, [])
            if run_id in corrupt:
                problems = [f"cannot read {record}" for record in corrupt[run_id]]
                reports.append(RunAudit(run_id, len(history), problems=problems, corrupt=True))
            else:
                reports.append(await audit_history(history, runtime_for, now=now))
        return reports

    reports = asyncio.run(work())
    if args.json:
        return _print_json(reports, keyless)
    bad = stalled = 0
    for report in reports:
        if report.skipped and report.ok:
            print(f"{report.run_id}: skipped ({report.skipped})")
        elif report.ok:
            checked = report.decisions_checked
            print(f"{report.run_id}: ok ({report.events} events, {checked} decisions)")
        else:
            bad += 1
            stalled += report.stalled
            print(f"{report.run_id}: {_verdict(report)}")
            for problem in report.problems:
                print(f"    {problem}")
    for record in keyless:
        print(f"cannot read {record}")
    summary = f"audited {len(reports)} run(s): {len(reports) - bad} ok, {bad} with problems"
    if stalled:
        summary += f" ({stalled} stalled: nothing will move them)"
    if keyless:
        summary += f"; {len(keyless)} record(s) of no run cannot be read"
    print(summary)
    return 1 if bad or keyless else 0


def _print_json(reports: list[RunAudit], keyless: list[BadRecord]) -> int:
    rows = [
        {
            "run_id": report.run_id,
            "verdict": _verdict(report) if not report.ok else "SKIPPED" if report.skipped else "OK",
            "events": report.events,
            "decisions_checked": report.decisions_checked,
            "problems": list(report.problems),
            "skipped": report.skipped or None,
        }
        for report in reports
    ]
    print_json({"runs": rows, "unreadable_records": [str(record) for record in keyless]})
    return 1 if keyless or any(not report.ok for report in reports) else 0


def _verdict(report: RunAudit) -> str:
    if report.corrupt:
        return "CORRUPT"
    if report.nondeterministic:
        return "NONDETERMINISTIC"
    if report.stalled and len(report.problems) == 1:
        return "STALLED"
    return "INVALID"
