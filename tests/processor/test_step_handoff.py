"""A step started from the consumer poll's thread starts on the loop.

When nothing runs, the processor waits for a command in a thread (``Processor._poll``), and the
rebalance callbacks run inside that poll. With the consumer group protocol a revocation keeps
the other partitions and starts the steps their last commit holds (``on_revoke`` →
``commit_all(start_steps=True)``), so ``StepRunner.start`` was called from that thread, where
``asyncio.ensure_future`` finds no event loop: the worker exited with "There is no current event
loop in thread 'asyncio_1'" (the long chaos run of session U, at a worker's SIGSTOP). The loop,
the runner, the thread and the metrics are real; the partition and its owner are stand-ins."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry

from flowstream.processor.metrics import ProcessorMetrics
from flowstream.processor.steps import StepRunner
from flowstream.settings import Settings


class _Owners:
    """No partition is owned any more by the time the step would run: it is not started."""

    def get(self, partition: int) -> Any:
        return None


def test_a_step_started_from_the_polls_thread_starts_on_the_loop() -> None:
    registry = CollectorRegistry()

    async def scenario() -> tuple[set[Any], int]:
        ctx = SimpleNamespace(
            settings=Settings(step_concurrency=2), metrics=ProcessorMetrics(registry)
        )
        runner = StepRunner(ctx, _Owners(), boundary=None, inbox=None)  # type: ignore[arg-type]
        runner.loop = asyncio.get_running_loop()
        task = SimpleNamespace(partition=3, inflight=set(), outbox=[])
        # As the rebalance callback does, in the thread the loop waits on for a command.
        await runner.loop.run_in_executor(None, runner.start, task, ("run-1", "charge", 1))
        for _ in range(10):  # the step's task runs on the loop and finds the partition gone
            await asyncio.sleep(0)
        return set(task.inflight), len(runner.running)

    inflight, running = asyncio.run(scenario())
    # The step's task ran (only it counts an attempt not started) and ended.
    assert (
        registry.get_sample_value("flowstream_step_attempts_total", {"outcome": "not_started"}) == 1
    )
    assert inflight == set() and running == 0
