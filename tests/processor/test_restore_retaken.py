"""A restore slice whose activation took the partitions again goes no further with the tasks it
began with.

Activating a restored partition commits what is open first. When that commit is given up or
fenced, the pipeline resets: every partition is dropped (its store closed) and taken again.
The slice used to go on activating the other partitions it had listed, on their closed stores:
the worker exited with ``DbClosedError: DB instance already closed`` (seen once in a long chaos
run, after a broker's kill). The commit is the one boundary faked here: the stores are RocksDB
on disk, the tasks and the restorer the processor's own.
"""

from __future__ import annotations

import asyncio
from collections import deque
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from flowstream.processor.metrics import ProcessorMetrics
from flowstream.processor.restore import StateRestorer
from flowstream.topology import EVENTS
from tests.processor.test_task_lists import TOPICS, Tasks


class _Consumer:
    """The command consumer as an activation uses it (resumes its partitions)."""

    def __init__(self) -> None:
        self.resumed: list[int] = []

    def resume(self, partitions: list[Any]) -> None:
        self.resumed += [tp.partition for tp in partitions]

    def get_watermark_offsets(self, *args: Any, **kwargs: Any) -> tuple[int, int]:
        return 0, 0


class _RetakingPipeline:
    """A transaction is open, and committing it ends in a reset that takes every partition
    again, as ``TransactionPipeline.reset`` does through ``PartitionHost.retake``."""

    def __init__(self, tasks: Tasks) -> None:
        self.tasks = tasks
        self.open = True
        self.resets = 0

    def active(self) -> bool:
        return self.open

    def commit_all(self) -> None:
        self.open = False
        self.resets += 1
        manager = self.tasks.manager
        partitions = sorted(manager.owned)
        manager.drop(set(partitions))
        for partition in partitions:
            manager.own(self.tasks.task(partition))


def test_a_slice_whose_activation_took_the_partitions_again_stops(tmp_path: Path) -> None:
    tasks = Tasks(tmp_path)
    manager = tasks.manager
    consumer = _Consumer()
    manager.consumer = consumer
    for partition in (0, 1, 2):
        manager.own(tasks.task(partition))
    began = dict(manager.owned)
    for task in began.values():  # an empty events partition: restored as soon as asked
        task.restore_target = task.events_end = 0
    pipeline = _RetakingPipeline(tasks)
    ctx: Any = SimpleNamespace(
        pipeline=pipeline, metrics=ProcessorMetrics(), topics={**TOPICS, EVENTS: "t.events"}
    )
    steps: Any = SimpleNamespace(results=deque(), held={})
    restorer = StateRestorer(ctx, manager, steps)
    restorer.targets.ask = lambda tasks: None  # type: ignore[method-assign]
    try:
        asyncio.run(restorer.restore_slice())  # before: DbClosedError on partition 1's store

        assert pipeline.resets == 1
        assert all(manager.owned[p] is not began[p] for p in began), "taken again"
        assert all(t.restoring for t in began.values()), "none activated on a closed store"
        # The tasks that own the partitions now restore in the next slices, from the start.
        now = manager.restoring()
        assert sorted(t.partition for t in now) == [0, 1, 2]
        for task in now:
            task.restore_target = task.events_end = 0
        asyncio.run(restorer.restore_slice())
        assert manager.restoring() == []
        assert sorted(t.partition for t in manager.active()) == [0, 1, 2]
        assert sorted(consumer.resumed) == sorted([0, 1, 2] * len(manager.command_topics))
    finally:
        restorer.targets.close()
        manager.close()
