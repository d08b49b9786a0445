"""The test app, in a worker whose 40th ``send_offsets_to_transaction`` never returns.

It stands in for librdkafka's own hang (issues 5456 and 5511: the call ignores its timeout while
the group coordinator's broker is gone), which a killed broker causes only now and then.
"""

from __future__ import annotations

import threading
from typing import Any

from flowstream.processor.txn.pipeline import TransactionPipeline
from tests.processor.apps import runtime
from tests.support.fault_apps import worker_process_only

worker_process_only("tests.processor.hang_app")

__all__ = ["runtime"]

_calls = 0
_forever = threading.Event()
_real = TransactionPipeline.send_offsets


def _hang_once(producer: Any, offsets: list[Any], metadata: Any) -> None:
    global _calls
    _calls += 1
    if _calls == 40:
        _forever.wait()
    _real(producer, offsets, metadata)


TransactionPipeline.send_offsets = staticmethod(_hang_once)  # type: ignore[method-assign]
