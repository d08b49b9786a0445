"""``PipelineView``: what the processor's loop asks the transaction pipeline (whether it
decided, is busy or stuck, until when decisions may join the open transaction, whether it can
take none until a commit ends)."""

from __future__ import annotations

from collections.abc import Callable

from flowstream.processor.txn.slot import ProducerSlot
from flowstream.processor.txn.state import Txn

__all__ = ["PipelineView"]


class PipelineView:
    """The read-only half of ``TransactionPipeline``: the loop's questions."""

    open: Txn | None
    spare: Txn | None
    sealed: Txn | None
    slots: tuple[ProducerSlot, ProducerSlot]
    stuck_s: float
    _clock: Callable[[], float]

    @property
    def decided(self) -> bool:
        """Decisions were taken in the open transaction."""
        return self.open is not None and self.open.decided

    @property
    def busy(self) -> bool:
        """A commit is in flight, or records wait for a gate call."""
        return self.sealed is not None or (self.open is not None and bool(self.open.deferred))

    def active(self) -> bool:
        return self.open is not None or self.sealed is not None or self.spare is not None

    def stuck(self) -> bool:
        """A transactional call has run past ``stuck_s``: the producers are to be given up."""
        # (No generators: the loop asks on every iteration.)
        first, second = self.slots
        stuck_s = self.stuck_s
        return bool(first.lane.busy_for() > stuck_s or second.lane.busy_for() > stuck_s)

    def decisions_until(self, budget_s: float, max_open_s: float) -> float:
        """Until when decisions may join the open transaction: ``budget_s`` from now, and never
        once it has been open on Kafka for ``max_open_s`` (it waits for the sealed one to
        commit meanwhile, and the coordinator's clock runs)."""
        now = self._clock()
        txn = self.open
        until = now + budget_s
        if txn is not None and txn.opened:
            until = min(until, txn.opened + max_open_s)
        return until

    def closed_until_commit(self, max_open_s: float) -> bool:
        """The open transaction takes no more decisions (open on Kafka for ``max_open_s``) and
        a commit is in flight: nothing can be decided until that commit ends."""
        sealed, txn = self.sealed, self.open
        if sealed is None or sealed.commit is None or sealed.commit.done():
            return False
        return txn is not None and bool(txn.opened) and self._clock() - txn.opened >= max_open_s

    def idle_eager(self, idle_s: float) -> bool:
        """The open transaction was begun eagerly and nothing joined it for ``idle_s``."""
        txn = self.open
        since = None if txn is None or txn.decided else txn.idle_since
        return since is not None and self._clock() - since >= idle_s
