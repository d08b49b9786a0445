"""``flowstream audit`` streams (issue 19): it checks each run as its events are read back, so
its memory is one history, not the topic, and its report is the one it always printed.

On the broker: a topic of generated order runs (finished ones and ones suspended on their
signal, produced straight to the events topic) is audited under ``tracemalloc``; the peak of the
Python heap stays a small part of what the topic's histories take decoded. The ``--json`` report,
written a run at a time, is byte for byte what ``print_json`` prints of the whole.
"""

from __future__ import annotations

import tracemalloc
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import orjson
import pytest

from flowstream import codec
from flowstream.cli import main
from flowstream.cli.audit import _JsonVerdicts
from flowstream.cli.options import print_json
from flowstream.kafka import clients
from flowstream.model.events import EventEnvelope
from flowstream.partitioning import partition_for
from flowstream.replay.audit import RunAudit
from flowstream.topology import EVENTS, load_topology
from flowstream.wire import BadRecord
from tests.conftest import create_topic
from tests.replay.test_audit import recorded_order_history

RUNS = 200


@dataclass(frozen=True)
class Topic:
    bootstrap: str
    prefix: str
    runs: list[str]
    #: The Python heap the topic's histories take, decoded and held together.
    held_bytes: int


def _histories(runs: list[str]) -> Iterator[list[EventEnvelope]]:
    """Each run's history: every other run finished, the others suspended on their signal."""
    done = recorded_order_history()
    waiting = next(i for i, e in enumerate(done) if e.event.type == "signal_wait_created")
    for index, run_id in enumerate(runs):
        template = done if index % 2 else done[: waiting + 1]
        yield [e.model_copy(update={"run_id": run_id}) for e in template]


@pytest.fixture(scope="module")
def topic(kafka_bootstrap: str) -> Topic:
    prefix = f"t-audit-stream-{uuid.uuid4().hex[:8]}"
    spec = load_topology().topic(EVENTS)
    name = spec.name(prefix)
    create_topic(kafka_bootstrap, name, partitions=spec.partitions, config=spec.configs(1))
    runs = [f"order-{i:04d}" for i in range(RUNS)]
    producer = clients.new_producer(kafka_bootstrap, {"linger.ms": 20})
    for history in _histories(runs):
        run_id = history[0].run_id
        for envelope in history:
            producer.produce(
                name,
                value=codec.encode_event(envelope),
                key=run_id.encode(),
                partition=partition_for(run_id, spec.partitions),
            )
        producer.poll(0)
    assert producer.flush(30) == 0
    encoded = [[codec.encode_event(e) for e in h] for h in _histories(runs[: RUNS // 10])]
    tracemalloc.start()
    try:  # a tenth of the runs, decoded and held
        held = [[codec.decode_event(data) for data in h] for h in encoded]
        held_bytes = tracemalloc.get_traced_memory()[0] * 10
        del held
    finally:
        tracemalloc.stop()
    return Topic(kafka_bootstrap, prefix, runs, held_bytes)


@pytest.mark.kafka
def test_the_audit_of_a_topic_holds_one_history_not_the_topic(
    topic: Topic, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["audit", "--bootstrap", topic.bootstrap, "--prefix", topic.prefix]
    tracemalloc.start()
    try:
        assert main(common) == 0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == f"audited {RUNS} run(s): {RUNS} ok, 0 with problems"
    assert [line.split(":")[0] for line in out[:-1]] == topic.runs  # by run id, each once
    assert all(": ok (" in line for line in out[:-1])
    # Holding the topic (as the audit did before) takes at least its decoded histories.
    assert peak < topic.held_bytes / 3, (peak, topic.held_bytes)


@pytest.mark.kafka
def test_the_json_report_of_a_topic_lists_every_run(
    topic: Topic, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["audit", "--bootstrap", topic.bootstrap, "--prefix", topic.prefix]
    assert main([*common, "--json", "--run", topic.runs[1]]) == 0
    report = orjson.loads(capsys.readouterr().out)
    assert [row["run_id"] for row in report["runs"]] == [topic.runs[1]]
    assert report["runs"][0]["verdict"] == "OK" and report["unreadable_records"] == []


def _reports() -> list[RunAudit]:
    return [
        RunAudit("a", 6, decisions_checked=3),
        RunAudit("b", 2, skipped="no runtime given serves workflow x of build <unpinned>"),
        RunAudit("c", 4, problems=["at sequence 3: the decision differs", "two"]),
        RunAudit("d", 0, problems=["cannot read t[0]@4 (run d): bad"], corrupt=True),
    ]


@pytest.mark.parametrize("count", [0, 1, 4])
@pytest.mark.parametrize("keyless", [0, 2])
def test_the_streamed_json_report_is_what_print_json_prints(
    count: int, keyless: int, capsys: pytest.CaptureFixture[str]
) -> None:
    reports = _reports()[:count]
    records = [BadRecord("t", 1, n, None, f"bad {n}") for n in range(keyless)]
    verdicts = _JsonVerdicts()
    for report in reports:
        verdicts.add(report)
    code = verdicts.finish(records)
    streamed = capsys.readouterr().out
    rows = [
        {
            "run_id": r.run_id,
            "verdict": "OK" if r.ok and not r.skipped else "SKIPPED" if r.ok else "X",
            "events": r.events,
            "decisions_checked": r.decisions_checked,
            "problems": r.problems,
            "skipped": r.skipped,
        }
        for r in reports
    ]
    for row, report in zip(rows, reports, strict=True):
        if not report.ok:
            row["verdict"] = "CORRUPT" if report.corrupt else "INVALID"
    print_json({"runs": rows, "unreadable_records": [str(r) for r in records]})
    assert streamed == capsys.readouterr().out
    assert code == (1 if keyless or count > 2 else 0)
