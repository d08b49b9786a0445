"""The test app, in a worker whose 40th commit never returns.

It stands in for a transactional call of librdkafka that ignores its timeout (its issues 5456
and 5511: ``send_offsets_to_transaction`` once hung so while the group coordinator's broker was
gone; the processor no longer makes that call, but any call to a broker can meet a hang).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

from flowstream.processor.txn.pipeline import TransactionPipeline
from tests.processor.apps import runtime
from tests.support.fault_apps import worker_process_only

worker_process_only("tests.processor.hang_app")

__all__ = ["runtime"]

_calls = 0
_forever = threading.Event()
_real = TransactionPipeline._commit_blocking


def _hang_once(
    self: TransactionPipeline, txn: Any, fence: Future[None] | None, records: list[Any]
) -> None:
    global _calls
    _calls += 1
    if _calls == 40:
        _forever.wait()
    _real(self, txn, fence, records)


TransactionPipeline._commit_blocking = _hang_once  # type: ignore[method-assign]
