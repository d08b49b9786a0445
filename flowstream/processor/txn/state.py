"""The states of one pipeline transaction, the transitions allowed between them, and what the
pipeline asks of its host. ``TransactionPipeline`` (``pipeline.py``) says what each state means."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from flowstream.processor.txn.slot import ProducerSlot, Record

__all__ = ["TRANSITIONS", "PipelineHost", "Txn", "TxnState"]


class TxnState(Enum):
    BEGUN = "begun"
    FENCING = "fencing"
    OPEN = "open"
    SEALED = "sealed"
    COMMITTED = "committed"
    ABORTED = "aborted"


TRANSITIONS: dict[TxnState, frozenset[TxnState]] = {
    TxnState.BEGUN: frozenset({TxnState.FENCING, TxnState.SEALED, TxnState.ABORTED}),
    TxnState.FENCING: frozenset({TxnState.OPEN, TxnState.SEALED, TxnState.ABORTED}),
    TxnState.OPEN: frozenset({TxnState.SEALED, TxnState.ABORTED}),
    TxnState.SEALED: frozenset({TxnState.COMMITTED, TxnState.ABORTED}),
    TxnState.COMMITTED: frozenset(),
    TxnState.ABORTED: frozenset(),
}


@dataclass(eq=False)
class Txn:
    """One Kafka transaction of the pipeline."""

    number: int
    slot: ProducerSlot
    state: TxnState = TxnState.BEGUN
    #: Its gate call (the last of them, if anchors were registered again): its records are
    #: produced once it returned.
    fence: Future[None] | None = None
    deferred: list[Record] = field(default_factory=list)
    #: The last record produced to each events partition, held back (``produce`` is not yet
    #: called) until the next one there or the seal, which writes the partition's positions
    #: onto it.
    tails: dict[int, Record] = field(default_factory=dict)
    #: Decisions were taken in it (it was not only begun ahead of them).
    decided: bool = False
    began: float = 0.0
    #: When it was begun on Kafka: the coordinator's timeout runs from about then.
    opened: float = 0.0
    commands: int = 0
    #: Begun right after a commit that carried decisions, and since when nothing joined it.
    eager: bool = False
    idle_since: float | None = None
    #: Set by its lane once its records are written: the next transaction may write.
    precommit: Future[None] | None = None
    commit: Future[None] | None = None
    sealed: Any = None

    def move(self, state: TxnState) -> None:
        if state not in TRANSITIONS[self.state]:
            raise AssertionError(f"transaction {self.number}: {self.state.name} -> {state.name}")
        self.state = state


class PipelineHost(Protocol):
    """What the pipeline asks of the processor."""

    def positions(self) -> list[Any]:
        """The consumer position of every command partition of every active partition."""

    def seal(self) -> Any:
        """The open transaction is sealed: set its staged state aside; returned to ``settled``."""

    def anchors(self, sealed: Any) -> list[int]:
        """Events partitions the next transaction registers early (where steps will report)."""

    def settled(self, sealed: Any, events_end: dict[int, int], start_steps: bool) -> None:
        """The sealed transaction committed: write its state, with the events offsets."""

    def aborted(self, failed: list[tuple[str, bytes | None]]) -> None:
        """Both transactions were aborted: throw the staged state away, rewind. ``failed``:
        the records whose produce failed, if that was the cause."""

    def retake(self, retake: bool) -> None:
        """The producers were replaced: drop every partition, and take the assigned ones again."""
