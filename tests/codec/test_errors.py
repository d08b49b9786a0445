"""Whatever does not decode into the expected type is a SerializationError, never a fallback."""

from __future__ import annotations

import io
import json
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

import fastavro
import pytest
from fastavro.schema import fingerprint, load_schema, to_parsing_canonical_form

from flowstream import codec
from flowstream.codec import MARKER, AvroCodec
from flowstream.datum import SchemaMismatchError
from flowstream.errors import FlowError, SerializationError
from flowstream.model.events import (
    EventEnvelope,
    RunCompleted,
    StepCompleted,
    TerminalOutcome,
    WaitCreated,
)
from flowstream.model.messages import CancelRun, DeadLetter, SendSignal, StartRun
from tests.codec.samples import SPEC, T0, envelope, sample_events, sample_messages

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
GOOD_EVENT = codec.encode_event(envelope(StepCompleted(step_id="s", output={"a": [1, 2]})))
GOOD_START = codec.encode_message(StartRun(run_id="r1", spec=SPEC, input=[1]))


def _plain(path: Path, datum: Any) -> bytes:
    """Bytes written by plain fastavro with the schema file at ``path``."""
    schema = load_schema(str(path))
    fp = bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))
    buffer = io.BytesIO(MARKER + fp)
    buffer.seek(0, io.SEEK_END)
    fastavro.schemaless_writer(buffer, schema, datum)
    return buffer.getvalue()


def test_serialization_error_is_a_flow_error() -> None:
    assert issubclass(SerializationError, FlowError)
    assert issubclass(SchemaMismatchError, SerializationError)


# -- framing ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [b"", b"\xc3", b"\xc3\x01\x00", b'{"run_id": "r1"}', b"\x00\x01" + GOOD_EVENT[2:], b"x" * 64],
    ids=["empty", "marker-only", "short-header", "json", "wrong-marker", "junk"],
)
def test_bytes_without_the_single_object_header_are_refused(data: bytes) -> None:
    with pytest.raises(SerializationError, match="single-object"):
        codec.decode_event(data)
    with pytest.raises(SerializationError, match="single-object"):
        codec.decode_command(data)


def test_an_unknown_fingerprint_is_refused_with_the_fingerprint() -> None:
    data = MARKER + bytes(range(8)) + GOOD_EVENT[10:]
    with pytest.raises(SerializationError, match="unknown writer schema fingerprint 0001020304"):
        codec.decode_event(data)


def test_a_truncated_body_is_refused() -> None:
    for cut in (1, 5, len(GOOD_EVENT) // 2):
        with pytest.raises(SerializationError, match=r"cannot decode flowstream\.EventEnvelope"):
            codec.decode_event(GOOD_EVENT[:-cut])


def test_trailing_bytes_are_refused() -> None:
    with pytest.raises(SerializationError, match="1 trailing bytes"):
        codec.decode_event(GOOD_EVENT + b"\x00")


def test_a_corrupt_union_index_is_refused() -> None:
    # the body is run_id, sequence, event_id, timestamp, then the event's union index: an
    # index past the 28 branches must not decode as some other event
    data = codec.encode_event(envelope(StepCompleted(step_id="s"), run_id="r1"))
    body = bytearray(data[10:])
    run_id_len, seq_len, event_id_len = 1 + 2, 1, 1 + len("r1:1")
    offset = run_id_len + seq_len + event_id_len + 8  # timestamp-micros of T0 takes 8 bytes
    assert body[offset] == 12 * 2  # StepCompleted is branch 12, zigzag-encoded
    body[offset] = 120
    with pytest.raises(SerializationError, match="cannot decode"):
        codec.decode_event(data[:10] + bytes(body))


def test_invalid_utf8_in_a_string_is_refused() -> None:
    data = bytearray(codec.encode_message(CancelRun(run_id="abc")))
    index = data.index(b"abc")
    data[index] = 0xFF
    with pytest.raises(SerializationError, match=r"cannot decode flowstream\.message\.CancelRun"):
        codec.decode_command(bytes(data))


def test_corrupt_json_inside_a_valid_record_is_refused() -> None:
    data = _plain(
        SCHEMAS / "flowstream.message.SendSignal.avsc",
        {"run_id": "r1", "signal_id": "s1", "name": "go", "payload": b"{not json"},
    )
    with pytest.raises(SerializationError, match="SendSignal"):
        codec.decode_command(data)


def test_a_record_the_model_rejects_is_refused_with_the_field() -> None:
    data = _plain(
        SCHEMAS / "flowstream.message.StartRun.avsc",
        {
            "run_id": "not a run id!",
            "spec": SPEC.model_dump(mode="json"),
            "input": b"null",
            "parent": None,
            "depth": -1,
        },
    )
    with pytest.raises(SerializationError) as caught:
        codec.decode_command(data)
    message = str(caught.value)
    assert "flowstream.message.StartRun does not validate" in message
    assert "run_id: Value error, invalid run id" in message
    assert "depth: Input should be greater than or equal to 0" in message


# -- type mismatches --------------------------------------------------------------------------


def test_an_event_is_not_a_command_and_a_command_is_not_an_event() -> None:
    with pytest.raises(SerializationError, match=r"but the bytes hold flowstream\.EventEnvelope"):
        codec.decode_command(GOOD_EVENT)
    with pytest.raises(
        SerializationError,
        match=r"expected flowstream\.EventEnvelope but the bytes hold .*\.StartRun",
    ):
        codec.decode_event(GOOD_START)


def test_an_expected_command_type_is_enforced() -> None:
    assert isinstance(codec.decode_command(GOOD_START, StartRun), StartRun)
    with pytest.raises(
        SerializationError,
        match=r"expected flowstream\.message\.SendSignal but the bytes hold .*StartRun",
    ):
        codec.decode_command(GOOD_START, SendSignal)
    with pytest.raises(TypeError, match="not a command message type"):
        codec.decode_command(GOOD_START, DeadLetter)  # type: ignore[arg-type]


def test_dead_letters_are_not_commands() -> None:
    letter = codec.encode_message(sample_messages()[-1])
    with pytest.raises(SerializationError, match="DeadLetter"):
        codec.decode_command(letter)
    with pytest.raises(SerializationError, match="DeadLetter"):
        codec.decode_dead_letter(GOOD_START)


def test_only_messages_encode_as_messages() -> None:
    for value in (envelope(RunCompleted()), RunCompleted(), SPEC):
        with pytest.raises(SerializationError, match="cannot encode"):
            codec.encode_message(value)  # type: ignore[arg-type]


def test_not_bytes_is_refused() -> None:
    with pytest.raises(SerializationError, match="expected bytes, got str"):
        codec.decode_event("c301")  # type: ignore[arg-type]


# -- values the wire cannot carry exactly ------------------------------------------------------


@pytest.mark.parametrize(
    ("output", "reason"),
    [
        (float("nan"), "NaN or Infinity"),
        ({"x": [1, float("inf")]}, "NaN or Infinity"),
        (2**64, "not encodable as JSON"),
        ([-(2**63) - 1], "not encodable as JSON"),
    ],
    ids=["nan", "nested-inf", "big-int", "small-int"],
)
def test_json_that_would_not_round_trip_is_refused(output: Any, reason: str) -> None:
    with pytest.raises(SerializationError, match=reason) as caught:
        codec.encode_event(envelope(RunCompleted(output=output), run_id="r7"))
    assert caught.value.run_id == "r7"
    assert "cannot encode flowstream.EventEnvelope" in str(caught.value)


def test_json_null_and_strings_mentioning_null_still_encode() -> None:
    for output in (None, [None], {"null": "null"}, "nullable", [0.5, None]):
        original = envelope(RunCompleted(output=output))
        assert codec.decode_event(codec.encode_event(original)) == original


def test_naive_datetimes_are_refused_not_guessed() -> None:
    naive = datetime(2026, 1, 1, 12, 0)
    with pytest.raises(SerializationError, match="naive datetime 2026-01-01T12:00:00"):
        codec.encode_event(envelope(WaitCreated(wait_id="w", resume_at=naive)))
    with pytest.raises(SerializationError, match="naive datetime"):
        codec.encode_event(
            EventEnvelope(
                run_id="r", sequence=1, event_id="e", timestamp=naive, event=RunCompleted()
            )
        )


def test_a_sequence_beyond_a_long_is_refused() -> None:
    with pytest.raises(SerializationError, match="cannot encode"):
        codec.encode_event(
            EventEnvelope(
                run_id="r", sequence=2**63, event_id="e", timestamp=T0, event=RunCompleted()
            )
        )


# -- schema files that disagree with the model fail when the codec is built --------------------


def _edited(tmp_path: Path, name: str, edit: Any) -> Path:
    directory = tmp_path / "schemas"
    shutil.copytree(SCHEMAS, directory)
    path = directory / f"{name}.avsc"
    document = json.loads(path.read_text())
    edit(document)
    path.write_text(json.dumps(document))
    return directory


def test_a_field_missing_from_a_schema_fails_at_start_up(tmp_path: Path) -> None:
    def drop_reason(document: dict[str, Any]) -> None:
        document["fields"] = [f for f in document["fields"] if f["name"] != "reason"]

    directory = _edited(tmp_path, "flowstream.message.CancelRun", drop_reason)
    with pytest.raises(SchemaMismatchError, match=r"fields missing from the schema \['reason'\]"):
        AvroCodec(directory)


def test_a_field_type_that_disagrees_fails_at_start_up(tmp_path: Path) -> None:
    def output_as_string(document: dict[str, Any]) -> None:
        for field in document["fields"]:
            if field["name"] == "output":
                field["type"] = "string"

    directory = _edited(tmp_path, "flowstream.TerminalOutcome", output_as_string)
    with pytest.raises(SchemaMismatchError, match=r"TerminalOutcome\.output: JSON values"):
        AvroCodec(directory)


def test_enum_symbols_that_disagree_fail_at_start_up(tmp_path: Path) -> None:
    def drop_symbol(document: dict[str, Any]) -> None:
        for field in document["fields"]:
            if field["name"] == "backoff":
                field["type"]["symbols"] = ["fixed"]

    directory = _edited(tmp_path, "flowstream.RetryPolicy", drop_symbol)
    with pytest.raises(SchemaMismatchError, match="backoff: needs an enum"):
        AvroCodec(directory)


def test_a_missing_referenced_schema_fails_at_start_up(tmp_path: Path) -> None:
    directory = tmp_path / "schemas"
    shutil.copytree(SCHEMAS, directory)
    (directory / "flowstream.TerminalOutcome.avsc").unlink()
    with pytest.raises(SerializationError, match=r"flowstream\.TerminalOutcome is not defined"):
        AvroCodec(directory)


def test_a_misnamed_schema_file_fails_at_start_up(tmp_path: Path) -> None:
    directory = tmp_path / "schemas"
    shutil.copytree(SCHEMAS, directory)
    (directory / "flowstream.ParentLink.avsc").rename(directory / "ParentLink.avsc")
    with pytest.raises(SerializationError, match=r"must be named flowstream\.ParentLink\.avsc"):
        AvroCodec(directory)


def test_the_shipped_schemas_build_a_codec_for_every_sample() -> None:
    built = AvroCodec(SCHEMAS)
    for event in sample_events():
        assert built.decode_event(codec.encode_event(envelope(event))).event == event
    outcome = TerminalOutcome(type="failed", error="x")
    assert outcome.output is None
