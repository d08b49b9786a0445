"""``flowstream.wire``: the events topic's record kinds, values and the one reader of histories,
on records built by hand (the real broker's side is ``tests/processor/test_readers.py``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from flowstream import codec, wire
from flowstream.model.events import FlowEvent, RunCompleted, RunCreated, RunStarted
from flowstream.model.messages import CommandOutcome, OutcomeStatus
from flowstream.model.spec import WorkflowSpec
from tests.support import envelope

ROOT = Path(__file__).resolve().parent.parent
TOPIC = "t.events"


@dataclass
class Record:
    """A consumed record, shaped like ``confluent_kafka.Message``."""

    _value: bytes | None
    _key: bytes | None = None
    _headers: wire.Headers | None = None
    _offset: int = 0
    _error: object = None
    _partition: int = 3
    _topic: str = field(default=TOPIC)

    def value(self) -> bytes | None:
        return self._value

    def key(self) -> bytes | None:
        return self._key

    def headers(self) -> wire.Headers | None:
        return self._headers

    def error(self) -> object:
        return self._error

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset


def _history(run_id: str) -> list[bytes]:
    events: list[FlowEvent] = [
        RunCreated(spec=WorkflowSpec(name="w")),
        RunStarted(),
        RunCompleted(),
    ]
    return [codec.encode_event(envelope(run_id, i, e)) for i, e in enumerate(events, 1)]


def _records(
    *values: tuple[bytes | None, bytes | None, wire.Headers | None],
) -> list[Record]:
    return [Record(v, k, h, offset) for offset, (v, k, h) in enumerate(values)]


def _altered(data: bytes) -> bytes:
    return data[:2] + bytes(b ^ 0xFF for b in data[2:10]) + data[10:]


def test_events_are_decoded_and_every_other_kind_is_skipped() -> None:
    first, second, third = _history("r")
    records = _records(
        (first, b"r", None),
        (wire.inbox_value("r", "i1", b"cmd"), b"r", [(wire.RECORD_HEADER, b"inbox")]),
        (second, b"r", wire.event_headers("w1")),
        (wire.inbox_done_value("r", "i1"), b"r", [(wire.RECORD_HEADER, b"inbox-done")]),
        (wire.hook_token_value("d", "r", "h"), b"d", [(wire.RECORD_HEADER, b"hook-token")]),
        (b"", b"r", [(wire.RECORD_HEADER, b"anchor")]),  # a kind this release does not know
        (third, b"r", None),
    )
    records.append(Record(None, _error="end of partition"))
    reported: list[wire.BadRecord] = []
    events = list(wire.decode_events(records, on_bad=reported.append))
    assert [(e.run_id, e.sequence) for e in events] == [("r", 1), ("r", 2), ("r", 3)]
    assert reported == []
    pairs = list(wire.event_records(records, on_bad=reported.append))
    assert [record.offset() for record, _ in pairs] == [0, 2, 6]
    assert [wire.writer_of(record) for record, _ in pairs] == ["", "w1", ""]


def test_a_bad_record_is_reported_with_its_place_and_run_and_reading_goes_on() -> None:
    first, second, third = _history("r")
    records = _records(
        (first, b"r", None),
        (b"not an event at all", None, None),
        (_altered(second), b"r", wire.event_headers("w1")),
        (second[:-3], b"r", None),
        (b"\x01\x02", b"\xff\xfe", [(wire.RECORD_HEADER, b"event")]),
        (third, b"r", None),
    )
    reported: list[wire.BadRecord] = []
    events = list(wire.decode_events(records, on_bad=reported.append))
    assert [e.sequence for e in events] == [1, 3]
    assert [(b.topic, b.partition, b.offset, b.run_id) for b in reported] == [
        (TOPIC, 3, 1, None),
        (TOPIC, 3, 2, "r"),
        (TOPIC, 3, 3, "r"),
        (TOPIC, 3, 4, None),  # a key that is not text names no run
    ]
    assert str(reported[0]).startswith(f"{TOPIC}[3]@1 (no run key): not an Avro")
    assert str(reported[1]).startswith(f"{TOPIC}[3]@2 (run r): ")
    assert "fingerprint" in reported[1].reason


def test_the_report_happens_in_the_records_place_among_the_events() -> None:
    first, _, third = _history("r")
    records = _records((first, b"r", None), (b"bad", b"r", None), (third, b"r", None))
    seen: list[object] = []
    for event in wire.decode_events(records, on_bad=seen.append):
        seen.append(event.sequence)
    assert seen[0] == 1 and isinstance(seen[1], wire.BadRecord) and seen[2] == 3


def test_by_default_a_bad_record_is_logged_as_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="flowstream.wire")
    assert list(wire.decode_events(_records((b"bad", b"r", None)))) == []
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert f"{TOPIC}[3]@0 (run r)" in caplog.messages[0]


def test_an_avro_value_is_an_event_whatever_its_headers_say() -> None:
    (first, *_) = _history("r")
    assert wire.kind_of(Record(first, _headers=[(wire.RECORD_HEADER, b"inbox")])) is (
        wire.RecordKind.EVENT
    )
    assert wire.kind_of(Record(b"x", _headers=[(wire.RECORD_HEADER, b"\xff")])) is None
    assert wire.kind_of(Record(None)) is wire.RecordKind.EVENT


def test_values_round_trip() -> None:
    assert wire.split_inbox(wire.inbox_value("r", "i", b"a\0b")) == ("r", "i", b"a\0b")
    assert wire.split_inbox(wire.inbox_done_value("r", "i")) == ("r", "i", b"")
    assert wire.split_hook_token(wire.hook_token_value("d", "r", "h")) == ("d", "r", "h")
    with pytest.raises(ValueError):
        wire.split_inbox(b"no separators")
    record = Record(b"", _headers=[(wire.REASON_HEADER, b"build b2 not served")])
    assert wire.header_of(record, wire.REASON_HEADER) == b"build b2 not served"
    assert wire.header_of(record, wire.WRITER_HEADER) is None


def test_an_outcome_record_is_its_own_kind_found_by_its_command_id() -> None:
    """Outcomes share the events partitions: readers of histories pass over them, and an outcome
    never looks like an event (its value starts with the command id, never with ``C3 01``)."""
    (first, *_) = _history("r")
    answer = CommandOutcome(
        command_id="c-1", key="r", command="start_run", status=OutcomeStatus.APPLIED
    )
    value = wire.outcome_value("c-1", codec.encode_message(answer))
    other = wire.outcome_value(
        "c-10", codec.encode_message(answer.model_copy(update={"command_id": "c-10"}))
    )
    records = _records(
        (first, b"r", None),
        (value, b"r", wire.OUTCOME_HEADERS),
        (other, b"r", wire.OUTCOME_HEADERS),
        (wire.inbox_value("r", "c-1", value), b"r", [(wire.RECORD_HEADER, b"inbox")]),
    )
    assert not value.startswith(codec.MARKER)
    assert [wire.kind_of(r) for r in records] == [
        wire.RecordKind.EVENT,
        wire.RecordKind.OUTCOME,
        wire.RecordKind.OUTCOME,
        wire.RecordKind.INBOX,
    ]
    assert [e.sequence for e in wire.decode_events(records)] == [1]
    assert list(wire.outcomes_of(records, "c-1")) == [answer]
    assert [o.command_id for o in wire.outcomes_of(records, "c-10")] == ["c-10"]
    assert list(wire.outcomes_of(records, "c")) == []


#: Modules that spell the contract themselves on purpose: the chaos auditor and its test read the
#: events topic with nothing of flowstream's, to check it independently.
_INDEPENDENT_READERS = {Path("benchmarks/chaos_wire.py"), Path("tests/chaos/test_audit.py")}


def test_the_wire_contract_is_spelled_only_in_the_wire_module() -> None:
    spellings = [f'"{wire.RECORD_HEADER}"', f'"{wire.WRITER_HEADER}"', f'"{wire.REASON_HEADER}"']
    offenders = []
    paths = [
        path for top in ("flowstream", "benchmarks", "tests") for path in (ROOT / top).rglob("*.py")
    ]
    for path in sorted(paths):
        relative = path.relative_to(ROOT)
        if relative == Path("flowstream/wire.py") or relative in _INDEPENDENT_READERS:
            continue
        text = path.read_text(encoding="utf-8")
        offenders += [f"{relative}: {s}" for s in spellings if s in text]
    assert offenders == [], "use the names in flowstream.wire"
