"""The example order runtime, in a worker whose every third commit is aborted after its records
were written: they are in the log, in a transaction that aborts, and the processor rewinds to the
last commit and applies the same commands again."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from flowstream.examples.order import runtime
from flowstream.processor.txn.errors import Abort
from flowstream.processor.txn.pipeline import TransactionPipeline
from tests.support.fault_apps import worker_process_only

worker_process_only("tests.kafka.outcome_abort_app")

__all__ = ["ABORT_REASON", "runtime"]

ABORT_REASON = "injected abort after writing"

_calls = 0
_real = TransactionPipeline._commit_blocking


def _abort_every_third(
    self: TransactionPipeline,
    txn: Any,
    fence: Future[None] | None,
    records: list[Any],
) -> None:
    global _calls
    _calls += 1
    usable = fence is not None and fence.exception() is None and txn.slot.error is None
    if _calls % 3 == 0 and usable:
        for record in records:
            txn.slot.send(record)
        txn.slot.producer.flush(30)
        txn.precommit.set_exception(Abort(ABORT_REASON))  # as the real call does on its way out
        raise Abort(ABORT_REASON)
    _real(self, txn, fence, records)


TransactionPipeline._commit_blocking = _abort_every_third  # type: ignore[method-assign]
