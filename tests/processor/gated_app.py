"""The test app, in a worker whose start can be held at two points and whose loop a workflow can
hold, each while a file exists in the directory ``FLOWSTREAM_TEST_GATES`` names:

* ``producer``: making a transactional producer waits (the worker is connecting);
* ``restore``: restoring assigned partitions makes no progress (they stay restoring);
* ``loop``: the decision of a run started with ``{"hold_loop": true}`` blocks the processor's
  loop, as slow workflow code would, while the consumer goes on fetching on its own threads.

Each wait ends after 60 s whatever the file says, so a test that fails leaves no worker stuck.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from flowstream.model.commands import RuntimeCommand
from flowstream.processor.partitions import PartitionHost
from flowstream.processor.restore import StateRestorer
from flowstream.replay.context import WorkflowInvocation
from tests.processor.apps import SPEC, ThreeSteps
from tests.support.fault_apps import worker_process_only

worker_process_only("tests.processor.gated_app")

__all__ = ["SPEC", "runtime"]

_LIMIT_S = 60.0


def held(gate: str) -> bool:
    folder = os.environ.get("FLOWSTREAM_TEST_GATES")
    return bool(folder) and os.path.exists(os.path.join(str(folder), gate))


def _wait_while(gate: str) -> None:
    deadline = time.monotonic() + _LIMIT_S
    while held(gate) and time.monotonic() < deadline:
        time.sleep(0.02)


_new_producer = PartitionHost.new_producer
_restore_slice = StateRestorer.restore_slice


def _gated_producer(self: PartitionHost, slot: Any, *, ahead: bool = False) -> Any:
    _wait_while("producer")
    return _new_producer(self, slot, ahead=ahead)


_restore_held_since = time.monotonic()


async def _gated_restore(self: StateRestorer) -> None:
    if held("restore") and time.monotonic() - _restore_held_since < _LIMIT_S:
        await asyncio.sleep(0.05)
        return
    await _restore_slice(self)


PartitionHost.new_producer = _gated_producer  # type: ignore[method-assign]
StateRestorer.restore_slice = _gated_restore  # type: ignore[method-assign]


class Gated(ThreeSteps):
    def run_workflow(self, invocation: WorkflowInvocation) -> RuntimeCommand:
        options = invocation.input if isinstance(invocation.input, dict) else {}
        if options.get("hold_loop"):
            _wait_while("loop")
        return super().run_workflow(invocation)


runtime = Gated()
