"""The chaos auditor finds what it is there to find: histories written by hand (through a
transactional producer, one transaction aborted) with a duplicate sequence, a gap, sequences
written out of order, two terminal events, a timer that never fired, a lost signal, a step that
never ran and an undecodable record."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from benchmarks.chaos_audit import Expectations, audit
from flowstream import codec
from flowstream.kafka import clients
from flowstream.model.events import (
    EventEnvelope,
    FlowEvent,
    RunCompleted,
    RunCreated,
    RunFailed,
    RunStarted,
    SignalReceived,
    StepCompleted,
    StepCreated,
    StepStarted,
    WaitCreated,
)
from flowstream.partitioning import partition_for
from tests.processor.harness import apply_topics
from tests.support import EPOCH, spec

pytestmark = pytest.mark.kafka

SPEC = spec("audited")
HISTORIES: dict[str, list[tuple[int, FlowEvent]]] = {
    "good": [
        (1, RunCreated(spec=SPEC)),
        (2, RunStarted()),
        (3, StepCreated(step_id="a", step_name="work")),
        (4, StepStarted(step_id="a", attempt=1)),
        (5, StepCompleted(step_id="a")),
        (6, SignalReceived(signal_id="s1", name="go")),
        (7, RunCompleted()),
    ],
    "dup": [(1, RunCreated(spec=SPEC)), (2, RunStarted()), (2, RunStarted()), (3, RunCompleted())],
    "gap": [(1, RunCreated(spec=SPEC)), (3, RunStarted())],
    "order": [
        (1, RunCreated(spec=SPEC)),
        (3, RunStarted()),
        (2, RunStarted()),
        (4, RunCompleted()),
    ],
    "ends": [
        (1, RunCreated(spec=SPEC)),
        (2, StepCreated(step_id="b", step_name="work")),
        (3, StepCompleted(step_id="b")),
        (4, RunCompleted()),
        (5, RunFailed(error="again")),
    ],
    "timer": [
        (1, RunCreated(spec=SPEC)),
        (2, WaitCreated(wait_id="nap", resume_at=EPOCH)),
        (3, RunCompleted()),
    ],
}


def _produce(producer: clients.Producer, topic: str, run_id: str, value: bytes, kind: str) -> None:
    headers = [] if kind == "event" else [("flowstream-record", kind.encode())]
    partition = partition_for(run_id, 8)
    producer.produce(topic, value, key=run_id.encode(), partition=partition, headers=headers)


def _event(run_id: str, sequence: int, event: FlowEvent) -> bytes:
    envelope = EventEnvelope(
        run_id=run_id, sequence=sequence, event_id=uuid.uuid4().hex, timestamp=EPOCH, event=event
    )
    return codec.encode_event(envelope)


def test_the_auditor_reports_each_kind_of_violation(
    kafka_bootstrap: str, unique_prefix: str, tmp_path: Path
) -> None:
    apply_topics(kafka_bootstrap, unique_prefix)
    topic = f"{unique_prefix}.events"
    producer = clients.new_transactional_producer(kafka_bootstrap, f"{unique_prefix}-writer")
    producer.init_transactions(30)
    producer.begin_transaction()
    for run_id, events in HISTORIES.items():
        for sequence, event in events:
            _produce(producer, topic, run_id, _event(run_id, sequence, event), "event")
    _produce(producer, topic, "good", b"", "anchor")
    producer.commit_transaction(30)
    producer.begin_transaction()  # aborted: none of it may be seen committed
    _produce(producer, topic, "good", _event("good", 8, RunStarted()), "event")
    _produce(producer, topic, "good", b"", "anchor")
    producer.flush(30)  # written to the log, then aborted (not purged from the queue)
    producer.abort_transaction(30)
    producer.begin_transaction()
    _produce(producer, topic, "junk", b"not avro", "event")
    producer.commit_transaction(30)
    effects = tmp_path / "effects"
    effects.mkdir()
    (effects / "effects-1.log").write_text("flow:good:a\tgood\ta\t1\t1\t1.0\n")

    expected = Expectations(
        runs=[*HISTORIES, "missing"], signals={"good": ["s1"], "timer": ["s9"]}, hooks={}
    )
    result = audit(kafka_bootstrap, unique_prefix, expected, effects, stable_timeout=30)

    assert dict(result.by_check) == {
        "duplicate-sequence": 1,
        "sequence-gap": 1,
        "sequence-order": 1,
        "one-terminal": 1,
        "timer-fired": 1,
        "started-terminal": 2,  # gap is not terminal, missing has no event
        "signal-once": 1,
        "step-ran": 1,
        "decodes": 1,
    }, result.violations
    assert result.by_run["order"] == {"sequence-order"}
    assert result.unattributed == 1  # the record that does not decode
    assert result.figures["aborted_records"] == 2
    assert result.figures["aborted_by_kind"] == {"event": 1, "anchor": 1}
    assert result.figures["aborted_events_decided_again"] == 0
    assert result.figures["bookkeeping_records"] == {"anchor": 1}
    assert result.figures["step_executions"] == 1
