"""The test app, in a worker whose every seventh commit fails before it reaches the broker.

It stands in for a commit that fails without fencing the producer (a coordinator that cannot be
reached for a while, a record the broker refuses): the processor aborts the open and the
committing transaction, rewinds to the last commit, and must carry on from there.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from flowstream.processor import loop
from tests.processor.apps import runtime

__all__ = ["ABORT_REASON", "runtime"]

ABORT_REASON = "injected abort"

_calls = 0
_real = loop.Processor._commit_blocking


def _fail_every_seventh(
    self: loop.Processor,
    slot: Any,
    fence: Future[None] | None,
    records: list[Any],
    offsets: list[Any] | None,
    metadata: Any,
    precommit: Future[None],
) -> None:
    global _calls
    _calls += 1
    if _calls % 7 == 0:
        precommit.set_result(None)  # as the real call does on its way out
        raise loop._Abort(ABORT_REASON)
    _real(self, slot, fence, records, offsets, metadata, precommit)


loop.Processor._commit_blocking = _fail_every_seventh  # type: ignore[method-assign]
