"""``Continuation``: the chain of runs a run continues into, each created from a durable link.

A chain is bounded: a continuation that would be hop ``max_continuations`` + 1 of its chain is
refused before its link is appended (each run's link stores its hop, so the check reads nothing
else), so one drive, which follows and drives a chain to its active run, drives at most that many
hops. Every walk along a chain, forward to its active run or back to its root, refuses a cycle.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from flowstream.engine.cycle import ReplayCycle
from flowstream.errors import CorruptHistoryError, EventConflictError, LimitExceededError
from flowstream.model.base import json_equal
from flowstream.model.events import FlowEvent, ParentLink, RunContinuedAsNew, RunCreated
from flowstream.replay.state import RunState
from flowstream.stores.base import EventStore

__all__ = [
    "ChainWalk",
    "Continuation",
    "chain_hop",
    "chain_root",
    "linked_root",
    "reported_child",
    "same_link",
    "successor_link",
]


def chain_hop(state: RunState) -> int:
    """How many continuations lead from the root of ``state``'s chain to it (0 for a root)."""
    parent = state.parent
    return parent.hop if parent is not None and parent.continued else 0


def reported_child(state: RunState) -> tuple[str, str] | None:
    """(parent run id, child id) that ``state``'s chain resolves, when its link says so: a child
    root's own link, or a continuation that carries it."""
    link = state.parent
    if link is None or link.child_id is None:
        return None
    if not link.continued:
        return link.run_id, link.child_id
    return None if link.reports_to is None else (link.reports_to, link.child_id)


def linked_root(state: RunState) -> str | None:
    """The root of ``state``'s chain as its own link says (itself for a root), without reading
    another run: ``None`` only for a continuation whose link was written before links named
    their root."""
    link = state.parent
    if link is None or not link.continued:
        return state.run_id
    return link.root


def successor_link(state: RunState) -> ParentLink:
    """The link a continued ``state``'s successor is created with (carrying its chain's root,
    and the child its chain resolves, if any)."""
    reported = reported_child(state)
    return ParentLink(
        run_id=state.run_id,
        continued=True,
        hop=chain_hop(state) + 1,
        reports_to=None if reported is None else reported[0],
        child_id=None if reported is None else reported[1],
        root=linked_root(state),
    )


def same_link(found: ParentLink | None, expected: ParentLink) -> bool:
    """Whether a successor's stored link is the one ``expected`` of its predecessor: a link
    written before links named their root has none, and that is no difference."""
    if found is not None and found.root is None:
        found = found.model_copy(update={"root": expected.root})
    return found == expected


class ChainWalk:
    """One walk along a continuation chain from ``start``, which refuses to pass a run twice.

    A chain can only loop if the links in the store contradict each other (each successor's
    ``run_created`` is checked against the link that names it), so a cycle is a corrupt history.
    """

    def __init__(self, start: str, *, direction: str = "forward") -> None:
        self.start = start
        self.direction = direction
        self._seen = {start}

    def follow(self, run_id: str) -> None:
        """Take one hop, to ``run_id``."""
        if run_id in self._seen:
            raise CorruptHistoryError(
                f"the continuation chain has a cycle: walking {self.direction} from run "
                f"{self.start}, run {run_id} comes again after {len(self._seen) - 1} hops; the "
                "links in the store contradict each other, so these runs are not driven",
                run_id=self.start,
            )
        self._seen.add(run_id)


def chain_root(store: EventStore, state: RunState) -> RunState:
    """The first run of ``state``'s chain that ``store`` holds (the root, unless a predecessor
    lives in another store)."""
    walk = ChainWalk(state.run_id, direction="back")
    while state.parent is not None and state.parent.continued:
        predecessor = state.parent.run_id
        walk.follow(predecessor)
        if not store.exists(predecessor):
            break
        state = store.state(predecessor)
    return state


class Continuation(ReplayCycle):
    """Continuation chains: following, repairing and driving a run's successors."""

    def continuation_chain(self, run_id: str) -> list[str]:
        """``run_id`` and every successor after it, in order."""
        chain = [run_id]
        walk = ChainWalk(run_id)
        state = self.store.state(run_id)
        while state.outcome is not None and state.outcome.successor_run_id is not None:
            successor = state.outcome.successor_run_id
            walk.follow(successor)
            chain.append(successor)
            if not self.store.exists(successor):
                break
            state = self.store.state(successor)
        return chain

    async def _leaf(self, run_id: str) -> RunState:
        """The active run of ``run_id``'s continuation chain (repairing a missing successor)."""
        walk = ChainWalk(run_id)
        state = self.store.state(run_id)
        while state.outcome is not None and state.outcome.successor_run_id is not None:
            walk.follow(state.outcome.successor_run_id)
            self._ensure_successor(state)
            state = self.store.state(state.outcome.successor_run_id)
        return state

    def _check_continuation(self, state: RunState, events: Sequence[FlowEvent]) -> None:
        if not self._max_continuations:
            return
        if not any(isinstance(e, RunContinuedAsNew) for e in events):
            return
        hop = chain_hop(state) + 1
        if hop <= self._max_continuations:
            return
        root = linked_root(state) or chain_root(self.store, state).run_id
        raise LimitExceededError(
            f"run {state.run_id}: continuing as new would be hop {hop} of the continuation chain "
            f"of root {root}, beyond max_continuations={self._max_continuations}, so the link was "
            "not written. A workflow that continues without ever waiting spins: fix its code, or "
            "raise max_continuations (0 disables the limit) and retry the run",
            run_id=state.run_id,
        )

    def _ensure_successor(self, state: RunState) -> None:
        assert state.outcome is not None and state.outcome.successor_run_id is not None
        successor = state.outcome.successor_run_id
        created = RunCreated(
            spec=state.spec,
            input=state.continuation_input,
            parent=successor_link(state),
            depth=state.depth,
        )
        if not self.store.exists(successor):
            try:
                self.store.append_if_sequence(successor, 0, [created])
                return
            except EventConflictError:
                pass
        found = self.store.state(successor).history[0].event
        # A successor made before links carried their hop, root and the child their chain
        # resolves has none of them: they are derived from the predecessor, so they are not
        # part of what must match.
        derived = {"parent": {"hop", "reports_to", "child_id", "root"}}
        if not json_equal(
            found.model_dump(mode="json", exclude=derived),
            created.model_dump(mode="json", exclude=derived),
        ):
            raise CorruptHistoryError(
                f"run {successor} exists but is not the continuation of {state.run_id}: "
                "its run_created differs from the durable link",
                run_id=state.run_id,
            )

    async def _drive_chain(
        self, run_id: str, now: datetime | None, *, notify_parent: bool
    ) -> RunState:
        walk = ChainWalk(run_id)
        state = await self._drive_one(run_id, now, notify_parent=notify_parent)
        while state.outcome is not None and state.outcome.successor_run_id is not None:
            successor = state.outcome.successor_run_id
            walk.follow(successor)
            self._ensure_successor(state)
            state = await self._drive_one(successor, now, notify_parent=notify_parent)
        return state
