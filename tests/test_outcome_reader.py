"""``OutcomeReader`` and ``answer``, over a fake consumer (pure logic: which partition and offset
it reads next, which records of the events partition it takes, and what an outcome means). The
broker-backed tests are in ``tests/kafka/test_command_outcomes.py``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from flowstream import codec, wire
from flowstream.errors import (
    CommandParkedError,
    FlowError,
    InvalidInputError,
    RunConflictError,
    RunNotFoundError,
    RunNotStartedError,
)
from flowstream.model.messages import CommandOutcome, OutcomeStatus
from flowstream.outcomes import OutcomeReader, answer
from flowstream.partitioning import partition_for
from flowstream.settings import Settings

PARTITIONS = 8


@dataclass
class Message:
    data: bytes
    at: int
    ms: int
    head: list[tuple[str, bytes]] = field(default_factory=list)

    def value(self) -> bytes:
        return self.data

    def headers(self) -> list[tuple[str, bytes]]:
        return self.head

    def error(self) -> None:
        return None

    def offset(self) -> int:
        return self.at

    def timestamp(self) -> tuple[int, int]:
        return (1, self.ms)


@dataclass
class FakeConsumer:
    logs: dict[int, list[Message]] = field(default_factory=dict)
    assigned: list[tuple[int, int]] = field(default_factory=list)

    def add(self, partition: int, outcome: CommandOutcome, ms: int = 1_000_000) -> None:
        """An ``outcome`` record, after a record of another kind that names the same command (an
        event, a parked command): the reader passes over those."""
        log = self.logs.setdefault(partition, [])
        value = wire.outcome_value(outcome.command_id, codec.encode_message(outcome))
        log.append(Message(codec.MARKER + value, len(log), ms))
        inbox = wire.inbox_value(outcome.key, outcome.command_id, value)
        log.append(Message(inbox, len(log), ms, [(wire.RECORD_HEADER, b"inbox")]))
        log.append(Message(value, len(log), ms, list(wire.OUTCOME_HEADERS)))

    def assign(self, tps: list[Any]) -> None:
        (tp,) = tps
        self.assigned.append((tp.partition, tp.offset))
        self._at = (tp.partition, tp.offset)

    def consume(self, count: int, timeout: float) -> list[Message]:
        partition, offset = self._at
        found = self.logs.get(partition, [])[offset : offset + count]
        self._at = (partition, offset + len(found))
        return found

    def poll(self, timeout: float) -> Message | None:
        found = self.consume(1, timeout)
        return found[0] if found else None

    def get_watermark_offsets(self, tp: Any, timeout: float, cached: bool) -> tuple[int, int]:
        return 0, len(self.logs.get(tp.partition, []))

    def offsets_for_times(self, tps: list[Any], timeout: float) -> list[Any]:
        (tp,) = tps
        log = self.logs.get(tp.partition, [])
        first = next((m.at for m in log if m.ms >= tp.offset), -1)
        return [type("TP", (), {"offset": first})()]


def outcome(status: OutcomeStatus, key: str = "r-1", **fields: Any) -> CommandOutcome:
    return CommandOutcome(command_id="c-1", key=key, command="resume_hook", status=status, **fields)


def reader(fake: FakeConsumer) -> OutcomeReader:
    made = OutcomeReader(Settings(bootstrap="nowhere:1"), "p.events", PARTITIONS)
    made._consumer = fake
    return made


def _two_keys(same: bool) -> tuple[str, str]:
    first = "digest-0"
    for i in range(1000):
        key = f"run-{i}"
        if (partition_for(key, PARTITIONS) == partition_for(first, PARTITIONS)) == same:
            return first, key
    raise AssertionError("no such key")


@pytest.mark.parametrize("same", [True, False], ids=["same-partition", "other-partition"])
def test_a_forward_is_followed_to_the_partition_of_the_run_it_names(same: bool) -> None:
    digest, run_id = _two_keys(same)
    fake = FakeConsumer()
    source, target = partition_for(digest, PARTITIONS), partition_for(run_id, PARTITIONS)
    other = CommandOutcome(
        command_id="c-other", key=run_id, command="send_signal", status=OutcomeStatus.APPLIED
    )
    fake.add(target, other)
    fake.add(source, outcome(OutcomeStatus.FORWARDED, key=digest, forwarded_to=run_id))
    fake.add(target, outcome(OutcomeStatus.APPLIED, key=run_id))
    found = reader(fake).wait("c-1", digest, source, 0, deadline=float("inf"))
    assert (found.status, found.key) == (OutcomeStatus.APPLIED, run_id)
    assert fake.assigned[0] == (source, 0)
    assert fake.assigned[1] == ((source, 6) if same else (target, 0))


def test_no_outcome_in_time_says_which_partition_has_no_processor() -> None:
    with pytest.raises(TimeoutError, match="partition 3"):
        reader(FakeConsumer()).wait("c-1", "r-1", 3, 0, deadline=0)


def test_an_outcome_means_a_return_or_the_embedded_engine_s_error() -> None:
    applied = outcome(OutcomeStatus.APPLIED)
    assert answer(applied) is applied
    assert answer(outcome(OutcomeStatus.NOOP)).status is OutcomeStatus.NOOP
    for kind, error in [
        ("RunConflictError", RunConflictError),
        ("InvalidInputError", InvalidInputError),
        ("RunNotFoundError", RunNotFoundError),
        ("NoSuchErrorClass", FlowError),
        (None, FlowError),
    ]:
        rejected = outcome(OutcomeStatus.REJECTED, reason="why not", error_kind=kind)
        with pytest.raises(error, match="why not") as raised:
            answer(rejected)
        assert type(raised.value) is error and raised.value.run_id == "r-1"
    parked = outcome(
        OutcomeStatus.PARKED, reason="run does not exist yet", error_kind="RunNotFoundError"
    )
    with pytest.raises(RunNotStartedError, match="does not exist \\(yet\\)") as not_started:
        answer(parked)
    assert isinstance(not_started.value, RunNotFoundError)
    waiting = outcome(OutcomeStatus.PARKED, reason="build b-2 is not served")
    with pytest.raises(CommandParkedError, match="build b-2 is not served") as built:
        answer(waiting)
    assert not isinstance(built.value, RunNotFoundError)


def test_a_chain_that_comes_back_to_a_partition_is_followed_to_its_end() -> None:
    """A control sent to a chain's root goes on hop by hop; when a later hop lives on a
    partition an earlier one forwarded from, the earlier forward (of the same command, in the
    window the reader jumps to) is not followed again: only the answer of the run it went to."""
    root = "root-0"
    home = partition_for(root, PARTITIONS)
    second = next(
        k for k in (f"hop-{i}" for i in range(1000)) if partition_for(k, PARTITIONS) != home
    )
    third = next(
        k for k in (f"leaf-{i}" for i in range(1000)) if partition_for(k, PARTITIONS) == home
    )
    away = partition_for(second, PARTITIONS)
    fake = FakeConsumer()
    fake.add(home, outcome(OutcomeStatus.FORWARDED, key=root, forwarded_to=second))
    fake.add(away, outcome(OutcomeStatus.FORWARDED, key=second, forwarded_to=third))
    fake.add(home, outcome(OutcomeStatus.APPLIED, key=third))
    found = reader(fake).wait("c-1", root, home, 0, deadline=float("inf"))
    assert (found.status, found.key) == (OutcomeStatus.APPLIED, third)
