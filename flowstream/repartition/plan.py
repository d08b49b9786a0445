"""What a move needs before it copies anything: its names, its checks, its sources.

A :class:`MovePlan` names the old prefix (the *source*), the new one (the *target*), the target
topology (the declared topics with the new count) and the processors' group. Its checks raise
:class:`MoveError` with one sentence that says what to do: old topics missing or not
co-partitioned, a member of the group still on the old topics, a target that holds records of
something else or was the target of another move, an old partition that stays unstable.

The move's progress lives in its own consumer group (:attr:`MovePlan.move_id`): the position of
every old partition it reads, committed in the transactions that wrote the copies, each with the
move's mark and where the move began on that partition in its metadata. Its first transaction
commits the starting positions alone, so from then on the move is known and is resumed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from flowstream.errors import FlowError
from flowstream.kafka import clients
from flowstream.processor.txn.slot import transactional_ids
from flowstream.topology import (
    CMD_CANCEL,
    CMD_HOOK,
    CMD_SIGNAL,
    CMD_START,
    CMD_TIMER,
    EVENTS,
    Topology,
)
from flowstream.wire import RecordKind, kind_of, positions_of

__all__ = [
    "COPIED",
    "FORWARDED",
    "MoveError",
    "MovePlan",
    "Source",
    "offsets",
    "with_partitions",
]

LOG = logging.getLogger("flowstream.repartition")

#: Topics copied whole before any command topic exists.
COPIED = (EVENTS,)
#: Command topics: what the old group had not applied, then what still arrives, is forwarded.
FORWARDED = (CMD_START, CMD_SIGNAL, CMD_HOOK, CMD_CANCEL, CMD_TIMER)
#: The first word of the metadata of every position the move commits.
MARK = "flowstream-repartition"
#: Each Kafka request of the checks waits at most this long.
_REQUEST_S = 15.0
#: Answers about a partition that pass once its leader is known.
_LEADER_PASSING = frozenset(
    {
        clients.KafkaError.NOT_LEADER_FOR_PARTITION,
        clients.KafkaError.LEADER_NOT_AVAILABLE,
        clients.KafkaError.UNKNOWN_TOPIC_OR_PART,
        clients.KafkaError._UNKNOWN_PARTITION,
        clients.KafkaError._TIMED_OUT,
    }
)


class MoveError(FlowError):
    """A move cannot begin or go on; the message says why and what to do."""


def recorded_positions(
    bootstrap: str, topic: str, partitions: int, *, window: int = 2000
) -> dict[tuple[str, int], int]:
    """The command positions each partition of events topic ``topic`` recorded last (a
    ``positions`` record, or a record's ``flowstream-positions`` header), by (command topic,
    partition): read backwards from the end, ``window`` records at a time, until found."""
    ends = offsets(bootstrap, [(topic, p) for p in range(partitions)], latest=True)
    starts = offsets(bootstrap, [(topic, p) for p in range(partitions)], latest=False)
    consumer = clients.new_consumer(bootstrap, f"{topic}-positions-reader")
    found: dict[tuple[str, int], int] = {}
    try:
        for partition in range(partitions):
            end, low = ends[(topic, partition)], starts[(topic, partition)]
            last: dict[str, int] | None = None
            while last is None and end > low:
                start = max(low, end - window)
                consumer.assign([clients.TopicPartition(topic, partition, start)])
                deadline = time.monotonic() + _REQUEST_S
                while time.monotonic() < deadline:
                    for message in consumer.consume(500, 0.5):
                        if message.error() is not None or (message.offset() or 0) >= end:
                            continue
                        carried = positions_of(message, kind_of(message))
                        if carried is not None:
                            last = carried
                    at = consumer.position([clients.TopicPartition(topic, partition)])[0]
                    if at.offset >= end:
                        break
                end = start
            for command_topic, position in (last or {}).items():
                found[(command_topic, partition)] = position
    finally:
        consumer.close()
    return found


def offsets(
    bootstrap: str, tps: Iterable[tuple[str, int]], *, latest: bool, committed: bool = False
) -> dict[tuple[str, int], int]:
    """The earliest or latest offset of each partition, in one request per leader
    (``committed``: the latest is the last stable offset). A topic just created, or a leader
    just moved, answers "not leader" or "unknown partition" for a moment: asked again for up to
    a request's time. So is a partition answered with a negative offset: the admin client
    answers a request that timed out on a dead leader -1001 without an error (it is asked
    again with a new client, which looks the leader up afresh)."""
    admin = clients.new_admin(bootstrap)
    maker: Any = clients.OffsetSpec.latest if latest else clients.OffsetSpec.earliest
    spec = maker()
    level = (
        clients.IsolationLevel.READ_COMMITTED
        if committed
        else clients.IsolationLevel.READ_UNCOMMITTED
    )
    deadline = time.monotonic() + _REQUEST_S
    pending = list(dict.fromkeys(tps))
    found: dict[tuple[str, int], int] = {}
    while pending:
        asked = {clients.TopicPartition(topic, p): spec for topic, p in pending}
        futures = admin.list_offsets(asked, isolation_level=level, request_timeout=_REQUEST_S)
        pending = []
        unanswered = []
        for tp, future in futures.items():
            try:
                offset = int(future.result().offset)
                if offset >= 0:
                    found[(tp.topic, tp.partition)] = offset
                    continue
                if time.monotonic() > deadline:
                    raise MoveError(f"no offsets of {tp.topic}[{tp.partition}]: answered {offset}")
                unanswered.append((tp.topic, tp.partition))
            except clients.KafkaException as exc:
                error = exc.args[0] if exc.args else None
                passing = isinstance(error, clients.KafkaError) and (
                    error.retriable() or error.code() in _LEADER_PASSING
                )
                if not passing or time.monotonic() > deadline:
                    raise MoveError(f"no offsets of {tp.topic}[{tp.partition}]: {exc}") from None
                pending.append((tp.topic, tp.partition))
        if unanswered:
            admin = clients.new_admin(bootstrap)
            pending += unanswered
        if pending:
            time.sleep(0.1)
    return found


def with_partitions(topology: Topology, partitions: int) -> Topology:
    """``topology`` with every run-keyed topic at ``partitions`` partitions."""
    if partitions < 1:
        raise MoveError(f"a partition count must be at least 1, got {partitions}")
    specs = tuple(
        spec.model_copy(update={"partitions": partitions}) if spec.run_keyed else spec
        for spec in topology.topics
    )
    return topology.model_copy(update={"topics": specs})


@dataclass(slots=True)
class Source:
    """One old partition the move reads, and where it stands."""

    suffix: str
    topic: str
    partition: int
    #: Where the move began on it (the old group's position, for a command topic).
    start: int
    #: The next offset to copy or forward.
    position: int
    #: Where its records go: a topic, and the partition count that routes them there.
    dest: str
    dest_partitions: int
    #: The copy of this partition is complete (events only).
    copied: bool = False
    #: Only records of this kind are carried (``None``: every record).
    only: RecordKind | None = None
    #: Records copied from it by this run of the move.
    moved: int = 0


@dataclass(frozen=True)
class MovePlan:
    """A move from prefix ``source`` to prefix ``target``, whose topics are ``topology``'s."""

    bootstrap: str
    topology: Topology
    source: str
    target: str
    group: str
    #: The old topics' partition count, as found on the cluster.
    source_partitions: int
    replication_factor: int | None = None

    @property
    def partitions(self) -> int:
        """The new partition count."""
        return self.topology.run_partitions

    @property
    def move_id(self) -> str:
        """The move's consumer group and transactional id."""
        return f"{self.group}.repartition.{self.target}"

    @property
    def mark(self) -> str:
        return f"{MARK} {self.source}->{self.target} n={self.partitions}"

    def old(self, suffix: str) -> str:
        return self.topology.name(suffix, self.source)

    def new(self, suffix: str) -> str:
        return self.topology.name(suffix, self.target)

    def metadata(self, source: Source) -> str:
        """What a committed position of ``source`` says: the mark, the start, the phase."""
        return f"{self.mark} from={source.start}" + (" copied" if source.copied else "")

    def tps(self, suffixes: Iterable[str]) -> list[Any]:
        return [
            clients.TopicPartition(self.old(suffix), p)
            for suffix in suffixes
            for p in range(self.source_partitions)
        ]

    # -- the checks --------------------------------------------------------------------

    @classmethod
    def prepare(
        cls,
        bootstrap: str,
        topology: Topology,
        *,
        source: str,
        target: str,
        group: str,
        partitions: int | None = None,
        replication_factor: int | None = None,
        timeout: float = 30.0,
    ) -> MovePlan:
        """The plan, once the old topics are found co-partitioned under ``source``."""
        if source == target:
            raise MoveError(f"the target prefix must differ from the source ({source!r})")
        moved = with_partitions(topology, partitions or topology.run_partitions)
        moved.names(target)  # a target that makes no valid topic name fails here
        admin = clients.new_admin(bootstrap)
        metadata = _metadata(admin, bootstrap, timeout)
        counts: dict[str, int] = {}
        missing = []
        for spec in topology.topics:
            if not spec.run_keyed:
                continue
            name = spec.name(source)
            topic = metadata.topics.get(name)
            if topic is None or topic.error is not None:
                missing.append(name)
            else:
                counts[name] = len(topic.partitions)
        if missing:
            raise MoveError(
                f"topics of prefix {source!r} missing at {bootstrap}: {', '.join(missing)} "
                "(check --prefix)"
            )
        if len(set(counts.values())) != 1:
            found = ", ".join(f"{name}={n}" for name, n in counts.items())
            raise MoveError(f"the topics of prefix {source!r} are not co-partitioned: {found}")
        return cls(
            bootstrap,
            moved,
            source,
            target,
            group,
            next(iter(counts.values())),
            replication_factor,
        )

    def check_group_idle(self) -> None:
        """Raise while a member of the processors' group consumes an old topic (members on the
        new prefix, in the same group, are fine); a group in a rebalance is asked again."""
        old = {self.old(suffix) for suffix in FORWARDED}
        deadline = time.monotonic() + 5
        while True:
            try:
                described = clients.describe_group(self.bootstrap, self.group)
            except clients.KafkaException as exc:
                error = exc.args[0] if exc.args else None
                code = error.code() if isinstance(error, clients.KafkaError) else None
                if code == clients.KafkaError.GROUP_ID_NOT_FOUND:
                    return  # no such group: nobody consumes
                if code in clients.COORDINATOR_PASSING and time.monotonic() < deadline + 10:
                    time.sleep(0.2)  # a coordinator that is still loading, or moved
                    continue
                raise MoveError(f"group {self.group!r} could not be described: {exc}") from None
            on_old = []
            unassigned = 0
            for member in described.members:
                topics = set(member.assignment)
                if topics & old:
                    on_old.append(member.client_id or member.member_id)
                elif not topics:
                    unassigned += 1
            if on_old or (unassigned and time.monotonic() > deadline):
                count = len(on_old) + unassigned
                raise MoveError(
                    f"group {self.group!r} still has {count} active member(s) on the topics of "
                    f"{self.source!r} ({', '.join(sorted(on_old)) or 'joining'}): stop the old "
                    "processors first (a killed one leaves within its session timeout)"
                )
            if not unassigned:
                return
            time.sleep(0.2)

    def settle_old(self, timeout: float) -> None:
        """Abort what the old processors left open, as a new owner's fence does, and wait until
        every old partition the move reads is stable (nothing uncommitted below its end)."""
        tps = self.tps((*COPIED, *FORWARDED))
        if not self._unstable(tps):
            return
        writers = self._old_writers()
        if writers:
            ids = [t for writer in sorted(writers) for t in transactional_ids(self.group, writer)]
            with ThreadPoolExecutor(max_workers=min(16, len(ids))) as pool:
                list(pool.map(self._fence_one, ids))
            LOG.info("fenced the old writers %s", ", ".join(sorted(writers)))
        deadline = time.monotonic() + timeout
        while True:
            unstable = self._unstable(tps)
            if not unstable:
                return
            if time.monotonic() > deadline:
                where = ", ".join(f"{tp.topic}[{tp.partition}]" for tp in unstable[:4])
                raise MoveError(
                    f"{where} still hold an open transaction after {timeout:g} s: a processor of "
                    f"another group may still write there (stop it), or wait for the "
                    "transaction timeout and run the move again"
                )
            time.sleep(0.2)

    def _unstable(self, tps: Sequence[Any]) -> list[Any]:
        """The partitions whose last stable offset is below their high watermark."""
        wanted = [(tp.topic, tp.partition) for tp in tps]
        stable = offsets(self.bootstrap, wanted, latest=True, committed=True)
        high = offsets(self.bootstrap, wanted, latest=True)
        return [
            tp for tp in tps if stable[(tp.topic, tp.partition)] < high[(tp.topic, tp.partition)]
        ]

    def _old_writers(self) -> set[str]:
        """The writers the old group's last positions name (``processor.fence``)."""
        reader = clients.new_consumer(
            self.bootstrap, self.group, {"isolation.level": "read_uncommitted"}
        )
        try:
            found = reader.committed(self.tps(FORWARDED), timeout=_REQUEST_S)
        finally:
            reader.close()
        return {tp.metadata for tp in found if tp.metadata}

    def _fence_one(self, transactional_id: str) -> None:
        producer = clients.new_transactional_producer(self.bootstrap, transactional_id)
        try:
            producer.init_transactions(_REQUEST_S)
        except clients.KafkaException as exc:
            LOG.info("transactional id %s not fenced (%s)", transactional_id, exc)
        finally:
            producer.flush(0)

    # -- where the move stands ---------------------------------------------------------

    def sources(self) -> tuple[list[Source], bool]:
        """Every old partition the move reads, where it stands, and whether the move was begun
        before (``False``: a new move, whose target must hold nothing yet)."""
        begun = self.begun()
        if begun is not None:
            return begun, True
        self._check_target_empty()
        return self._fresh(), False

    def begun(self) -> list[Source] | None:
        """Every old partition the move reads and where it stands, if the move was begun."""
        suffixes = (*COPIED, *FORWARDED)
        reader = clients.new_consumer(self.bootstrap, self.move_id)
        try:
            found = reader.committed(self.tps(suffixes), timeout=_REQUEST_S)
        finally:
            reader.close()
        marks = {tp.metadata.split(" from=")[0] for tp in found if tp.metadata}
        foreign = marks - {self.mark}
        if foreign:
            raise MoveError(
                f"prefix {self.target!r} is the target of another move ({foreign.pop()}); "
                "choose another target prefix"
            )
        return [self._resumed(tp) for tp in found] if marks else None

    def _resumed(self, tp: Any) -> Source:
        suffix = tp.topic[len(self.source) + 1 :]
        words: dict[str, str] = {}
        for word in (tp.metadata or "").split(" ")[2:]:
            name, _, value = word.partition("=")
            words[name] = value
        start = int(words.get("from", 0) or 0)
        position = tp.offset if tp.offset >= 0 else start
        return Source(
            suffix,
            tp.topic,
            tp.partition,
            start,
            position,
            self.new(suffix),
            self.partitions,
            "copied" in words,
        )

    def _fresh(self) -> list[Source]:
        """The starting positions of a new move: the start of the copied topics, and on the
        command topics what the old processors had not applied yet: the later of the group's
        positions and those the old events partitions recorded last (the group's follow them
        outside the transactions, and lag when a processor died)."""
        reader = clients.new_consumer(self.bootstrap, self.group)
        try:
            applied = {
                (tp.topic, tp.partition): tp.offset
                for tp in reader.committed(self.tps(FORWARDED), timeout=_REQUEST_S)
            }
        finally:
            reader.close()
        recorded = recorded_positions(self.bootstrap, self.old(EVENTS), self.source_partitions)
        for at, position in recorded.items():
            if at in applied:
                applied[at] = max(applied[at], position)
        tps = self.tps((*COPIED, *FORWARDED))
        lows = offsets(self.bootstrap, [(tp.topic, tp.partition) for tp in tps], latest=False)
        sources = []
        for tp in tps:
            at = (tp.topic, tp.partition)
            start = max(lows[at], applied.get(at, -1))
            suffix = tp.topic[len(self.source) + 1 :]
            sources.append(
                Source(
                    suffix,
                    tp.topic,
                    tp.partition,
                    start,
                    start,
                    self.new(suffix),
                    self.partitions,
                )
            )
        return sources

    def mirrors(self) -> list[Source]:
        """The new events partitions and where the move stands on them: while commands are
        forwarded, the ``outcome`` records written there go back to the old events topic, where
        clients still on the old prefix wait for them (from the start: the copies and every
        other kind are skipped)."""
        reader = clients.new_consumer(self.bootstrap, self.move_id)
        tps = [clients.TopicPartition(self.new(EVENTS), p) for p in range(self.partitions)]
        try:
            found = reader.committed(tps, timeout=_REQUEST_S)
        finally:
            reader.close()
        return [
            Source(
                EVENTS,
                tp.topic,
                tp.partition,
                0,
                max(0, tp.offset),
                self.old(EVENTS),
                self.source_partitions,
                only=RecordKind.OUTCOME,
            )
            for tp in found
        ]

    def _check_target_empty(self) -> None:
        admin = clients.new_admin(self.bootstrap)
        metadata = _metadata(admin, self.bootstrap, _REQUEST_S)
        present = [
            (name, p)
            for name in self.topology.names(self.target).values()
            if name in metadata.topics
            for p in metadata.topics[name].partitions
        ]
        lows = offsets(self.bootstrap, present, latest=False)
        highs = offsets(self.bootstrap, present, latest=True)
        for at in present:
            if highs[at] > lows[at]:
                raise MoveError(
                    f"topic {at[0]} already holds records and no move to prefix "
                    f"{self.target!r} was begun: a move needs an empty target prefix"
                )


def _metadata(admin: Any, bootstrap: str, timeout: float) -> Any:
    try:
        return admin.list_topics(timeout=timeout)
    except clients.KafkaException:
        raise MoveError(
            f"no Kafka broker answered at {bootstrap} within {timeout:g} s (set --bootstrap)"
        ) from None
