"""Schema evolution: bytes written with an older envelope schema still decode.

The old bytes are written with plain fastavro and the schema kept in ``schemas/history/``, as an
older flowstream release would have written them.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import fastavro
import pytest
from fastavro.schema import fingerprint, load_schema, to_parsing_canonical_form
from pydantic import SecretStr

from flowstream import avsc, codec
from flowstream.codec import MARKER, AvroCodec
from flowstream.errors import SerializationError
from flowstream.model.events import EventEnvelope, ParentLink, RunCreated, WorkflowTaskFailed
from flowstream.model.messages import (
    CommandMessage,
    RegisterHookToken,
    ResumeHook,
    SendSignal,
    StartRun,
)
from tests.codec.samples import SPEC, T0, envelope, sample_events

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
V1 = SCHEMAS / "history" / "flowstream.EventEnvelope.v1.avsc"
V4 = SCHEMAS / "history" / "flowstream.EventEnvelope.v4.avsc"
#: Events an older envelope schema has no branch for (added with the version named).
ADDED_IN = {WorkflowTaskFailed: 5}


def _schema(path: Path) -> tuple[Any, bytes]:
    """A parsed schema (references resolved by fastavro) and its fingerprint."""
    parsed = load_schema(str(path))
    return parsed, bytes.fromhex(fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO"))


def _frame(schema: Any, fp: bytes, datum: Any) -> bytes:
    buffer = io.BytesIO()
    buffer.write(MARKER + fp)
    fastavro.schemaless_writer(buffer, schema, datum)
    return buffer.getvalue()


def _as_v1(data: bytes, old: Path = V1) -> bytes:
    """Re-write current envelope bytes with an older schema (Avro resolution drops new fields)."""
    current, _ = _schema(SCHEMAS / "flowstream.EventEnvelope.avsc")
    v1, v1_fp = _schema(old)
    datum = fastavro.schemaless_reader(io.BytesIO(data[10:]), current, v1, return_record_name=True)
    return _frame(v1, v1_fp, datum)


def test_v1_is_an_older_envelope_schema_than_the_current_one() -> None:
    _, v1_fp = _schema(V1)
    _, current_fp = _schema(SCHEMAS / "flowstream.EventEnvelope.avsc")
    assert v1_fp != current_fp
    assert codec.default_codec().fingerprint("flowstream.EventEnvelope") == current_fp
    v1_fields = _run_created_fields(json.loads(V1.read_text()))
    assert "depth" not in v1_fields and {"spec", "input", "parent"} <= v1_fields


def _run_created_fields(document: dict[str, Any]) -> set[str]:
    event = next(f for f in document["fields"] if f["name"] == "event")
    created = next(b for b in event["type"] if b["name"].endswith(".RunCreated"))
    return {f["name"] for f in created["fields"]}


def test_a_hand_written_v1_record_decodes_with_the_new_field_defaulted() -> None:
    v1, v1_fp = _schema(V1)
    spec = SPEC.model_dump(mode="json")
    data = _frame(
        v1,
        v1_fp,
        {
            "run_id": "order-9",
            "sequence": 1,
            "event_id": "order-9:1",
            "timestamp": T0,
            "event": (
                "flowstream.event.RunCreated",
                {"spec": spec, "input": b'{"qty":3}', "parent": None},
            ),
            "schema_version": 1,
        },
    )
    decoded = codec.decode_event(data)
    assert decoded == EventEnvelope(
        run_id="order-9",
        sequence=1,
        event_id="order-9:1",
        timestamp=T0,
        event=RunCreated(spec=SPEC, input={"qty": 3}),
    )
    assert isinstance(decoded.event, RunCreated) and decoded.event.depth == 0


@pytest.mark.parametrize(
    "event", [e for e in sample_events() if type(e) not in ADDED_IN], ids=lambda e: type(e).__name__
)
def test_every_event_written_with_v1_decodes_into_the_current_model(event: Any) -> None:
    original = envelope(event, sequence=5)
    old_bytes = _as_v1(codec.encode_event(original))
    assert old_bytes[2:10] != codec.encode_event(original)[2:10]
    decoded = codec.decode_event(old_bytes)
    if isinstance(event, RunCreated):
        # v1 could not carry depth; it decodes to the default
        assert decoded == original.model_copy(
            update={"event": event.model_copy(update={"depth": 0})}
        )
    else:
        assert decoded == original


def test_without_the_history_the_old_fingerprint_is_unknown(tmp_path: Path) -> None:
    shutil.copytree(SCHEMAS, tmp_path / "schemas", ignore=shutil.ignore_patterns("history"))
    bare = AvroCodec(tmp_path / "schemas")
    old_bytes = _as_v1(codec.encode_event(envelope(sample_events()[1])))
    with pytest.raises(SerializationError, match="unknown writer schema fingerprint"):
        bare.decode_event(old_bytes)
    assert codec.decode_event(old_bytes).sequence == 1


def test_every_history_schema_is_self_contained_and_has_a_current_record() -> None:
    wire = {"flowstream.EventEnvelope"} | {
        p.name.removesuffix(".avsc") for p in SCHEMAS.glob("flowstream.message.*.avsc")
    }
    history = sorted((SCHEMAS / "history").glob("*.avsc"))
    assert history
    for path in history:
        document = json.loads(path.read_text())
        assert document["name"] in wire
        assert path.name.startswith(document["name"] + ".v")
        fastavro.parse_schema(document)  # no reference left to resolve


def test_a_json_field_added_later_decodes_as_null(tmp_path: Path) -> None:
    # an imagined SendSignal v0 without payload: the reader's bytes default "null" applies
    directory = tmp_path / "schemas"
    shutil.copytree(SCHEMAS, directory)
    v0 = json.loads((SCHEMAS / "flowstream.message.SendSignal.avsc").read_text())
    v0["name"] = "flowstream.message.SendSignal"
    del v0["namespace"]
    v0["fields"] = [f for f in v0["fields"] if f["name"] != "payload"]
    (directory / "history" / "flowstream.message.SendSignal.v0.avsc").write_text(json.dumps(v0))
    schema = fastavro.parse_schema(v0)
    fp = bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))
    data = _frame(schema, fp, {"run_id": "r1", "signal_id": "s1", "name": "go"})
    decoded = AvroCodec(directory).decode_command(data)
    assert decoded == SendSignal(run_id="r1", signal_id="s1", name="go", payload=None)
    with pytest.raises(SerializationError, match="unknown writer schema"):
        codec.decode_command(data)


@pytest.mark.parametrize(
    ("history", "value"),
    [
        pytest.param(
            "flowstream.EventEnvelope.v2.avsc",
            envelope(
                RunCreated(spec=SPEC, input=2, parent=ParentLink(run_id="r0", continued=True)),
                sequence=1,
            ),
            id="envelope-v2",
        ),
        pytest.param(
            "flowstream.message.StartRun.v1.avsc",
            StartRun(run_id="r1", spec=SPEC, parent=ParentLink(run_id="r0", continued=True)),
            id="start-run-v1",
        ),
        pytest.param(
            "flowstream.EventEnvelope.v3.avsc",
            envelope(
                RunCreated(
                    spec=SPEC, input=2, parent=ParentLink(run_id="r0", continued=True, hop=3)
                ),
                sequence=1,
            ),
            id="envelope-v3",
        ),
        pytest.param(
            "flowstream.message.StartRun.v2.avsc",
            StartRun(run_id="r1", spec=SPEC, parent=ParentLink(run_id="r0", continued=True, hop=3)),
            id="start-run-v2",
        ),
        pytest.param(
            "flowstream.EventEnvelope.v5.avsc",
            envelope(WorkflowTaskFailed(attempt=1, error_type="E", message="m"), sequence=3),
            id="envelope-v5",
        ),
        pytest.param(
            "flowstream.EventEnvelope.v6.avsc",
            envelope(
                RunCreated(
                    spec=SPEC, input=2, parent=ParentLink(run_id="r0", continued=True, hop=3)
                ),
                sequence=1,
            ),
            id="envelope-v6",
        ),
        pytest.param(
            "flowstream.message.StartRun.v4.avsc",
            StartRun(
                run_id="r1",
                spec=SPEC,
                parent=ParentLink(run_id="r0", continued=True, hop=3),
                command_id="c-1",
            ),
            id="start-run-v4",
        ),
        pytest.param(
            "flowstream.message.ResumeHook.v1.avsc",
            ResumeHook(run_id="r1", hook_id="h", token=SecretStr("old-token"), payload=1),
            id="resume-hook-v1",
        ),
        pytest.param(
            "flowstream.message.ResumeHook.v2.avsc",
            ResumeHook(token=SecretStr("old-token"), payload=1, command_id="c-1"),
            id="resume-hook-v2",
        ),
        pytest.param(
            "flowstream.message.RegisterHookToken.v1.avsc",
            RegisterHookToken(token_digest="ab" * 32, run_id="r1", hook_id="h"),
            id="register-hook-token-v1",
        ),
    ],
)
def test_a_link_written_before_a_field_was_added_decodes_with_its_default(
    history: str, value: EventEnvelope | CommandMessage
) -> None:
    old, old_fp = _schema(SCHEMAS / "history" / history)
    name = old["name"].removeprefix("flowstream.")
    current, _ = _schema(SCHEMAS / f"flowstream.{name}.avsc")
    encoded = (
        codec.encode_event(value)
        if isinstance(value, EventEnvelope)
        else codec.encode_message(value)
    )
    datum = fastavro.schemaless_reader(
        io.BytesIO(encoded[10:]), current, old, return_record_name=True
    )
    old_bytes = _frame(old, old_fp, datum)
    assert old_bytes[2:10] != encoded[2:10]
    decoded = (
        codec.decode_event(old_bytes)
        if isinstance(value, EventEnvelope)
        else codec.decode_command(old_bytes)
    )
    assert decoded == value


@pytest.mark.parametrize(
    "event", [e for e in sample_events() if type(e) not in ADDED_IN], ids=lambda e: type(e).__name__
)
def test_every_event_written_with_v4_decodes_into_the_current_model(event: Any) -> None:
    original = envelope(event, sequence=5)
    old_bytes = _as_v1(codec.encode_event(original), V4)
    assert old_bytes[2:10] not in (codec.encode_event(original)[2:10], _schema(V1)[1])
    assert codec.decode_event(old_bytes) == original


def test_v5_added_workflow_task_failed_as_the_last_branch_of_the_event_union() -> None:
    def branches(document: dict[str, Any]) -> list[str]:
        event = next(f for f in document["fields"] if f["name"] == "event")
        return [b["name"].rsplit(".", 1)[-1] for b in event["type"]]

    current = branches(codec.resolve_schema(codec.ENVELOPE_SCHEMA, _library()))
    assert branches(json.loads(V4.read_text())) == current[:-1]
    assert current[-1] == "WorkflowTaskFailed"


def test_an_older_reader_refuses_the_new_event_loudly() -> None:
    """A v4 reader (an older release) cannot mis-read a workflow_task_failed: the union branch
    it does not know fails the decode."""
    data = codec.encode_event(envelope(next(e for e in sample_events() if type(e) in ADDED_IN)))
    current, _ = _schema(SCHEMAS / "flowstream.EventEnvelope.avsc")
    v4, _ = _schema(V4)
    with pytest.raises(Exception):  # noqa: B017 - fastavro's own resolution error
        fastavro.schemaless_reader(io.BytesIO(data[10:]), current, v4)


def _library() -> dict[str, Any]:
    documents = (json.loads(p.read_text()) for p in SCHEMAS.glob("*.avsc"))
    return {avsc.fullname(d, "")[0]: d for d in documents}
