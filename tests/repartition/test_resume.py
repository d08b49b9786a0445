"""A move's checks, and a move that stops (interrupted, or crashed inside a transaction) and is
run again, on the real broker, over topics filled by transactions (some aborted) without any
processor: every committed record is copied once, none of an aborted transaction, no anchor."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from flowstream import wire
from flowstream.cli import main
from flowstream.kafka import clients, topics
from flowstream.partitioning import partition_for
from flowstream.repartition import pump as pump_module
from flowstream.repartition.audit import audit_move
from flowstream.repartition.move import run_move
from flowstream.repartition.plan import MoveError, MovePlan
from flowstream.topology import load_topology

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]

RUNS = [f"r-{i}" for i in range(50)]
PER_RUN = 8
COMMANDS = 10
#: One outcome record per transaction of 50 events.
OUTCOMES = len(RUNS) * PER_RUN // 50


def _inbox(run_id: str, index: int) -> tuple[bytes, list[tuple[str, bytes]]]:
    value = wire.inbox_value(run_id, f"i-{index}", b"parked command %d" % index)
    return value, [(wire.RECORD_HEADER, wire.RecordKind.INBOX.value.encode())]


def _park(producer: Any, topic: str, run_id: str, index: int, partitions: int = 8) -> None:
    """Produce the inbox record ``index`` of ``run_id`` to the partition of its key."""
    value, headers = _inbox(run_id, index)
    producer.produce(
        topic,
        value=value,
        key=run_id.encode(),
        partition=partition_for(run_id, partitions),
        headers=headers,
    )


@pytest.fixture(scope="module")
def old_prefix(kafka_bootstrap: str) -> Iterator[str]:
    """Old topics (8 partitions) with committed and aborted transactions, anchors, outcomes and
    commands that no group applied."""
    prefix = f"t-move-resume-{uuid.uuid4().hex[:8]}"
    topology = load_topology()
    topics.apply(kafka_bootstrap, topology, prefix=prefix, replication_factor=1)
    producer = clients.new_transactional_producer(kafka_bootstrap, f"{prefix}-writer")
    producer.init_transactions(30)
    records = [(run, i) for i in range(PER_RUN) for run in RUNS]
    for begin in range(0, len(records), 50):
        producer.begin_transaction()
        for run, i in records[begin : begin + 50]:
            _park(producer, f"{prefix}.events", run, i)
        producer.produce(
            f"{prefix}.events", value=b"", partition=begin % 8, headers=wire.ANCHOR_HEADERS
        )
        producer.produce(
            f"{prefix}.events",
            value=wire.outcome_value(f"c-{begin}", b"outcome %d" % begin),
            key=b"r-1",
            partition=partition_for("r-1", 8),
            headers=wire.OUTCOME_HEADERS,
        )
        producer.commit_transaction(30)
    producer.begin_transaction()
    for run in RUNS[:20]:
        _park(producer, f"{prefix}.events", run, 99)
    producer.flush(30)
    producer.abort_transaction(30)
    plain = clients.new_producer(kafka_bootstrap)
    for i in range(COMMANDS):
        run = RUNS[i]
        plain.produce(
            f"{prefix}.cmd.signal", value=b"signal %d" % i, key=run.encode(),
            partition=partition_for(run, 8),
        )  # fmt: skip
    plain.flush(30)
    yield prefix


def _plan(bootstrap: str, source: str, target: str, partitions: int = 32) -> MovePlan:
    return MovePlan.prepare(
        bootstrap,
        load_topology(),
        source=source,
        target=target,
        group=f"{source}-group",
        partitions=partitions,
        replication_factor=1,
    )


def test_an_interrupted_and_a_crashed_move_resume_and_copy_each_record_once(
    kafka_bootstrap: str, old_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = f"{old_prefix}-a"
    plan = _plan(kafka_bootstrap, old_prefix, target)
    monkeypatch.setattr(pump_module, "_BATCH_RECORDS", 60)
    copies = [0]
    transaction = pump_module.Pump._transaction

    def counted(self: pump_module.Pump, sources: Any, messages: Any) -> int:
        count = transaction(self, sources, messages)
        copies[0] += count
        return count

    monkeypatch.setattr(pump_module.Pump, "_transaction", counted)
    first = run_move(plan, stop=lambda: copies[0] >= 100, forward=False)
    assert first.interrupted and not first.resumed
    assert 0 < first.copied < len(RUNS) * PER_RUN

    # A run of the move that dies inside a transaction: its copies never become visible.
    crashed = pump_module.Pump(plan)
    crashed.producer.begin_transaction()
    for run in RUNS[:5]:
        value, headers = _inbox(run, 0)
        crashed.producer.produce(
            f"{target}.events",
            value=value,
            key=run.encode(),
            partition=partition_for(run, 32),
            headers=[*headers, (pump_module.COPIED_HEADER, f"{old_prefix}.events:0:0".encode())],
        )
    crashed.producer.flush(30)

    second = run_move(plan, stop=lambda: False, forward=False)
    assert second.resumed and not second.interrupted
    assert first.copied + second.copied == len(RUNS) * PER_RUN + OUTCOMES  # none twice
    assert second.forwarded == COMMANDS
    audit = audit_move(plan)
    assert audit.ok, audit.lines()
    found = {t.suffix: (t.records, t.copies, t.keys) for t in audit.topics}
    moved = len(RUNS) * PER_RUN + OUTCOMES
    assert found["events"] == (moved, moved, len(RUNS))
    assert found["cmd.signal"] == (COMMANDS, COMMANDS, COMMANDS)

    again = run_move(plan, stop=lambda: False, forward=False)
    assert (again.resumed, again.copied, again.forwarded) == (True, 0, 0)
    assert audit_move(plan).ok

    with pytest.raises(MoveError, match="is the target of another move"):
        run_move(_plan(kafka_bootstrap, old_prefix, target, 16), stop=lambda: True)


def _one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error:"), err
    return err


def test_failed_checks_are_one_line_errors(
    kafka_bootstrap: str, old_prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["kafka", "repartition", "--bootstrap", kafka_bootstrap, "--replication-factor", "1"]
    missing = _one_line_error([*base, "--prefix", f"{old_prefix}-none", "--to-prefix", "x"], capsys)
    assert "missing" in missing

    used = f"{old_prefix}-used"
    topics.apply(kafka_bootstrap, load_topology(), prefix=used, replication_factor=1)
    producer = clients.new_producer(kafka_bootstrap)
    producer.produce(f"{used}.events", value=b"someone else's", key=b"r-0", partition=0)
    producer.flush(30)
    held = _one_line_error(
        [*base, "--prefix", old_prefix, "--to-prefix", used, "--group", f"{old_prefix}-group"],
        capsys,
    )
    assert f"topic {used}." in held and "already holds records" in held

    same = _one_line_error([*base, "--prefix", old_prefix, "--to-prefix", old_prefix], capsys)
    assert "must differ" in same
