"""The models' ``JSON`` fields take and give exactly what pydantic's ``JsonValue`` does.

``JSON`` checks plain JSON in one pass of its own (``JsonValue`` calls a Python function for
every value of a payload) and hands anything else to ``JsonValue``: the same values pass, the
same conversions happen, the same values fail, and the same JSON comes out."""

from __future__ import annotations

import enum
import math
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import BaseModel, JsonValue, ValidationError

from flowstream.codec import AvroCodec
from flowstream.model.base import JSON, FrozenModel
from flowstream.model.commands import CompleteCommand
from flowstream.model.events import EventEnvelope, StepCompleted


class _Colour(enum.StrEnum):
    RED = "red"


class _Level(enum.IntEnum):
    HIGH = 3


class _Reference(BaseModel):
    value: JsonValue = None


class _Ours(FrozenModel):
    value: JSON = None


VALUES: list[Any] = [
    None,
    True,
    0,
    -(2**70),
    1.5,
    math.inf,
    "",
    "text ✓",
    [],
    {},
    [1, "a", None, [2.5, {"k": [True]}]],
    {"a": {"b": {"c": [1, {"d": None}]}}, "e": []},
    _Colour.RED,
    _Level.HIGH,
    {"colour": _Colour.RED, "levels": [_Level.HIGH]},
    (1, 2),
    [(1, 2)],
    {1: "int key"},
    {"nested": {2: "int key"}},
    {"a": object()},
    b"bytes",
    {"set": {1, 2}},
]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__ + ":" + repr(v)[:30])
def test_json_fields_accept_convert_and_refuse_as_json_value_does(value: Any) -> None:
    try:
        expected = _Reference(value=value)
    except ValidationError as exc:
        with pytest.raises(ValidationError) as ours:
            _Ours(value=value)
        assert [e["type"] for e in ours.value.errors()] == [e["type"] for e in exc.errors()]
        return
    got = _Ours(value=value)
    assert got.value == expected.value
    assert type(got.value) is type(expected.value)
    assert got.model_dump_json() == expected.model_dump_json()
    if value is math.inf:
        # In a Python dump in JSON mode, an infinite float is the null its JSON holds (it
        # stayed a float with ``JsonValue``); JSON itself is the same.
        assert got.model_dump(mode="json") == {"value": None}
    else:
        assert got.model_dump(mode="json") == expected.model_dump(mode="json")


def test_plain_json_is_kept_as_it_is_and_subclasses_become_plain() -> None:
    plain = {"a": [1, {"b": "c"}]}
    assert _Ours(value=plain).value is plain
    converted = _Ours(value={"colour": _Colour.RED}).value
    assert type(converted["colour"]) is str  # type: ignore[index]


def test_a_json_field_travels_as_json_bytes_in_the_event_codec() -> None:
    codec = AvroCodec()
    event = StepCompleted(step_id="s", output={"n": [1, 2.5, None], "t": "x"})
    envelope = EventEnvelope(
        run_id="r", sequence=1, event_id="e", timestamp=datetime.now(UTC), event=event
    )
    decoded = codec.decode_event(codec.encode_event(envelope))
    assert decoded == envelope
    assert decoded.event.output == {"n": [1, 2.5, None], "t": "x"}  # type: ignore[union-attr]
    assert CompleteCommand(output=[1, {"a": None}]).output == [1, {"a": None}]
