"""The codec writes a datum with fastavro's compiled writer when this fastavro has it as
expected (``codec._write_datum``), and with ``schemaless_writer`` otherwise: both give the same
bytes, and a value neither can write fails the same way through either."""

from __future__ import annotations

from typing import Any

import pytest

from flowstream import codec
from flowstream.errors import SerializationError
from flowstream.model.messages import CommandOutcome, OutcomeStatus
from tests.codec.samples import envelope, sample_events


def _encodings() -> list[bytes]:
    fresh = codec.AvroCodec()
    events = [fresh.encode_event(envelope(event)) for event in sample_events()]
    outcome = CommandOutcome(
        command_id="c-1", key="run-1", command="start_run", status=OutcomeStatus.APPLIED
    )
    return [*events, fresh.encode_message(outcome)]


def test_both_writers_give_the_same_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    assert codec._write_datum is not None  # this fastavro has the compiled writer
    fast = _encodings()
    monkeypatch.setattr(codec, "_write_datum", None)
    assert _encodings() == fast


@pytest.mark.parametrize("fast", [True, False])
def test_a_value_neither_writes_fails_alike(fast: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not fast:
        monkeypatch.setattr(codec, "_write_datum", None)
    wrong: Any = 7  # not a string: pydantic would refuse it, model_construct does not
    outcome = CommandOutcome.model_construct(
        command_id="c-1", key=wrong, command="start_run", status=OutcomeStatus.APPLIED
    )
    with pytest.raises(SerializationError, match="must be string on field key"):
        codec.AvroCodec().encode_message(outcome)


@pytest.mark.parametrize(
    "fields",
    [
        {"command_id": "c-1", "key": "run-1", "command": "start_run", "status": "applied"},
        {
            "command_id": "c-2",
            "key": "run-2",
            "command": "send_signal",
            "status": "forwarded",
            "reason": "sent on to run run-3",
            "forwarded_to": "run-3",
            "source": "t.cmd.signal[4]@17",
        },
        {
            "command_id": "c-3",
            "key": "d" * 64,
            "command": "resume_hook",
            "status": "rejected",
            "reason": "no hook ✓",
            "error_kind": "InvalidTransitionError",
            "source": "inbox",
        },
    ],
)
def test_an_outcome_from_its_fields_is_the_encoding_of_the_model(fields: dict[str, Any]) -> None:
    """``encode_outcome`` (the processor's, without building the model) writes the very bytes
    of the validated ``CommandOutcome``, which decode back to it."""
    fresh = codec.AvroCodec()
    status = OutcomeStatus(fields["status"])
    model = CommandOutcome.model_validate({**fields, "status": status})
    data = fresh.encode_outcome(**{**fields, "status": status})
    assert data == fresh.encode_message(model)
    assert fresh.decode_outcome(data) == model
