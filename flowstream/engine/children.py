"""``ChildRuns``: child workflows, created, cancelled, driven and resolved by their parent."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from flowstream.engine.continuation import chain_root, reported_child
from flowstream.engine.cycle import ReplayCycle
from flowstream.errors import (
    CorruptHistoryError,
    EventConflictError,
    InvalidInputError,
    LimitExceededError,
    RuntimeBuildUnavailableError,
)
from flowstream.model.base import JSON
from flowstream.model.events import (
    ChildCancellationPolicy,
    ChildWorkflowRequested,
    ChildWorkflowResolved,
    FlowEvent,
    ParentLink,
    RunCancellationRequested,
    RunCreated,
    TerminalOutcome,
)
from flowstream.model.spec import WorkflowSpec
from flowstream.replay.state import RunState
from flowstream.runtime import check_input

__all__ = ["ChildRuns"]


class ChildRuns(ReplayCycle):
    """Child runs of the same store, and what a run's end means for its parent or successor."""

    def _check_children(self, state: RunState, events: Sequence[FlowEvent]) -> None:
        if not any(isinstance(e, ChildWorkflowRequested) for e in events):
            return
        if self._max_child_depth and state.depth + 1 > self._max_child_depth:
            raise LimitExceededError(
                f"run {state.run_id}: child workflow depth would exceed {self._max_child_depth}",
                run_id=state.run_id,
            )
        ancestors: set[str] = set()
        link = state.parent
        while link is not None:
            if link.run_id in ancestors or link.run_id == state.run_id:
                raise CorruptHistoryError(
                    f"the ancestry of run {state.run_id} has a cycle at run {link.run_id}; the "
                    "links in the store contradict each other",
                    run_id=state.run_id,
                )
            ancestors.add(link.run_id)
            if not self.store.exists(link.run_id):
                break
            link = self.store.state(link.run_id).parent
        for event in events:
            if isinstance(event, ChildWorkflowRequested) and event.child_run_id in ancestors | {
                state.run_id
            }:
                raise LimitExceededError(
                    f"run {state.run_id}: child workflow {event.child_id} would form a cycle",
                    run_id=state.run_id,
                )

    def _refused_child(
        self, run_id: str, spec: WorkflowSpec, input: JSON
    ) -> TerminalOutcome | None:
        """The outcome of a child whose input its workflow's model rejects: it is never created
        and ends failed with the reason, for the parent's code to handle, as a child that
        failed on its input would. ``None``: the child may be created."""
        try:
            check_input(self._runtime_for(spec), run_id, spec, input)
        except InvalidInputError as exc:
            return TerminalOutcome(type="failed", error=str(exc))
        return None

    async def _reconcile_children(self, state: RunState, now: datetime | None) -> bool:
        """Create, cancel and drive open children; resolve the first terminal one. True if
        something was appended to the parent.

        ``state`` is the store's live projection, which another driver may advance while a child
        is driven here: the resolution is appended at the sequence the parent had on entry, so a
        stale one loses the race (``EventConflictError``: the cycle re-reads and replays) instead
        of being applied to a parent that moved on.
        """
        expected = state.last_sequence
        for child_id in sorted(
            state.open_children, key=lambda c: state.children[c].requested_sequence
        ):
            child = state.children[child_id]
            if not self.store.exists(child.run_id):
                refused = self._refused_child(child.run_id, child.spec, child.input)
                if refused is not None:  # never created: the parent sees it failed
                    self.store.append_if_sequence(
                        state.run_id,
                        expected,
                        [ChildWorkflowResolved(child_id=child_id, outcome=refused)],
                    )
                    return True
                created = RunCreated(
                    spec=child.spec,
                    input=child.input,
                    parent=ParentLink(run_id=state.run_id, child_id=child_id),
                    depth=state.depth + 1,
                )
                try:
                    self.store.append_if_sequence(child.run_id, 0, [created])
                except EventConflictError:
                    pass
            cancellation = state.cancellation
            if (
                cancellation is not None
                and child.cancellation_policy is ChildCancellationPolicy.REQUEST_CANCELLATION
                and child.requested_sequence < cancellation.sequence
            ):
                leaf = await self._leaf(child.run_id)
                if not leaf.is_terminal and leaf.cancellation is None:
                    try:
                        self.store.append_if_sequence(
                            leaf.run_id,
                            leaf.last_sequence,
                            [RunCancellationRequested(reason=cancellation.reason)],
                        )
                    except EventConflictError:
                        pass
            try:
                leaf = await self._drive_chain(child.run_id, now, notify_parent=False)
            except RuntimeBuildUnavailableError:
                continue
            if leaf.is_terminal:
                assert leaf.outcome is not None
                self.store.append_if_sequence(
                    state.run_id,
                    expected,
                    [ChildWorkflowResolved(child_id=child_id, outcome=leaf.outcome)],
                )
                return True
        return False

    async def _after_terminal(
        self, state: RunState, now: datetime | None, *, notify_parent: bool
    ) -> None:
        """A continued run gets its successor; a finished child wakes its parent."""
        if state.outcome is not None and state.outcome.successor_run_id is not None:
            self._ensure_successor(state)
            return
        if not notify_parent:
            return
        reported = reported_child(state)
        link = state.parent
        if reported is None and link is not None and link.continued and not link.hop:
            # A chain made before links carried their hop and child: its root says.
            reported = reported_child(chain_root(self.store, state))
        if reported is None:
            return
        parent_id, child_id = reported
        if not self.store.exists(parent_id):
            return
        parent = self.store.state(parent_id)
        child = parent.children.get(child_id)
        if parent.is_terminal or child is None or child.outcome is not None:
            return
        try:
            await self._drive_chain(parent_id, now, notify_parent=True)
        except RuntimeBuildUnavailableError:
            return
