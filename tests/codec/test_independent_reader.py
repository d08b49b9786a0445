"""An independent reader decodes flowstream's bytes with plain fastavro and the files in schemas/.

The reading side uses nothing from flowstream: it finds the writer schema by the fingerprint in
the single-object header, among schemas it loads itself with ``fastavro.schema.load_schema``.
:func:`read_value` is the helper a Kafka-topic version of this test can call on record values.
"""

from __future__ import annotations

import functools
import io
import json
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Any

import fastavro
import pytest
from fastavro.schema import fingerprint, load_schema, to_parsing_canonical_form
from pydantic import BaseModel, SecretStr

from flowstream import codec
from tests.codec.samples import envelope, sample_events, sample_messages

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


@functools.cache
def plain_schemas(schema_dir: Path = SCHEMAS) -> dict[bytes, tuple[str, Any]]:
    """Every schema in ``schema_dir`` and its ``history/``, by CRC-64-AVRO fingerprint."""
    found: dict[bytes, tuple[str, Any]] = {}
    for path in sorted(schema_dir.glob("*.avsc")) + sorted(schema_dir.glob("history/*.avsc")):
        schema = load_schema(str(path))
        fp = bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))
        found[fp] = (schema["name"], schema)
    return found


def read_value(value: bytes, schema_dir: Path = SCHEMAS) -> tuple[str, dict[str, Any]]:
    """Decode one Kafka record value: the writer record's full name and its Avro datum.

    JSON fields come back as bytes (``json.loads`` them); unions of records as
    ``(record name, datum)``.
    """
    assert value[:2] == b"\xc3\x01", "not an Avro single-object encoding"
    name, schema = plain_schemas(schema_dir)[value[2:10]]
    body = io.BytesIO(value[10:])
    datum = fastavro.schemaless_reader(
        body, schema, None, return_record_name=True, return_record_name_override=True
    )
    assert body.read() == b"", "trailing bytes"
    return name, datum


def _matches(read: Any, expected: Any, where: str = "") -> None:
    """Compare what plain fastavro read with the value flowstream was given."""
    if isinstance(expected, BaseModel):
        assert isinstance(read, dict), where
        fields = {k: v for k, v in expected.__dict__.items() if k != "type" or k in read}
        assert set(read) == set(fields), where
        for key, value in fields.items():
            _matches(read[key], value, f"{where}.{key}")
    elif isinstance(expected, SecretStr):
        assert read == expected.get_secret_value(), where
    elif isinstance(expected, Enum):
        assert read == expected.value, where
    elif isinstance(expected, tuple):
        assert isinstance(read, list) and len(read) == len(expected), where
        for index, (left, right) in enumerate(zip(read, expected, strict=True)):
            _matches(left, right, f"{where}[{index}]")
    elif isinstance(read, bytes) and not isinstance(expected, bytes):
        assert json.loads(read) == expected, where  # a JSON value, as bytes
    elif isinstance(expected, datetime):
        assert isinstance(read, datetime) and read == expected, where
        assert read.utcoffset() is not None and read.utcoffset().total_seconds() == 0, where
    else:
        assert read == expected, where


def test_the_fingerprints_agree_with_flowstream() -> None:
    wire = ["flowstream.EventEnvelope"] + [
        f"flowstream.message.{type(m).__name__}" for m in sample_messages()
    ]
    for name in wire:
        schema = load_schema(str(SCHEMAS / f"{name}.avsc"))
        fp = bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))
        assert codec.default_codec().fingerprint(name) == fp, name
        assert plain_schemas()[fp][0] == name


@pytest.mark.parametrize("event", sample_events(), ids=lambda e: type(e).__name__)
def test_events_decode_without_flowstream(event: Any) -> None:
    original = envelope(event, sequence=9)
    name, datum = read_value(codec.encode_event(original))
    assert name == "flowstream.EventEnvelope"
    assert datum["run_id"] == "order-1" and datum["sequence"] == 9
    assert datum["event_id"] == "order-1:9"
    assert datum["timestamp"] == original.timestamp
    assert datum["schema_version"] == 1
    branch, fields = datum["event"]
    assert branch == f"flowstream.event.{type(event).__name__}"
    _matches(fields, event, branch)


@pytest.mark.parametrize("message", sample_messages(), ids=lambda m: type(m).__name__)
def test_messages_decode_without_flowstream(message: Any) -> None:
    name, datum = read_value(codec.encode_message(message))
    assert name == f"flowstream.message.{type(message).__name__}"
    _matches(datum, message, name)


def test_a_few_fields_by_hand() -> None:
    events = sample_events()
    _, created = read_value(codec.encode_event(envelope(events[0])))
    branch, fields = created["event"]
    assert branch == "flowstream.event.RunCreated"
    assert fields["spec"]["name"] == "order" and fields["spec"]["kind"] == "python"
    assert fields["spec"]["patch_markers"] == ["fix-tax", "v2.retry"]
    assert json.loads(fields["input"])["tags"] == ["a", "ü", "😀"]
    assert fields["parent"] == {
        "run_id": "parent-1",
        "child_id": "c1",
        "continued": False,
        "hop": 0,
        "reports_to": None,
        "root": None,
    }
    assert fields["depth"] == 2
    _, hook = read_value(codec.encode_event(envelope(events[22])))
    assert hook["event"][0] == "flowstream.event.HookCreated"
    assert hook["event"][1]["token_digest"] == "5e" * 32
    _, retry = read_value(codec.encode_event(envelope(events[10])))
    assert retry["event"][1]["retry"]["backoff"] == "exponential"
