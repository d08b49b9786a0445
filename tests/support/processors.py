"""Real Kafka processors in this process, for the scenario tests' ``kafka`` mode.

A ``ProcessorHost`` is one ``Processor`` (the one ``flowstream worker`` runs) on a thread of
its own, with its own topics under a fresh prefix, its own consumer group and a ``FakeClock``
the tests move: timers and delayed retries fire when that clock passes them, through the
processor's own timer scan. Its runtime is a ``RoutingRuntime``: each test registers its own
runtime (the closures and recording handlers of ``tests.support.make_runtime``) under a run-id
namespace, and every decision and step of a run goes to the runtime of the test that started
it (a child or a continuation's successor, whose id is derived, to its parent's). The tests of
a session share a host per configuration (``ProcessorPool``), so the broker-side setup is paid
once, not per test.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flowstream import wire
from flowstream.client import FlowClient
from flowstream.kafka import clients, topics
from flowstream.model.commands import RuntimeCommand
from flowstream.model.events import EventEnvelope, RunCreated
from flowstream.outcomes import high_watermark
from flowstream.partitioning import partition_for
from flowstream.processor.worker import Processor
from flowstream.replay.context import StepInvocation, WorkflowInvocation
from flowstream.runtime import FlowRuntime
from flowstream.settings import Settings
from flowstream.topology import EVENTS, load_topology
from tests.support import FakeClock

__all__ = ["EventCache", "ProcessorHost", "ProcessorPool", "RoutingRuntime"]

#: How long a processor may take to join its group and restore its (empty) partitions.
_READY_S = 60.0


class RoutingRuntime:
    """Sends each run's decisions and steps to the runtime registered for its namespace."""

    def __init__(self) -> None:
        self._spaces: dict[str, FlowRuntime] = {}
        self._runs: dict[str, FlowRuntime] = {}
        self._lock = threading.Lock()

    def register(self, namespace: str, runtime: FlowRuntime) -> None:
        with self._lock:
            self._spaces[namespace] = runtime

    def _for(self, run_id: str, first: Any) -> FlowRuntime:
        with self._lock:
            found = self._runs.get(run_id)
            if found is None:
                space = run_id.split("-", 1)[0]
                found = self._spaces.get(space)
                if found is None and isinstance(first, RunCreated) and first.parent is not None:
                    found = self._runs.get(first.parent.run_id)
                if found is None:
                    raise LookupError(f"no test runtime for run {run_id}")
                self._runs[run_id] = found
            return found

    def run_workflow(self, invocation: WorkflowInvocation) -> Any:
        runtime = self._for(invocation.run_id, invocation.history[0].event)
        result: RuntimeCommand | Any = runtime.run_workflow(invocation)
        return result

    def run_step(self, invocation: StepInvocation) -> object:
        runtime = self._for(invocation.run_id, invocation.history[0].event)
        return runtime.run_step(invocation)


class EventCache:
    """Every committed event of a deployment's events topic, read by one ``read_committed``
    consumer that stays assigned, so the drivers can poll a run's history cheaply (``FlowClient``
    makes a consumer for each read). ``history`` reads the run's partition to its end first."""

    def __init__(self, settings: Settings) -> None:
        self.topic = f"{settings.topic_prefix}.{EVENTS}"
        self.partitions = load_topology().run_partitions
        # A fetch waits 10 ms at most for data (not 500): a watermark query queues behind the
        # fetch in flight on the broker's connection. Partitions are paused between reads.
        self._consumer = clients.new_consumer(
            settings.bootstrap,
            f"{settings.group}-cache-unused",
            {"fetch.wait.max.ms": 10, "fetch.error.backoff.ms": 20, "fetch.queue.backoff.ms": 10},
        )
        assigned = [clients.TopicPartition(self.topic, p, 0) for p in range(self.partitions)]
        self._consumer.assign(assigned)
        # Paused but while one is read: an idle consumer assigned to every partition would ask
        # the broker for each of them every 10 ms, for as long as the host lives.
        self._consumer.pause(assigned)
        # Asks for the end of a partition past open transactions (a barrier, below).
        self._uncommitted = clients.new_consumer(
            settings.bootstrap,
            f"{settings.group}-cache-unused",
            {"isolation.level": "read_uncommitted"},
        )
        self._runs: dict[str, list[EventEnvelope]] = {}
        self._lock = threading.Lock()

    def history(
        self, run_id: str, timeout: float = 30.0, *, barrier: bool = False
    ) -> list[EventEnvelope]:
        """The run's committed events now (empty: none yet). A read committed consumer stops at
        the partition's last stable offset; with ``barrier`` it reads on past every transaction
        open now, once it commits: a command's outcome can be visible before the commit marker
        of its events' partition is written."""
        partition = partition_for(run_id, self.partitions)
        deadline = time.monotonic() + timeout
        with self._lock:
            reader = self._uncommitted if barrier else self._consumer
            end = high_watermark(reader, self.topic, partition, deadline)
            where = [clients.TopicPartition(self.topic, partition)]
            if end and self._consumer.position(where)[0].offset < end:
                self._consumer.resume(where)
                try:
                    while self._consumer.position(where)[0].offset < end:
                        if time.monotonic() > deadline:
                            raise TimeoutError(f"{self.topic}[{partition}] did not reach {end}")
                        # (``consume`` waits out its timeout unless the batch fills up.)
                        first = self._consumer.poll(0.005)
                        if first is None:
                            continue
                        messages = [first, *self._consumer.consume(num_messages=999, timeout=0)]
                        for envelope in wire.decode_events(messages, on_bad=_no_bad_record):
                            self._runs.setdefault(envelope.run_id, []).append(envelope)
                finally:
                    self._consumer.pause(where)
            return list(self._runs.get(run_id, ()))

    def close(self) -> None:
        self._consumer.close()
        self._uncommitted.close()


def _no_bad_record(bad: wire.BadRecord) -> None:
    raise AssertionError(f"a committed event record does not decode: {bad}")


class ProcessorHost:
    """One in-process processor on its own topics, group, state directory and clock."""

    def __init__(
        self,
        bootstrap: str,
        prefix: str,
        state_dir: Path,
        *,
        builds: tuple[str | None, ...] = (None,),
        settings: Mapping[str, Any] | None = None,
    ) -> None:
        self.prefix = prefix
        self.clock = FakeClock()
        self.router = RoutingRuntime()
        topics.apply(bootstrap, load_topology(), prefix=prefix, replication_factor=1)
        self.settings = Settings(
            bootstrap=bootstrap,
            topic_prefix=prefix,
            group=f"{prefix}-group",
            instance_id=f"{prefix}-p1",
            state_dir=str(state_dir),
            **dict(settings or {}),
        )
        runtimes: dict[str | None, FlowRuntime] = {build: self.router for build in builds}
        self.processor = Processor(self.settings, runtimes, clock=self.clock)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name=f"processor-{prefix}", daemon=True)
        self._thread.start()
        self.client = FlowClient(
            Settings(bootstrap=bootstrap, topic_prefix=prefix, group=f"{prefix}-client"),
            timeout=30,
        )
        self.events = EventCache(self.client.settings)
        deadline = time.monotonic() + _READY_S
        while not self.processor.ready.is_set():
            if self.error is not None or not self._thread.is_alive():
                raise RuntimeError(f"the processor of {prefix} stopped") from self.error
            if time.monotonic() > deadline:
                raise RuntimeError(f"the processor of {prefix} was not ready in {_READY_S} s")
            time.sleep(0.05)

    def _main(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            await self.processor.run(self._stop)

        try:
            asyncio.run(main())
        except BaseException as exc:  # reported by the tests that use the host
            self.error = exc

    def check(self) -> None:
        """Raise if the processor's loop died (a test's failure would otherwise be a timeout)."""
        if self.error is not None or not self._thread.is_alive():
            raise RuntimeError(f"the processor of {self.prefix} stopped") from self.error

    def close(self) -> None:
        self.client.close()
        self.events.close()
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and self._thread.is_alive():
            loop.call_soon_threadsafe(stop.set)
        self._thread.join(30)


class ProcessorPool:
    """The hosts of a test session, one per configuration, made when first asked for."""

    def __init__(self, bootstrap: str, root: Path, stem: str) -> None:
        self.bootstrap = bootstrap
        self.root = root
        self.stem = stem
        self._hosts: dict[tuple[Any, ...], ProcessorHost] = {}

    def host(
        self,
        *,
        builds: tuple[str | None, ...] = (None,),
        settings: Mapping[str, Any] | None = None,
    ) -> ProcessorHost:
        key = (builds, tuple(sorted((settings or {}).items())))
        found = self._hosts.get(key)
        if found is None:
            prefix = f"t-{self.stem}-{uuid.uuid4().hex[:8]}"
            found = ProcessorHost(
                self.bootstrap,
                prefix,
                self.root / prefix,
                builds=builds,
                settings=settings,
            )
            self._hosts[key] = found
        found.check()
        return found

    def close(self) -> None:
        for host in self._hosts.values():
            host.close()
        self._hosts.clear()
