"""The test app, in a worker whose every seventh commit fails before it reaches the broker.

It stands in for a commit that fails without fencing the producer (a coordinator that cannot be
reached for a while, a record the broker refuses): the processor aborts the open and the
committing transaction, rewinds to the last commit, and must carry on from there.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from flowstream.processor.txn.errors import Abort
from flowstream.processor.txn.pipeline import TransactionPipeline
from tests.processor.apps import runtime
from tests.processor.fault_reasons import ABORT_REASON
from tests.support.fault_apps import worker_process_only

worker_process_only("tests.processor.abort_app")

__all__ = ["ABORT_REASON", "runtime"]


_calls = 0
_real = TransactionPipeline._commit_blocking


def _fail_every_seventh(
    self: TransactionPipeline,
    txn: Any,
    fence: Future[None] | None,
    records: list[Any],
) -> None:
    global _calls
    _calls += 1
    if _calls % 7 == 0:
        txn.precommit.set_exception(Abort(ABORT_REASON))  # as the real call does on its way out
        raise Abort(ABORT_REASON)
    _real(self, txn, fence, records)


TransactionPipeline._commit_blocking = _fail_every_seventh  # type: ignore[method-assign]
