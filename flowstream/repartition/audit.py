"""The audit of a move: the old and the new topics read back and compared.

For each moved topic (events, the command topics) the moved range of every old
partition is the move's: from where it began to its committed position. Every record of those
ranges that :func:`~flowstream.repartition.pump.route` carries over must be on the new topic
exactly once, as a copy naming it, on its key's new partition, with the same key, value,
timestamp and headers, in the same order per key as on the old topic, and (events) before any
record the new processors wrote for that key. Records on an old partition past the moved range
are reported: written after the copy (a processor left running) or after forwarding stopped.
Every run's history on the new events topic, copies and new events together, must have
contiguous sequences from 1; the runs that ended and those still open are counted.

Memory holds a running digest and a count per key (a run, a token digest), not the records.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from flowstream import codec, wire
from flowstream.errors import SerializationError
from flowstream.kafka import clients
from flowstream.repartition.plan import (
    COPIED,
    FORWARDED,
    MoveError,
    MovePlan,
    Source,
    offsets,
)
from flowstream.repartition.pump import copied_from, original_headers, route
from flowstream.topology import EVENTS

__all__ = ["MoveAudit", "TopicAudit", "audit_move"]

#: Event types that end a run's history.
TERMINAL = frozenset(
    {"run_completed", "run_failed", "run_cancelled", "run_timed_out", "run_continued_as_new"}
)
#: Problems listed per topic (the count says how many there were).
_LISTED = 10
#: A read that makes no progress for this long fails.
_STALL_S = 60.0


@dataclass(slots=True)
class TopicAudit:
    """One moved topic: how many records were to be carried over, how many copies were found."""

    suffix: str
    records: int = 0
    copies: int = 0
    keys: int = 0
    #: Records written back to the old topic (outcomes for clients still on the old prefix).
    mirrored: int = 0
    problems: list[str] = field(default_factory=list)
    problem_count: int = 0

    def problem(self, text: str) -> None:
        self.problem_count += 1
        if len(self.problems) < _LISTED:
            self.problems.append(text)


@dataclass(slots=True)
class MoveAudit:
    """The verdict on a move."""

    topics: list[TopicAudit] = field(default_factory=list)
    runs: int = 0
    ended: int = 0
    open_runs: list[str] = field(default_factory=list)
    history: TopicAudit = field(default_factory=lambda: TopicAudit("histories"))

    @property
    def ok(self) -> bool:
        return not self.history.problem_count and not any(t.problem_count for t in self.topics)

    def lines(self) -> list[str]:
        """The verdict as lines to print."""
        out = []
        for topic in (*self.topics, self.history):
            if topic is self.history:
                head = (
                    f"runs: {self.runs} on the new events topic, {self.ended} ended, "
                    f"{self.runs - self.ended} open"
                )
            else:
                head = (
                    f"{topic.suffix}: {topic.records} records moved, {topic.copies} copies "
                    f"found, {topic.keys} keys"
                    + (f", {topic.mirrored} written back" if topic.mirrored else "")
                )
            verdict = f"{topic.problem_count} problem(s)" if topic.problem_count else "ok"
            out.append(f"{head}: {verdict}")
            out.extend(f"    {problem}" for problem in topic.problems)
        out.append("audit: " + ("ok" if self.ok else "FAILED"))
        return out


def _digest(message: Any) -> bytes:
    kind, at_ms = message.timestamp()
    parts = [
        bytes(message.key() or b""),
        bytes(message.value() or b""),
        str(at_ms if kind else "").encode(),
        *(key.encode() + b"=" + value for key, value in original_headers(message)),
    ]
    return hashlib.blake2b(b"\0".join(parts), digest_size=16).digest()


class _Chains:
    """A running digest and a count per key."""

    def __init__(self) -> None:
        self.of: dict[bytes, list[Any]] = {}

    def add(self, key: bytes, message: Any) -> None:
        found = self.of.get(key)
        if found is None:
            found = self.of[key] = [0, b""]
        found[0] += 1
        found[1] = hashlib.blake2b(found[1] + _digest(message), digest_size=16).digest()


def _key(message: Any, old_partition: int) -> bytes:
    key = message.key()
    return bytes(key) if key else b"\0#%d" % old_partition


def _scan(consumer: Any, topic: str, ranges: dict[int, tuple[int, int]]) -> Iterator[Any]:
    """The records of ``topic`` in ``ranges`` (partition -> [start, end)), read committed."""
    pending = {p: r for p, r in ranges.items() if r[0] < r[1]}
    if not pending:
        return
    consumer.assign([clients.TopicPartition(topic, p, r[0]) for p, r in pending.items()])
    progress = time.monotonic()
    try:
        while pending:
            messages = consumer.consume(1000, timeout=0.2)
            for message in messages:
                if message.error() is not None:
                    continue
                p = int(message.partition())
                if p in pending and int(message.offset()) < pending[p][1]:
                    progress = time.monotonic()
                    yield message
            for tp in consumer.position([clients.TopicPartition(topic, p) for p in pending]):
                if tp.offset >= pending[tp.partition][1]:
                    del pending[tp.partition]
            if time.monotonic() - progress > _STALL_S:
                raise MoveError(f"reading {topic} made no progress for {_STALL_S:g} s")
    finally:
        consumer.unassign()


def audit_move(plan: MovePlan) -> MoveAudit:
    """Compare the old and the new topics of ``plan``'s move (begun: its group knows it)."""
    sources = plan.begun()
    if sources is None:
        raise MoveError(f"no move from {plan.source!r} to {plan.target!r} was begun")
    reader = clients.new_consumer(plan.bootstrap, f"{plan.move_id}-audit")
    audit = MoveAudit()
    try:
        for suffix in (*COPIED, *FORWARDED):
            mine = [s for s in sources if s.suffix == suffix]
            audit.topics.append(_audit_topic(plan, suffix, mine, reader, audit))
    finally:
        reader.close()
    return audit


def _ends(plan: MovePlan, topic: str, partitions: int) -> dict[int, int]:
    found = offsets(plan.bootstrap, [(topic, p) for p in range(partitions)], latest=True)
    return {p: found[(topic, p)] for p in range(partitions)}


def _audit_topic(
    plan: MovePlan,
    suffix: str,
    sources: list[Source],
    reader: Any,
    audit: MoveAudit,
) -> TopicAudit:
    result = TopicAudit(suffix)
    old_topic = plan.old(suffix)
    ranges = {s.partition: (s.start, s.position) for s in sources}
    old = _Chains()
    for message in _scan(reader, old_topic, ranges):
        if route(message, plan.partitions) is not None:
            result.records += 1
            old.add(_key(message, int(message.partition())), message)
    new_topic = plan.new(suffix)
    old_ends = _ends(plan, old_topic, plan.source_partitions)
    later = {p: (end, old_ends[p]) for p, (_, end) in ranges.items() if old_ends[p] > end}
    unmoved: dict[int, int] = {}
    for message in _scan(reader, old_topic, later):
        origin = copied_from(message)
        if origin is not None and origin[0] == new_topic:
            result.mirrored += 1  # an outcome written back for a client on the old prefix
        else:
            p = int(message.partition())
            unmoved[p] = unmoved.get(p, 0) + 1
    for p, count in sorted(unmoved.items()):
        when = "the copy" if suffix in COPIED else "forwarding stopped"
        result.problem(
            f"{old_topic}[{p}] has {count} record(s) written after {when}, not moved (run the "
            "move again to move them)"
        )
    new = _Chains()
    native: set[bytes] = set()
    new_ends = _ends(plan, new_topic, plan.partitions)
    histories: dict[str, list[Any]] = {}
    for message in _scan(reader, new_topic, {p: (0, end) for p, end in new_ends.items()}):
        if suffix == EVENTS:
            _follow(message, histories, audit)
        origin = copied_from(message)
        if origin is None or origin[0] != old_topic:
            if suffix == EVENTS and message.key():
                native.add(bytes(message.key()))
            continue
        _, old_partition, offset = origin
        key = _key(message, old_partition)
        result.copies += 1
        start, end = ranges.get(old_partition, (0, 0))
        where = f"{new_topic}[{message.partition()}]@{message.offset()}"
        if not start <= offset < end:
            result.problem(f"{where} is a copy of {old_topic}[{old_partition}]@{offset}, not moved")
        if route(message, plan.partitions) != int(message.partition()):
            result.problem(f"{where} is not on the partition of its key")
        if suffix == EVENTS and key in native:
            result.problem(f"{where}: a record written on {plan.target!r} precedes this copy")
        new.add(key, message)
    result.keys = len(old.of)
    for key in sorted(old.of.keys() | new.of.keys()):
        was, now = old.of.get(key), new.of.get(key)
        name = key.decode(errors="replace")
        if was is None or now is None or was[0] != now[0]:
            result.problem(
                f"key {name}: {was[0] if was else 0} record(s) moved, {now[0] if now else 0} "
                "copies found"
            )
        elif was[1] != now[1]:
            result.problem(f"key {name}: the copies differ from the records or their order")
    if suffix == EVENTS:
        audit.runs = len(histories)
        audit.ended = sum(1 for last in histories.values() if last[1] in TERMINAL)
        audit.open_runs = sorted(r for r, last in histories.items() if last[1] not in TERMINAL)
    return result


def _follow(message: Any, histories: dict[str, list[Any]], audit: MoveAudit) -> None:
    """Check that an event record of the new topic follows its run's history."""
    if wire.kind_of(message) is not wire.RecordKind.EVENT:
        return
    value = bytes(message.value() or b"")
    head = codec.event_head(value)
    if head is None:
        try:
            envelope = codec.decode_event(value)
        except SerializationError as exc:
            where = f"{message.topic()}[{message.partition()}]@{message.offset()}"
            audit.history.problem(f"{where} does not decode: {exc}")
            return
        head = (envelope.run_id, envelope.sequence, envelope.event.type)
    run_id, sequence, kind = head
    last = histories.setdefault(run_id, [0, ""])
    if sequence != last[0] + 1:
        audit.history.problem(f"run {run_id}: sequence {sequence} follows {last[0]}")
    last[0] = max(last[0], sequence)
    last[1] = kind
