"""Every event and every message survives encode → decode unchanged, as single-object Avro."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from fastavro.schema import to_parsing_canonical_form
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from flowstream import codec
from flowstream.codec import MARKER, resolve_schema
from flowstream.model.base import JSON
from flowstream.model.events import (
    EventEnvelope,
    HookCreated,
    HookReceived,
    RunCompleted,
    RunCreated,
    SignalReceived,
    StepCompleted,
    StepCreated,
    StepRetrying,
    TerminalOutcome,
    WaitCreated,
)
from flowstream.model.messages import (
    DeadLetter,
    FireTimer,
    ResolveChild,
    ResumeHook,
    SendSignal,
    StartRun,
)
from tests.codec.samples import (
    COMMAND_TYPES,
    DIGEST,
    EVENT_TYPES,
    SPEC,
    T0,
    aware_datetimes,
    envelope,
    json_values,
    sample_events,
    sample_messages,
)

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
EVENTS = sample_events()
MESSAGES = sample_messages()


def _id(value: Any) -> str:
    return type(value).__name__


def _crc64_avro(data: bytes) -> int:
    """CRC-64-AVRO straight from the Avro specification, independent of fastavro."""
    empty = 0xC15D213AA4D7A795
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (empty & -(fp & 1))
        table.append(fp)
    fp = empty
    for byte in data:
        fp = (fp >> 8) ^ table[(fp ^ byte) & 0xFF]
    return fp


def test_samples_cover_every_event_and_message_type() -> None:
    assert {type(e) for e in EVENTS} == set(EVENT_TYPES)
    assert len(EVENTS) == len(EVENT_TYPES) == 28
    assert {type(m) for m in MESSAGES} == {*COMMAND_TYPES, DeadLetter}


@pytest.mark.parametrize("event", EVENTS, ids=_id)
def test_every_event_round_trips(event: Any) -> None:
    original = envelope(event, sequence=42)
    data = codec.encode_event(original)
    assert codec.decode_event(data) == original


@pytest.mark.parametrize("message", MESSAGES, ids=_id)
def test_every_message_round_trips(message: Any) -> None:
    data = codec.encode_message(message)
    if isinstance(message, DeadLetter):
        assert codec.decode_dead_letter(data) == message
    else:
        assert codec.decode_command(data) == message
        assert codec.decode_command(data, type(message)) == message


def test_event_branch_names_are_the_event_types() -> None:
    for event in EVENTS:
        data = codec.encode_event(envelope(event))
        assert codec.default_codec().schema_name(data) == "flowstream.EventEnvelope"
        snake = re.sub(r"(?<!^)(?=[A-Z])", "_", type(event).__name__).lower()
        assert snake == event.type


def test_bytes_are_single_object_encoded_with_the_crc64_avro_fingerprint() -> None:
    assert _crc64_avro(b'"null"') == 7195948357588979594  # the Avro spec's test vector
    data = codec.encode_event(envelope(EVENTS[0]))
    assert data[:2] == MARKER == b"\xc3\x01"
    fingerprint = codec.default_codec().fingerprint("flowstream.EventEnvelope")
    assert data[2:10] == fingerprint
    library = {
        p.name.removesuffix(".avsc"): json.loads(p.read_text()) for p in SCHEMAS.glob("*.avsc")
    }
    canonical = to_parsing_canonical_form(resolve_schema("flowstream.EventEnvelope", library))
    assert int.from_bytes(fingerprint, "little") == _crc64_avro(canonical.encode())


def test_one_encoding_per_value_is_deterministic() -> None:
    first = [codec.encode_event(envelope(e)) for e in EVENTS]
    assert first == [codec.encode_event(envelope(e)) for e in EVENTS]


# -- JSON payloads: arbitrary JSON round-trips exactly ----------------------------------------


@settings(max_examples=150, deadline=None)
@given(value=json_values())
def test_arbitrary_json_round_trips_in_events(value: JSON) -> None:
    events = [
        RunCreated(spec=SPEC, input=value),
        RunCompleted(output=value),
        StepCreated(step_id="s", step_name="n", input=value),
        StepCompleted(step_id="s", output=value),
        SignalReceived(signal_id="x", name="approve", payload=value),
        HookCreated(hook_id="h", token_digest=DIGEST, metadata=value),
        HookReceived(hook_id="h", payload=value),
    ]
    for event in events:
        original = envelope(event)
        decoded = codec.decode_event(codec.encode_event(original))
        assert decoded == original
        assert _same_json(decoded.event.model_dump(), original.event.model_dump())


@settings(max_examples=100, deadline=None)
@given(value=json_values())
def test_arbitrary_json_round_trips_in_messages(value: JSON) -> None:
    messages: list[BaseModel] = [
        StartRun(run_id="r", spec=SPEC, input=value),
        SendSignal(run_id="r", signal_id="s", name="approve", payload=value),
        ResumeHook(run_id="r", hook_id="h", payload=value),
        ResolveChild(
            run_id="r",
            child_id="c",
            child_run_id="r-c",
            outcome=TerminalOutcome(type="completed", output=value),
        ),
    ]
    for message in messages:
        decoded = codec.decode_command(codec.encode_message(message))  # type: ignore[arg-type]
        assert decoded == message
        assert _same_json(decoded.model_dump(), message.model_dump())


def _same_json(left: Any, right: Any) -> bool:
    """Equal including types: 1 and 1.0 and True are different JSON values."""
    if type(left) is not type(right):
        return False
    if isinstance(left, dict):
        return list(left) == list(right) and all(_same_json(left[k], right[k]) for k in left)
    if isinstance(left, list | tuple):
        return len(left) == len(right) and all(map(_same_json, left, right))
    return bool(left == right) or (left != left and right != right)


@settings(max_examples=100, deadline=None)
@given(
    timestamp=aware_datetimes(),
    moment=aware_datetimes(),
    sequence=st.integers(min_value=1, max_value=2**63 - 1),
)
def test_datetimes_and_longs_round_trip(
    timestamp: datetime, moment: datetime, sequence: int
) -> None:
    for event in (
        WaitCreated(wait_id="w", resume_at=moment),
        StepRetrying(step_id="s", attempt=sequence, error="e", retry_after=moment),
    ):
        original = EventEnvelope(
            run_id="r", sequence=sequence, event_id="e", timestamp=timestamp, event=event
        )
        decoded = codec.decode_event(codec.encode_event(original))
        assert decoded == original
        assert decoded.timestamp.utcoffset() is not None
    timer = FireTimer(run_id="r", kind="wait", subject_id="w", due=moment)
    assert codec.decode_command(codec.encode_message(timer)) == timer


def test_decoded_datetimes_are_utc() -> None:
    decoded = codec.decode_command(codec.encode_message(MESSAGES[9]))
    assert isinstance(decoded, FireTimer)
    assert decoded.due == T0
    assert decoded.due.utcoffset() is not None and decoded.due.utcoffset().total_seconds() == 0
