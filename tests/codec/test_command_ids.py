"""Command ids and outcomes on the wire: a command written before command ids still decodes
(without one), and a ``CommandOutcome`` round-trips."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import fastavro
import pytest
from fastavro.schema import fingerprint, load_schema, to_parsing_canonical_form
from pydantic import BaseModel, SecretStr

from flowstream import codec
from flowstream.codec import MARKER
from flowstream.errors import SerializationError
from flowstream.model.messages import (
    CancelRun,
    CommandOutcome,
    DisposeHook,
    OutcomeStatus,
    ResumeHook,
    RetryRun,
    SendSignal,
    StartRun,
)
from tests.codec.samples import SPEC

HISTORY = Path(__file__).resolve().parents[2] / "schemas" / "history"

#: Each client command with its last schema before command ids.
BEFORE: list[tuple[BaseModel, str]] = [
    (StartRun(run_id="r-1", spec=SPEC, input={"a": 1}, command_id="c-1"), "StartRun.v3"),
    (SendSignal(run_id="r-1", signal_id="s", name="go", command_id="c-2"), "SendSignal.v1"),
    (
        ResumeHook(token=SecretStr("tok"), payload=[1], command_id="c-3"),
        "ResumeHook.v1",
    ),
    (DisposeHook(run_id="r-1", hook_id="h", command_id="c-4"), "DisposeHook.v1"),
    (CancelRun(run_id="r-1", reason="x", force=True, command_id="c-5"), "CancelRun.v1"),
    (RetryRun(run_id="r-1", command_id="c-6"), "RetryRun.v1"),
]


def _old_bytes(current: bytes, history: str) -> bytes:
    """``current`` re-written with the schema kept in history (resolution drops command_id)."""
    old = load_schema(str(HISTORY / f"flowstream.message.{history}.avsc"))
    fp = bytes.fromhex(fingerprint(to_parsing_canonical_form(old), "CRC-64-AVRO"))
    name = history.split(".")[0]
    new = load_schema(str(HISTORY.parent / f"flowstream.message.{name}.avsc"))
    datum: Any = fastavro.schemaless_reader(io.BytesIO(current[10:]), new, old)
    buffer = io.BytesIO()
    buffer.write(MARKER + fp)
    fastavro.schemaless_writer(buffer, old, datum)
    return buffer.getvalue()


@pytest.mark.parametrize(("command", "history"), BEFORE, ids=[h for _, h in BEFORE])
def test_a_command_written_before_command_ids_decodes_without_one(
    command: BaseModel, history: str
) -> None:
    current = codec.encode_message(command)  # type: ignore[arg-type]
    assert codec.decode_command(current) == command
    old = _old_bytes(current, history)
    assert old[2:10] != current[2:10]
    assert codec.decode_command(old) == command.model_copy(update={"command_id": None})


def test_an_outcome_round_trips_and_is_no_command() -> None:
    outcome = CommandOutcome(
        command_id="c-1",
        key="r-1",
        command="start_run",
        status=OutcomeStatus.REJECTED,
        reason="run r-1 exists with another input",
        error_kind="RunConflictError",
        source="p.cmd.start[3]@17",
    )
    data = codec.encode_message(outcome)
    assert codec.decode_outcome(data) == outcome
    assert outcome.final
    with pytest.raises(SerializationError):
        codec.decode_command(data)
    parked = outcome.model_copy(update={"status": OutcomeStatus.PARKED})
    assert not parked.final


def test_a_command_id_is_an_identifier() -> None:
    with pytest.raises(ValueError, match="command id"):
        SendSignal(run_id="r", signal_id="s", name="n", command_id="")
