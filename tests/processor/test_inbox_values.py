"""The stored form of a parked command: its bytes after the time it was parked."""

from __future__ import annotations

from flowstream import codec
from flowstream.model.messages import SendSignal
from flowstream.processor.inbox import _age, _parts, parked_value


def test_a_parked_value_keeps_the_time_and_the_command() -> None:
    raw = codec.encode_message(SendSignal(run_id="r1", signal_id="s1", name="go"))
    assert _parts(parked_value(1_700_000_000_123, raw)) == (1_700_000_000_123, raw)


def test_a_value_stored_before_parked_times_has_none() -> None:
    raw = codec.encode_message(SendSignal(run_id="r1", signal_id="s1", name="go"))
    assert raw.startswith(codec.MARKER)
    assert _parts(raw) == (None, raw)


def test_ages_read_in_the_largest_unit() -> None:
    assert [_age(s) for s in (2.04, 90, 7_200, 7 * 86_400)] == [
        "2.0 s",
        "1.5 min",
        "2.0 h",
        "7.0 d",
    ]
