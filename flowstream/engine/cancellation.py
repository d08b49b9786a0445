"""``Cancellation``: a run asked to cancel (workflow code cleans up), or ended at once."""

from __future__ import annotations

import contextlib

from flowstream.engine.cycle import ReplayCycle
from flowstream.errors import EventConflictError, InvalidInputError, RunConflictError
from flowstream.model.events import (
    ChildCancellationPolicy,
    ChildWorkflowResolved,
    FlowEvent,
    ParentLink,
    RunCancellationRequested,
    RunCancelled,
    RunCreated,
    RunStarted,
    TerminalOutcome,
)
from flowstream.model.snapshot import WorkflowRunSnapshot
from flowstream.replay.state import RunState
from flowstream.runtime import check_input

__all__ = ["Cancellation"]


class Cancellation(ReplayCycle):
    """Cancellation requests, and forced cancellation of a run and the children it blocks on."""

    async def request_cancellation(
        self, run_id: str, reason: str | None = None
    ) -> WorkflowRunSnapshot:
        """Durably ask the run to cancel; workflow code sees it and cleans up (idempotent)."""
        while True:
            state = await self._leaf(run_id)
            if state.is_terminal:
                return await self._reported(state)
            if state.cancellation is not None:
                if state.cancellation.reason != reason:
                    raise RunConflictError(
                        f"run {state.run_id}: cancellation request differs from the durable "
                        "request",
                        run_id=state.run_id,
                    )
                return await self.drive(state.run_id)
            self._admit(state.run_id, state.spec)
            event = RunCancellationRequested(reason=reason)
            try:
                self.store.append_if_sequence(state.run_id, state.last_sequence, [event])
            except EventConflictError:
                continue
            return await self.drive(state.run_id)

    async def force_cancel(self, run_id: str, reason: str | None = None) -> WorkflowRunSnapshot:
        """End the run now without running workflow code; open children follow their policy."""
        state = await self._force_cancel(run_id, reason, notify_parent=True)
        return state.snapshot()

    async def _force_cancel(
        self, run_id: str, reason: str | None, *, notify_parent: bool
    ) -> RunState:
        while True:
            state = await self._leaf(run_id)
            if state.is_terminal:
                return state
            # Cancelling a child awaits: another driver may move this run meanwhile, and then
            # these events, decided on what it was, must lose the race instead of being applied.
            expected = state.last_sequence
            events: list[FlowEvent] = []
            for child_id in state.blocking_children:
                child = state.children[child_id]
                if child.cancellation_policy is ChildCancellationPolicy.ABANDON:
                    self._restore_abandoned(state, child_id)
                    continue
                outcome = await self._force_cancel_child(child.run_id, reason)
                events.append(ChildWorkflowResolved(child_id=child_id, outcome=outcome))
            events.append(RunCancelled(reason=reason))
            try:
                self.store.append_if_sequence(state.run_id, expected, events)
            except EventConflictError:
                continue
            final = self.store.state(state.run_id)
            await self._after_terminal(final, None, notify_parent=notify_parent)
            await self.store.wait_durable()
            return final

    def _restore_abandoned(self, state: RunState, child_id: str) -> None:
        """An abandoned child runs on without its parent: if its creation was lost, it is
        created and started here (the liveness scan drives it on)."""
        child = state.children[child_id]
        if self.store.exists(child.run_id):
            return
        try:
            check_input(self._runtime_for(child.spec), child.run_id, child.spec, child.input)
        except InvalidInputError:
            return  # never created: a child its model refuses does not run
        created = RunCreated(
            spec=child.spec,
            input=child.input,
            parent=ParentLink(run_id=state.run_id, child_id=child_id),
            depth=state.depth + 1,
        )
        with contextlib.suppress(EventConflictError):  # created meanwhile by another driver
            self.store.append_if_sequence(child.run_id, 0, [created, RunStarted()])

    async def _force_cancel_child(self, run_id: str, reason: str | None) -> TerminalOutcome:
        """End a child's chain for its parent's forced cancellation; the outcome to record."""
        if not self.store.exists(run_id):  # its creation was lost: it never ran, so it ends here
            return TerminalOutcome(type="cancelled", error=reason)
        leaf = await self._force_cancel(run_id, reason, notify_parent=False)
        assert leaf.outcome is not None
        return leaf.outcome
