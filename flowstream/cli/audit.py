"""``flowstream audit``: re-read runs (from the events topic or the embedded store), check their
histories and replay every decision against the current code; exit 1 if anything is wrong.

A run that is not terminal and waits on nothing is ``STALLED``: it violates the liveness
invariant (embedded, ``flowstream drive RUN`` moves it on; on Kafka its owner's scan does).

A record of the events topic that does not decode is listed: a run its key names is reported
``CORRUPT`` (its history cannot be read completely, so it is not replayed), and the other runs are
audited as usual; a bad record without a run key is listed on its own.

The audit streams: the events topic is read into a spill on local disk, each record under its
run, and the runs are then decoded, audited and reported one at a time, by run id (an embedded
store is read that way from its own keys). Memory holds one history, not the topic.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson

from flowstream import codec
from flowstream.cli.worker import runtimes_from
from flowstream.errors import SerializationError
from flowstream.model.events import EventEnvelope
from flowstream.model.spec import WorkflowSpec
from flowstream.replay.audit import RunAudit, audit_history
from flowstream.runtime import FlowRuntime, serves
from flowstream.settings import Settings
from flowstream.topology import TopologyError
from flowstream.wire import BadRecord, RecordKind, kind_of, log_bad_record

if TYPE_CHECKING:
    from flowstream.stores.rocksdb import RocksDBEventStore
    from flowstream.stores.spill import HistorySpill


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


#: One run to audit: its id, its events that decode, and its records that do not.
Item = tuple[str, list[EventEnvelope], list[BadRecord]]
#: Where a spilled record was read: partition (4 BE) and offset (8 BE), before its value.
_WHERE = 12


class TopicRead:
    """The events topic (or ``run_id``'s partition of it) read to its end into ``spill``, each
    record under its run; the records that do not decode are kept aside (they are few).

    A record is routed by its first bytes (``codec.event_head``) when its key names the same
    run, and decoded in full only when audited (``runs``); any other is decoded as it is read.
    """

    def __init__(
        self, settings: Settings, run_id: str | None, timeout: float, spill: HistorySpill
    ) -> None:
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
        self.topic = topology.name(EVENTS, settings.topic_prefix)
        self._spill = spill
        self._run_id = run_id
        #: Unreadable records of a run (by its key), and of no run.
        self.bad: dict[str, list[BadRecord]] = {}
        self.keyless: list[BadRecord] = []
        self.events = self.runs_read = self.skipped = 0
        tail = EventTail(settings, partitions, topic=self.topic)
        began = time.monotonic()
        report = _progress(began)
        try:
            for message in tail.records_to_end(timeout=600):
                taken = kind_of(message) is RecordKind.EVENT and self._take(message)
                if taken and len(spill) % 10_000 == 0:
                    report(len(spill))
        finally:
            tail.close()

    def _take(self, message: Any) -> bool:
        value: bytes = message.value() or b""
        key = message.key()
        try:
            head = codec.event_head(value)
        except SerializationError:
            head = None
        if head is not None and key is not None and bytes(key) == head[0].encode():
            run_id = head[0]
        else:
            try:
                run_id = codec.decode_event(value).run_id
            except SerializationError as exc:
                self._unreadable(BadRecord.of(message, str(exc)))
                return False
        if self._run_id is not None and run_id != self._run_id:
            return False
        where = int(message.partition()).to_bytes(4, "big") + int(message.offset()).to_bytes(
            8, "big"
        )
        self._spill.add(run_id, where + value)
        return True

    def _unreadable(self, record: BadRecord) -> None:
        log_bad_record(record)
        if self._run_id is not None and record.run_id not in (self._run_id, None):
            return
        self.skipped += 1
        if record.run_id is None:
            self.keyless.append(record)
        else:
            self.bad.setdefault(record.run_id, []).append(record)

    def runs(self) -> Iterator[Item]:
        """Each run read (with a record that decodes or not), by run id, decoded one at a time."""
        pending = sorted(self.bad)
        at = 0
        for run_id, values in self._spill.runs():
            while at < len(pending) and pending[at] < run_id:
                yield pending[at], [], self.bad[pending[at]]
                at += 1
            at += at < len(pending) and pending[at] == run_id
            history: list[EventEnvelope] = []
            for value in values:
                try:
                    history.append(codec.decode_event(value[_WHERE:]))
                except SerializationError as exc:
                    partition = int.from_bytes(value[:4], "big")
                    offset = int.from_bytes(value[4:_WHERE], "big")
                    self._unreadable(BadRecord(self.topic, partition, offset, run_id, str(exc)))
            self.events += len(history)
            self.runs_read += bool(history)
            bad = sorted(self.bad.get(run_id, ()), key=lambda r: (r.partition, r.offset))
            yield run_id, history, bad
        for run_id in pending[at:]:
            yield run_id, [], self.bad[run_id]

    def summary(self) -> str:
        skipped = f", skipped {self.skipped} record(s) that do not decode" if self.skipped else ""
        return f"read {self.events} events of {self.runs_read} run(s){skipped}"


def _progress(began: float) -> Any:
    def report(count: int) -> None:
        print(
            f"  … {count} events read ({time.monotonic() - began:.1f}s)",
            file=sys.stderr,
            flush=True,
        )

    return report


def _store_runs(store: RocksDBEventStore, run_id: str | None) -> Iterator[Item]:
    """The runs of an embedded store (or ``run_id``), read from disk one at a time."""
    if run_id is not None:
        yield run_id, store.read(run_id), []
        return
    for found, history in store.histories():
        yield found, history, []


def _audit(args: argparse.Namespace) -> int:
    runtimes = runtimes_from(args.app or "flowstream.examples.order:runtime", args.build)

    def runtime_for(spec: WorkflowSpec) -> FlowRuntime | None:
        runtime = runtimes.get(spec.runtime_build_id)
        return runtime if runtime is not None and serves(runtime, spec.name) else None

    now = datetime.now(UTC)
    verdicts = _JsonVerdicts() if args.json else _TextVerdicts()

    async def work(runs: Iterable[Item]) -> None:
        for run_id, history, unreadable in runs:
            if unreadable:
                problems = [f"cannot read {record}" for record in unreadable]
                verdicts.add(RunAudit(run_id, len(history), problems=problems, corrupt=True))
            else:
                verdicts.add(await audit_history(history, runtime_for, now=now))

    if args.data:
        from flowstream.stores.rocksdb import RocksDBEventStore

        with RocksDBEventStore(args.data, read_only=True, cache_runs=1) as store:
            asyncio.run(work(_store_runs(store, args.run_id)))
        return verdicts.finish([])
    from flowstream.stores.spill import HistorySpill

    settings = Settings.from_env(bootstrap=args.bootstrap, topic_prefix=args.topic_prefix)
    with HistorySpill() as spill:
        read = TopicRead(settings, args.run_id, args.timeout, spill)
        asyncio.run(work(read.runs()))
    print(read.summary(), file=sys.stderr)
    return verdicts.finish(read.keyless)


class _TextVerdicts:
    """One line per run as it is audited (and its problems), then the summary."""

    def __init__(self) -> None:
        self.runs = self.bad = self.stalled = 0

    def add(self, report: RunAudit) -> None:
        self.runs += 1
        if report.skipped and report.ok:
            print(f"{report.run_id}: skipped ({report.skipped})")
        elif report.ok:
            checked = report.decisions_checked
            print(f"{report.run_id}: ok ({report.events} events, {checked} decisions)")
        else:
            self.bad += 1
            self.stalled += report.stalled
            print(f"{report.run_id}: {_verdict(report)}")
            for problem in report.problems:
                print(f"    {problem}")

    def finish(self, keyless: list[BadRecord]) -> int:
        for record in keyless:
            print(f"cannot read {record}")
        summary = f"audited {self.runs} run(s): {self.runs - self.bad} ok, {self.bad} with problems"
        if self.stalled:
            summary += f" ({self.stalled} stalled: nothing will move them)"
        if keyless:
            summary += f"; {len(keyless)} record(s) of no run cannot be read"
        print(summary)
        return 1 if self.bad or keyless else 0


class _JsonVerdicts:
    """``{runs, unreadable_records}`` as ``print_json`` prints it, written one run at a time."""

    def __init__(self) -> None:
        self.runs = self.bad = 0

    def add(self, report: RunAudit) -> None:
        row = {
            "run_id": report.run_id,
            "verdict": _verdict(report) if not report.ok else "SKIPPED" if report.skipped else "OK",
            "events": report.events,
            "decisions_checked": report.decisions_checked,
            "problems": list(report.problems),
            "skipped": report.skipped or None,
        }
        opening = '{\n  "runs": [\n' if not self.runs else ",\n"
        sys.stdout.write(opening + _indented(row, "    ", first=True))
        self.runs += 1
        self.bad += not report.ok

    def finish(self, keyless: list[BadRecord]) -> int:
        unreadable = _indented([str(record) for record in keyless], "  ", first=False)
        runs = "\n  ]" if self.runs else '{\n  "runs": []'
        sys.stdout.write(f'{runs},\n  "unreadable_records": {unreadable}\n}}\n')
        sys.stdout.flush()
        return 1 if keyless or self.bad else 0


def _indented(value: object, indent: str, *, first: bool) -> str:
    """``value`` as indented JSON, each line (but the first unless ``first``) after ``indent``."""
    lines = orjson.dumps(value, option=orjson.OPT_INDENT_2).decode().split("\n")
    head = indent + lines[0] if first else lines[0]
    return "\n".join([head, *(indent + line for line in lines[1:])])


def _verdict(report: RunAudit) -> str:
    if report.corrupt:
        return "CORRUPT"
    if report.nondeterministic:
        return "NONDETERMINISTIC"
    if report.stalled and len(report.problems) == 1:
        return "STALLED"
    return "INVALID"
