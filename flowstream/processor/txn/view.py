"""``PipelineView``: what the processor's loop asks the transaction pipeline (whether it
decided, is busy or stuck, until when decisions may join the open transaction)."""

from __future__ import annotations

import time
from collections.abc import Callable

from flowstream.processor.txn.slot import ProducerSlot
from flowstream.processor.txn.state import Txn

__all__ = ["OFFSETS_QUIET_S", "OFFSETS_STUCK_S", "PipelineView"]

#: A send of positions (``send_offsets_to_transaction``) running longer than this is taken for
#: one that never returns: librdkafka can wait for good on a group coordinator whose broker is
#: gone (its issues 5456 and 5511; after a SIGKILL of the group coordinator's broker, sends
#: begun in the 5 s after it returned 35-300 s later, once the broker was back). A send
#: takes milliseconds, but one that meets a broker's SIGKILL waits until the cluster has moved
#: on (the coordinators elsewhere, the dead replica out of the in-sync replicas): sends given up
#: at 3 s returned 0.2-2.5 s later, and the reset that followed cost more than that wait (the
#: new producers' ``init_transactions`` waits for the same coordinator, then the partitions are
#: taken again). A send still running at 5 s has made its partitions miss the 5 s that a broker
#: kill may cost them anyway; a reset then costs less than a send that never returns. Since the
#: producers close idle connections (``clients.TRANSACTIONAL_PRODUCER_DEFAULTS``), the hang of
#: issue 5511 ends within a second or so, and every send given up in four chaos runs came back
#: by itself within 13.3 s; a 10 s limit gave no shorter stalls (session Z), so 5 s stays.
OFFSETS_STUCK_S = 5.0
#: After such a give-up, sends of positions get the whole ``stuck_s`` for this long: a
#: coordinator slow for a while costs one reset, not one every few seconds (and never the
#: resets that end the worker).
OFFSETS_QUIET_S = 60.0


class PipelineView:
    """The read-only half of ``TransactionPipeline``: the loop's questions."""

    open: Txn | None
    spare: Txn | None
    sealed: Txn | None
    slots: tuple[ProducerSlot, ProducerSlot]
    stuck_s: float
    offsets_stuck_s: float
    _offsets_gave_up: float
    _clock: Callable[[], float]

    @property
    def decided(self) -> bool:
        """Decisions were taken in the open transaction."""
        return self.open is not None and self.open.decided

    @property
    def busy(self) -> bool:
        """A commit is in flight, or records wait for a fence."""
        return self.sealed is not None or (self.open is not None and bool(self.open.deferred))

    def active(self) -> bool:
        return self.open is not None or self.sealed is not None or self.spare is not None

    def stuck(self) -> bool:
        """A transactional call has run past ``stuck_s``, or a send of positions past
        ``offsets_stuck_s``: the producers are to be given up."""
        # (No generators: the loop asks on every iteration.)
        first, second = self.slots
        stuck_s = self.stuck_s
        if first.lane.busy_for() > stuck_s or second.lane.busy_for() > stuck_s:
            return True
        return self.offsets_hang()

    def offsets_hang(self) -> bool:
        """A send of positions has run past ``offsets_stuck_s`` (none is given up so for
        ``OFFSETS_QUIET_S`` after the last)."""
        first, second = self.slots
        if first.offsets_since is None and second.offsets_since is None:
            return False  # no send of positions runs (nearly every loop iteration)
        now = time.monotonic()
        if now - self._offsets_gave_up < OFFSETS_QUIET_S:
            return False
        for slot in self.slots:
            since = slot.offsets_since
            if since is not None and now - since > self.offsets_stuck_s:
                return True
        return False

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

    def idle_eager(self, idle_s: float) -> bool:
        """The open transaction was begun eagerly and nothing joined it for ``idle_s``."""
        txn = self.open
        since = None if txn is None or txn.decided else txn.idle_since
        return since is not None and self._clock() - since >= idle_s
