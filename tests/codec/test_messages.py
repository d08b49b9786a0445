"""The command message models: validation, the discriminated union, immutability."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from flowstream.model.messages import (
    CancelRun,
    CommandMessage,
    DeadLetter,
    FireTimer,
    ResolveChild,
    SendSignal,
    StartRun,
)
from tests.codec.samples import COMMAND_TYPES, OUTCOME, SPEC, T0, sample_messages

ADAPTER: TypeAdapter[Any] = TypeAdapter(CommandMessage)


def test_the_union_holds_the_eleven_commands_and_not_the_dead_letter() -> None:
    assert {t.__name__ for t in COMMAND_TYPES} == {
        "StartRun",
        "SendSignal",
        "ResumeHook",
        "DisposeHook",
        "CancelRun",
        "RetryRun",
        "FireTimer",
        "ResolveChild",
        "RegisterHookToken",
        "ReleaseHookToken",
        "HookTokenRejected",
    }
    assert DeadLetter not in COMMAND_TYPES


# JSON dumps mask a hook token, so messages carrying one cannot round-trip through JSON
JSON_SAFE = [
    m
    for m in sample_messages()
    if not isinstance(m, DeadLetter) and getattr(m, "token", None) is None
]


@pytest.mark.parametrize("message", JSON_SAFE, ids=lambda m: type(m).__name__)
def test_the_union_picks_the_type_from_json(message: Any) -> None:
    assert ADAPTER.validate_json(message.model_dump_json()) == message


def test_run_ids_and_identifiers_are_validated() -> None:
    for bad in ("", "has space", "x" * 201, "dots.are.out"):
        with pytest.raises(ValidationError, match="invalid run id"):
            CancelRun(run_id=bad)
    with pytest.raises(ValidationError, match="invalid run id"):
        ResolveChild(run_id="p", child_id="c", child_run_id="bad id", outcome=OUTCOME)
    with pytest.raises(ValidationError, match="invalid signal id"):
        SendSignal(run_id="r", signal_id="", name="go")
    with pytest.raises(ValidationError, match="invalid timer subject id"):
        FireTimer(run_id="r", kind="wait", subject_id="a\nb", due=T0)
    with pytest.raises(ValidationError, match="kind"):
        FireTimer(run_id="r", kind="sleep", subject_id="w", due=T0)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="depth"):
        StartRun(run_id="r", spec=SPEC, depth=-1)


def test_messages_are_frozen_and_closed() -> None:
    start = StartRun(run_id="r", spec=SPEC)
    with pytest.raises(ValidationError):
        start.run_id = "other"  # type: ignore[misc]
    with pytest.raises(ValidationError, match="Extra inputs"):
        StartRun(run_id="r", spec=SPEC, priority=1)  # type: ignore[call-arg]


def test_dead_letter_positions_are_checked() -> None:
    with pytest.raises(ValidationError):
        DeadLetter(source_topic="t", partition=-1, offset=0, reason="x")
    with pytest.raises(ValidationError):
        DeadLetter(source_topic="", partition=0, offset=0, reason="x")
    letter = DeadLetter(source_topic="t", partition=0, offset=0, reason="undecodable")
    assert letter.key is None and letter.value is None and letter.headers == ()
