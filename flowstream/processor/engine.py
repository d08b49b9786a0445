"""``PartitionEngine``: the embedded engine's replay cycle, hosted by a Kafka processor.

It differs from ``FlowEngine`` only where a run touches the world outside its partition:

* steps are not awaited: they are handed to the processor, which starts them after the
  transaction holding their ``step_started`` commits and feeds their outcomes back later;
* child runs and continuation successors may live on other partitions, so they are started by
  producing ``StartRun`` messages, and a finished child reports to its parent with
  ``ResolveChild``; nothing here reads or writes another partition's state;
* so a signal, a cancellation or an operator's retry for a run that continued as new is
  forwarded to its successor, and a forced cancellation reaches a child elsewhere by a forced
  ``CancelRun``;
* several runtime builds may be served at once, one ``FlowRuntime`` per build id.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime

from flowstream.engine import FlowEngine
from flowstream.engine.continuation import reported_child, successor_link
from flowstream.errors import CorruptHistoryError, RuntimeBuildUnavailableError
from flowstream.model.base import JSON
from flowstream.model.events import ChildCancellationPolicy, ParentLink, TerminalOutcome
from flowstream.model.messages import (
    CancelRun,
    CommandMessage,
    ResolveChild,
    RetryRun,
    SendSignal,
    StartRun,
)
from flowstream.model.snapshot import WorkflowRunSnapshot
from flowstream.model.spec import WorkflowSpec
from flowstream.replay.decide import derived_run_id
from flowstream.replay.state import RunState
from flowstream.replay.task_failures import TaskRetryPolicy
from flowstream.runtime import FlowRuntime, check_served
from flowstream.stores.base import Clock, EventStore, utc_now

__all__ = ["PartitionEngine"]

#: Hands decided steps to the processor: (run id, [(step id, attempt)]).
Dispatch = Callable[[str, list[tuple[str, int]]], None]
#: Produces a command for another run inside the open transaction.
Emit = Callable[[CommandMessage], None]


class PartitionEngine(FlowEngine):
    """The replay cycle for the runs of one owned partition."""

    #: Steps run outside the cycle and children report by command: a run's condition is what
    #: its state shows (the restore and the sweeper re-dispatch the steps an owner lost).
    hosts_work = False

    def __init__(
        self,
        store: EventStore,
        runtimes: Mapping[str | None, FlowRuntime],
        *,
        dispatch: Dispatch,
        emit: Emit,
        clock: Clock = utc_now,
        on_conflict: Callable[[], None] | None = None,
        max_continuations: int = 1_000,
        task_retry: TaskRetryPolicy | None = None,
        on_task_failure: Callable[[str, str, str], None] | None = None,
    ) -> None:
        if not runtimes:
            raise ValueError("a processor needs at least one runtime")
        super().__init__(
            store,
            next(iter(runtimes.values())),
            clock=clock,
            on_conflict=on_conflict,
            max_continuations=max_continuations,
            task_retry=task_retry,
            on_task_failure=on_task_failure,
        )
        self.runtimes = dict(runtimes)
        self._dispatch = dispatch
        self._emit = emit

    def _admit(self, run_id: str, spec: WorkflowSpec) -> None:
        if spec.runtime_build_id not in self.runtimes:
            served = ",".join(sorted(b or "<unpinned>" for b in self.runtimes))
            raise RuntimeBuildUnavailableError(run_id, spec.runtime_build_id, served)
        check_served(self.runtimes[spec.runtime_build_id], run_id, spec)

    def _runtime_for(self, spec: WorkflowSpec) -> FlowRuntime:
        return self.runtimes[spec.runtime_build_id]

    async def _run_steps(self, run_id: str, step_ids: list[str], now: datetime | None) -> bool:
        state = self.store.state(run_id)
        self._dispatch(run_id, [(s, state.steps[s].attempt) for s in step_ids])
        return False

    async def _leaf(self, run_id: str) -> RunState:
        return self.store.state(run_id)

    async def _drive_chain(
        self, run_id: str, now: datetime | None, *, notify_parent: bool
    ) -> RunState:
        return await self._drive_one(run_id, now, notify_parent=notify_parent)

    def create(
        self,
        run_id: str,
        spec: WorkflowSpec,
        input: JSON = None,
        *,
        parent: ParentLink | None = None,
        depth: int = 0,
    ) -> None:
        """``FlowEngine.create``, refusing a continuation's start for a run that exists with
        another link: the chain would lead back into itself (each hop in a cycle would send the
        next start for ever), so it is not followed."""
        if parent is not None and parent.continued and self.store.exists(run_id):
            found = self.store.state(run_id).parent
            if found != parent:
                raise CorruptHistoryError(
                    f"run {run_id} exists but is not hop {parent.hop} of the continuation chain "
                    f"after run {parent.run_id}: its link differs, so the chain is not followed",
                    run_id=run_id,
                )
        super().create(run_id, spec, input, parent=parent, depth=depth)

    def _ensure_successor(self, state: RunState) -> None:
        assert state.outcome is not None and state.outcome.successor_run_id is not None
        self._emit(
            StartRun(
                run_id=state.outcome.successor_run_id,
                spec=state.spec,
                input=state.continuation_input,
                parent=successor_link(state),
                depth=state.depth,
            )
        )

    # -- a command for a run that continued as new goes on to its successor ---------------------

    def _successor_for_commands(self, run_id: str) -> str | None:
        """The successor that commands addressed to ``run_id`` go on to, if it continued as new.

        The successor may live on another partition, so the command is forwarded, not applied
        here. Only a link whose successor id was derived from this run and the link's sequence
        is followed: no chain of such links leads back into itself, so a forwarded command never
        comes around again.
        """
        if not self.store.exists(run_id):
            return None
        state = self.store.state(run_id)
        if state.outcome is None or state.outcome.successor_run_id is None:
            return None
        successor = state.outcome.successor_run_id
        link = state.history[-1]
        if successor != derived_run_id(run_id, "continue", str(link.sequence - 1)):
            raise CorruptHistoryError(
                f"run {run_id} continued into {successor}, an id the engine did not derive from "
                "its link, so commands are not forwarded along the chain",
                run_id=run_id,
            )
        return successor

    def forward_retry(self, run_id: str) -> bool:
        """An operator's retry of a run that continued as new goes on to its successor; True
        when it did."""
        successor = self._successor_for_commands(run_id)
        if successor is not None:
            self._emit(RetryRun(run_id=successor))
        return successor is not None

    async def send_signal(
        self, run_id: str, signal_id: str, name: str, payload: JSON = None
    ) -> WorkflowRunSnapshot:
        successor = self._successor_for_commands(run_id)
        if successor is None:
            return await super().send_signal(run_id, signal_id, name, payload)
        self._emit(SendSignal(run_id=successor, signal_id=signal_id, name=name, payload=payload))
        return self.snapshot(run_id)

    async def request_cancellation(
        self, run_id: str, reason: str | None = None
    ) -> WorkflowRunSnapshot:
        successor = self._successor_for_commands(run_id)
        if successor is None:
            return await super().request_cancellation(run_id, reason)
        self._emit(CancelRun(run_id=successor, reason=reason))
        return self.snapshot(run_id)

    async def force_cancel(self, run_id: str, reason: str | None = None) -> WorkflowRunSnapshot:
        successor = self._successor_for_commands(run_id)
        if successor is None:
            return await super().force_cancel(run_id, reason)
        self._emit(CancelRun(run_id=successor, reason=reason, force=True))
        return self.snapshot(run_id)

    async def _force_cancel_child(self, run_id: str, reason: str | None) -> TerminalOutcome:
        """A child here that has not continued is cancelled at once; one on another partition,
        or one that continued into a successor, is sent a forced cancel, and the parent records
        it cancelled without waiting for it."""
        target = self._successor_for_commands(run_id)
        if target is None and self.store.exists(run_id):
            return await super()._force_cancel_child(run_id, reason)
        self._emit(CancelRun(run_id=target or run_id, reason=reason, force=True))
        return TerminalOutcome(type="cancelled", error=reason)

    async def _reconcile_children(self, state: RunState, now: datetime | None) -> bool:
        """Ask for every open child's run (idempotent by run id) and pass cancellation on."""
        cancellation = state.cancellation
        for child_id in sorted(state.open_children, key=state._child_order):
            child = state.children[child_id]
            self._emit(
                StartRun(
                    run_id=child.run_id,
                    spec=child.spec,
                    input=child.input,
                    parent=ParentLink(run_id=state.run_id, child_id=child_id),
                    depth=state.depth + 1,
                )
            )
            if (
                cancellation is not None
                and child.cancellation_policy is ChildCancellationPolicy.REQUEST_CANCELLATION
                and child.requested_sequence < cancellation.sequence
            ):
                self._emit(CancelRun(run_id=child.run_id, reason=cancellation.reason))
        return False

    async def _after_terminal(
        self, state: RunState, now: datetime | None, *, notify_parent: bool
    ) -> None:
        if state.outcome is None:
            return
        if state.outcome.successor_run_id is not None:
            self._ensure_successor(state)
            return
        # The chain's last run resolves the child: a continuation's link names the parent and
        # the child, whose run (the chain's root) has the id the parent derived for it.
        reported = reported_child(state)
        if reported is not None:
            parent_id, child_id = reported
            assert state.parent is not None
            root = state.run_id
            if state.parent.continued:
                root = derived_run_id(parent_id, "child", child_id)
            self._emit(
                ResolveChild(
                    run_id=parent_id, child_id=child_id, child_run_id=root, outcome=state.outcome
                )
            )
