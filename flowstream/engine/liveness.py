"""``Liveness``: each run's condition as this host sees it, and the scan that repairs stalled runs.

``replay.liveness.condition`` names what a run's state shows. A host knows two things more:

* which runs it is driving right now (the ones inside a replay cycle of this engine): those are
  *being driven*, whatever their state shows;
* when it runs step handlers and child runs itself (the embedded engine), a step attempt that
  is running in the history but not here has lost its handler (the process that ran it is
  gone), and a blocking child that does not exist, or has ended, will not wake its parent:
  both runs are stalled too. (The Kafka processor dispatches steps outside the cycle and hears
  from children by command, so it turns ``hosts_work`` off and answers from the state alone.)

``find_stalled`` walks the store's index of open runs from a cursor within a budget and returns
the stalled ones; ``repair_stalled`` drives each of them, one run's failure never stopping the
scan, and says what it repaired.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from flowstream.engine.cycle import ReplayCycle
from flowstream.errors import FlowError, RuntimeBuildUnavailableError
from flowstream.replay.liveness import Condition, ConditionKind, condition, stalled
from flowstream.replay.state import RunState

__all__ = ["REPAIR_BUDGET", "Liveness", "Repairs", "StalledScan"]

LOG = logging.getLogger("flowstream.engine")

#: Open runs one scan pass looks at, by default.
REPAIR_BUDGET = 200


@dataclass(slots=True)
class StalledScan:
    """One pass over the open-runs index: the stalled runs it found and where to go on."""

    stalled: list[str] = field(default_factory=list)
    scanned: int = 0
    #: The last run looked at, to continue from; ``None`` when the pass reached the end.
    cursor: str | None = None
    #: Runs whose state could not be read (a corrupt history), with the error.
    unreadable: dict[str, FlowError] = field(default_factory=dict)


@dataclass(slots=True)
class Repairs:
    """What ``repair_stalled`` did: the runs it drove, and those whose drive raised."""

    repaired: list[str] = field(default_factory=list)
    failed: dict[str, Exception] = field(default_factory=dict)
    scanned: int = 0
    cursor: str | None = None


class Liveness(ReplayCycle):
    """Run conditions for this host, and the scan that drives the stalled runs."""

    #: The engine runs step handlers and child runs inside its replay cycle (embedded).
    hosts_work = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._driving: dict[str, int] = {}

    def condition(self, run_id: str, *, now: datetime | None = None) -> Condition:
        """The condition of ``run_id`` as this host sees it (``RunNotFoundError`` if none)."""
        return self._condition_of(self.store.state(run_id), now or self._clock())

    def is_driving(self, run_id: str) -> bool:
        """Whether a replay cycle of this engine is driving ``run_id`` right now."""
        return run_id in self._driving

    def find_stalled(
        self,
        *,
        after: str | None = None,
        budget_runs: int = REPAIR_BUDGET,
        now: datetime | None = None,
    ) -> StalledScan:
        """The stalled runs among the next ``budget_runs`` open runs after ``after``."""
        moment = now or self._clock()
        found = StalledScan()
        runs = self.store.open_runs(after, budget_runs)
        found.scanned = len(runs)
        found.cursor = runs[-1] if len(runs) >= budget_runs else None
        for run_id in runs:
            try:
                state = self.store.state(run_id)
            except FlowError as exc:
                found.unreadable[run_id] = exc
                continue
            if self._condition_of(state, moment).is_stalled:
                found.stalled.append(run_id)
        return found

    async def repair_stalled(
        self,
        *,
        cursor: str | None = None,
        budget_runs: int = REPAIR_BUDGET,
        now: datetime | None = None,
    ) -> Repairs:
        """Drive the stalled runs among the next ``budget_runs`` open runs after ``cursor``."""
        scan = self.find_stalled(after=cursor, budget_runs=budget_runs, now=now)
        repairs = Repairs(scanned=scan.scanned, cursor=scan.cursor)
        repairs.failed.update(scan.unreadable)
        for run_id in scan.stalled:
            try:
                await self.drive(run_id, now=now)
            except Exception as exc:  # one run's failure is its own, never the scan's
                LOG.warning("run %s: the liveness repair raised %s", run_id, exc)
                repairs.failed[run_id] = exc
                continue
            repairs.repaired.append(run_id)
        return repairs

    # -- the host's view --------------------------------------------------------------------

    def _condition_of(self, state: RunState, now: datetime) -> Condition:
        found = condition(state, now, admits=lambda _build: self._serves(state))
        if found.kind is ConditionKind.TERMINAL:
            return found
        if self.is_driving(state.run_id):
            return Condition(ConditionKind.DRIVING, state.run_id, "being driven")
        if not self.hosts_work:
            return found
        if found.kind is ConditionKind.RUNNING_STEP:
            return stalled(
                state.run_id,
                f"{found.text} in the history, but no handler runs it here",
            )
        if found.kind is ConditionKind.WAITING_INPUT:
            for child_id in state.blocking_children:
                child_run = state.children[child_id].run_id
                if not self.store.exists(child_run):
                    return stalled(state.run_id, f"child {child_id} was never created")
                if self._chain_ended(child_run):
                    return stalled(state.run_id, f"child {child_id} ended, its parent not told")
        return found

    def _chain_ended(self, run_id: str) -> bool:
        """Whether ``run_id``'s continuation chain has ended, or lacks a successor (driving
        the parent creates it): either way only the parent's drive moves it on."""
        state = self.store.state(run_id)
        seen = {run_id}
        while state.outcome is not None and state.outcome.successor_run_id is not None:
            successor = state.outcome.successor_run_id
            if successor in seen:
                return False  # a cycle: driving would not end it
            if not self.store.exists(successor):
                return True
            seen.add(successor)
            state = self.store.state(successor)
        return state.is_terminal

    def _serves(self, state: RunState) -> bool:
        try:
            self._admit(state.run_id, state.spec)
        except RuntimeBuildUnavailableError:
            return False
        return True

    # -- being driven -----------------------------------------------------------------------

    async def _drive_one(
        self, run_id: str, now: datetime | None, *, notify_parent: bool
    ) -> RunState:
        driving = self._driving  # counted by hand: this runs for every decision
        driving[run_id] = driving.get(run_id, 0) + 1
        try:
            return await super()._drive_one(run_id, now, notify_parent=notify_parent)
        finally:
            left = driving[run_id] - 1
            if left:
                driving[run_id] = left
            else:
                del driving[run_id]
