"""``event_head``: the run id, sequence and event type of an envelope, read from its first bytes.

It must agree with the full decode wherever it answers, hand every case it cannot read at a
glance to the full decode (``None``), and raise ``SerializationError`` for anything else.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from flowstream import codec
from flowstream.errors import SerializationError
from flowstream.model.events import RunStarted
from flowstream.model.messages import CancelRun
from tests.codec.samples import envelope, sample_events
from tests.codec.test_evolution import _as_v1


@pytest.mark.parametrize("event", sample_events(), ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("sequence", [1, 63, 64, 300, 2**40])
def test_the_head_is_what_the_full_decode_reads(event: Any, sequence: int) -> None:
    data = codec.encode_event(envelope(event, sequence, run_id="order-" + "é" * (sequence % 70)))
    decoded = codec.decode_event(data)
    head = codec.event_head(data)
    assert head is None or head == (decoded.run_id, decoded.sequence, decoded.event.type)
    if data[-2] < 0x80:
        assert head is not None


def test_long_run_ids_are_read() -> None:
    data = codec.encode_event(envelope(RunStarted(), 2, run_id="r" * 500))
    assert codec.event_head(data) == ("r" * 500, 2, "run_started")


def test_bytes_of_an_older_writer_schema_go_to_the_full_decode() -> None:
    old = _as_v1(codec.encode_event(envelope(RunStarted(), 5)))
    assert codec.event_head(old) is None
    assert codec.decode_event(old).sequence == 5


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"not avro", id="no-marker"),
        pytest.param(codec.MARKER + b"\x00" * 8 + b"\x02", id="unknown-fingerprint"),
        pytest.param(lambda: codec.encode_message(CancelRun(run_id="r1")), id="a-message"),
    ],
)
def test_what_is_not_an_envelope_raises(data: Any) -> None:
    with pytest.raises(SerializationError):
        codec.event_head(data() if callable(data) else data)


def test_a_truncated_record_raises_here_or_in_the_full_decode() -> None:
    data = codec.encode_event(envelope(RunStarted()))
    for size in range(len(data)):
        try:
            assert codec.event_head(data[:size]) is None
        except SerializationError:
            continue
        with pytest.raises(SerializationError):
            codec.decode_event(data[:size])


def test_corrupt_bytes_raise_or_are_left_to_the_full_decode() -> None:
    samples = [codec.encode_event(envelope(e, 7)) for e in sample_events()]
    rnd = random.Random(7)
    for _ in range(3000):
        data = bytearray(rnd.choice(samples))
        for _ in range(rnd.randint(1, 3)):
            data[rnd.randrange(len(data))] = rnd.randrange(256)
        if rnd.random() < 0.3:
            data = data[: rnd.randrange(len(data))]
        try:
            head = codec.event_head(bytes(data))
        except SerializationError:
            continue
        if head is not None:
            run_id, sequence, kind = head
            assert isinstance(run_id, str) and sequence >= 1 and isinstance(kind, str)
