"""``Continuation``: the chain of runs a run continues into, each created from a durable link."""

from __future__ import annotations

from datetime import datetime

from flowstream.engine.cycle import ReplayCycle
from flowstream.errors import EventConflictError, InvalidTransitionError
from flowstream.model.base import json_equal
from flowstream.model.events import ParentLink, RunCreated
from flowstream.replay.state import RunState

__all__ = ["Continuation"]


class Continuation(ReplayCycle):
    """Continuation chains: following, repairing and driving a run's successors."""

    def continuation_chain(self, run_id: str) -> list[str]:
        """``run_id`` and every successor after it, in order."""
        chain = [run_id]
        state = self.store.state(run_id)
        while state.outcome is not None and state.outcome.successor_run_id is not None:
            successor = state.outcome.successor_run_id
            if successor in chain:
                raise InvalidTransitionError("continuation chain has a cycle", run_id=run_id)
            chain.append(successor)
            if not self.store.exists(successor):
                break
            state = self.store.state(successor)
        return chain

    async def _leaf(self, run_id: str) -> RunState:
        """The active run of ``run_id``'s continuation chain (repairing a missing successor)."""
        state = self.store.state(run_id)
        seen = {run_id}
        while state.outcome is not None and state.outcome.successor_run_id is not None:
            successor = state.outcome.successor_run_id
            if successor in seen:
                raise InvalidTransitionError("continuation chain has a cycle", run_id=run_id)
            seen.add(successor)
            self._ensure_successor(state)
            state = self.store.state(successor)
        return state

    def _ensure_successor(self, state: RunState) -> None:
        assert state.outcome is not None and state.outcome.successor_run_id is not None
        successor = state.outcome.successor_run_id
        created = RunCreated(
            spec=state.spec,
            input=state.continuation_input,
            parent=ParentLink(run_id=state.run_id, continued=True),
            depth=state.depth,
        )
        if not self.store.exists(successor):
            try:
                self.store.append_if_sequence(successor, 0, [created])
                return
            except EventConflictError:
                pass
        found = self.store.state(successor).history[0].event
        if not json_equal(found.model_dump(mode="json"), created.model_dump(mode="json")):
            raise InvalidTransitionError(
                f"run {successor} exists but is not the continuation of {state.run_id}: "
                "its run_created differs from the durable link",
                run_id=state.run_id,
            )

    async def _drive_chain(
        self, run_id: str, now: datetime | None, *, notify_parent: bool
    ) -> RunState:
        state = await self._drive_one(run_id, now, notify_parent=notify_parent)
        while state.outcome is not None and state.outcome.successor_run_id is not None:
            self._ensure_successor(state)
            state = await self._drive_one(
                state.outcome.successor_run_id, now, notify_parent=notify_parent
            )
        return state
