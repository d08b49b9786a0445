"""Codec cost per event and per message: prints µs per encode and per decode, and bytes.

The event mix is one of each of the 27 event types with small realistic payloads; a typical
hot-path event (``step_completed`` with a small JSON output) is measured on its own too, next to
pydantic's own JSON as a yardstick. Usage: ``python benchmarks/codec_throughput.py [--n 20000]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from flowstream import codec
from flowstream.model.events import EventEnvelope, StepCompleted
from flowstream.model.messages import ResumeHook, SendSignal, StartRun
from flowstream.model.spec import WorkflowSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the event mix is the test samples
from tests.codec.samples import envelope, sample_events


def _per_call(function: Callable[[], Any], n: int, repeats: int = 5) -> float:
    """Best-of-``repeats`` µs per call (the minimum is the least disturbed by other load)."""
    runs = []
    for _ in range(repeats):
        began = time.perf_counter()
        for _ in range(n):
            function()
        runs.append((time.perf_counter() - began) / n * 1e6)
    return min(runs)


def _mix(values: list[Any], encode: Callable[[Any], bytes], decode: Callable[[bytes], Any], n: int):
    encoded = [encode(v) for v in values]
    rounds = max(1, n // len(values))

    def encode_all() -> None:
        for value in values:
            encode(value)

    def decode_all() -> None:
        for data in encoded:
            decode(data)

    return (
        _per_call(encode_all, rounds) / len(values),
        _per_call(decode_all, rounds) / len(values),
        statistics.mean(len(d) for d in encoded),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=20_000, help="calls per measurement")
    n = parser.parse_args().n
    codec.default_codec()  # schemas are parsed once, before timing

    hot = EventEnvelope(
        run_id="order-12345",
        sequence=7,
        event_id="order-12345:7",
        timestamp=datetime(2026, 3, 1, tzinfo=UTC) + timedelta(microseconds=7),
        event=StepCompleted(
            step_id="charge-card",
            output={"charge_id": "ch_123", "amount": 4200, "currency": "EUR", "ok": True},
        ),
    )
    data = codec.encode_event(hot)
    json_data = hot.model_dump_json()
    print(f"step_completed envelope ({len(data)} B Avro, {len(json_data)} B JSON):")
    print(f"  encode  {_per_call(lambda: codec.encode_event(hot), n):6.2f} µs")
    print(f"  decode  {_per_call(lambda: codec.decode_event(data), n):6.2f} µs")
    print(f"  pydantic model_dump_json      {_per_call(hot.model_dump_json, n):6.2f} µs")
    print(
        "  pydantic model_validate_json  "
        f"{_per_call(lambda: EventEnvelope.model_validate_json(json_data), n):6.2f} µs"
    )

    events = [envelope(e, sequence=i + 1) for i, e in enumerate(sample_events())]
    encode_us, decode_us, size = _mix(events, codec.encode_event, codec.decode_event, n)
    print(
        f"all 27 event types, mean: encode {encode_us:.2f} µs, decode {decode_us:.2f} µs, "
        f"{size:.0f} B"
    )

    spec = WorkflowSpec(name="order")
    messages = [
        StartRun(run_id="order-1", spec=spec, input={"qty": 3}),
        SendSignal(run_id="order-1", signal_id="s1", name="approve", payload={"by": "ann"}),
        ResumeHook(run_id="order-1", hook_id="approval", payload=True),
    ]
    encode_us, decode_us, size = _mix(messages, codec.encode_message, codec.decode_command, n)
    print(
        f"commands (start, signal, hook), mean: encode {encode_us:.2f} µs, "
        f"decode {decode_us:.2f} µs, {size:.0f} B"
    )


if __name__ == "__main__":
    main()
