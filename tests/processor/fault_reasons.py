"""What the patching test apps write in a worker's log, for the tests that look for it (they
must not import the apps themselves: ``tests.support.fault_apps``)."""

from __future__ import annotations

__all__ = ["ABORT_REASON"]

#: ``tests.processor.abort_app``: every seventh commit fails with this.
ABORT_REASON = "injected abort"
