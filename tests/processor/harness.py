"""Real ``flowstream worker`` processes and topics for the processor tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import orjson

from flowstream import wire
from flowstream.client import FlowClient
from flowstream.kafka import clients, topics
from flowstream.model.events import EventEnvelope
from flowstream.processor.txn.slot import transactional_ids
from flowstream.settings import Settings
from flowstream.topology import CMD_HOOK, CMD_SIGNAL, CMD_START, Topology, load_topology

ROOT = Path(__file__).resolve().parents[2]


def apply_topics(
    bootstrap: str, prefix: str, replication_factor: int = 1, topology: Topology | None = None
) -> None:
    topology = topology or load_topology()
    topics.apply(bootstrap, topology, prefix=prefix, replication_factor=replication_factor)


class Worker:
    """One processor process; stdout/stderr go to ``<state>/<name>.log``; its instance id is
    its name unless given."""

    def __init__(
        self,
        name: str,
        *,
        bootstrap: str,
        prefix: str,
        group: str,
        state_dir: Path,
        step_log: Path,
        app: str | None = "tests.processor.apps:runtime",
        builds: tuple[str, ...] = (),
        extra_env: dict[str, str] | None = None,
        instance_id: str | None = None,
    ) -> None:
        self.name = name
        self.log_path = state_dir / f"{name}.log"
        state_dir.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable,
            "-m",
            "flowstream",
            "worker",
            "--bootstrap",
            bootstrap,
            "--prefix",
            prefix,
            "--group",
            group,
            "--state-dir",
            str(state_dir / name),
            "--instance-id",
            instance_id or name,
        ]
        if app:
            command += ["--app", app]
        for build in builds:
            command += ["--build", build]
        env = dict(os.environ)
        env["FLOWSTREAM_TEST_STEP_LOG"] = str(step_log)
        env.update(extra_env or {})
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def signal(self, signum: int) -> None:
        os.kill(self.process.pid, signum)

    def stop(self, timeout: float = 20) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._log.close()
        return self.process.returncode

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(10)
        self._log.close()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stacks(self) -> str:
        """Every thread's stack of a live worker (its SIGUSR1 handler prints them)."""
        if self.process.poll() is not None:
            return ""
        before = len(self.output())
        self.signal(signal.SIGUSR1)
        time.sleep(0.5)
        return self.output()[before:]


def step_runs(step_log: Path) -> Counter[tuple[str, str]]:
    """How many times each (run, step) really executed."""
    counts: Counter[tuple[str, str]] = Counter()
    if step_log.exists():
        for line in step_log.read_bytes().splitlines():
            entry = orjson.loads(line)
            counts[(entry["run"], entry["step"])] += 1
    return counts


def step_log(step_log: Path) -> list[dict[str, object]]:
    if not step_log.exists():
        return []
    return [orjson.loads(line) for line in step_log.read_bytes().splitlines()]


def raw_events(bootstrap: str, prefix: str, partitions: int) -> list[tuple[str, int, str, str]]:
    """Every committed event record: (run id, sequence, event type, writer)."""
    return [
        (envelope.run_id, envelope.sequence, envelope.event.type, writer)
        for envelope, writer in committed_events(bootstrap, prefix, partitions)
    ]


def committed_events(
    bootstrap: str, prefix: str, partitions: int
) -> list[tuple[EventEnvelope, str]]:
    """Every committed event record with its writer, decoded through the codec, from the start
    of every partition."""
    return [
        (envelope, writer) for envelope, writer, _ in _event_records(bootstrap, prefix, partitions)
    ]


def event_offsets(bootstrap: str, prefix: str, partitions: int) -> dict[str, list[tuple[int, int]]]:
    """Each run's committed event records as (partition, offset), in order."""
    offsets: dict[str, list[tuple[int, int]]] = {}
    for envelope, _, at in _event_records(bootstrap, prefix, partitions):
        offsets.setdefault(envelope.run_id, []).append(at)
    return offsets


def record_offsets(
    bootstrap: str, prefix: str, partitions: int
) -> tuple[set[tuple[int, int]], dict[int, int]]:
    """(partition, offset) of every committed record of the events topic, of any kind (an offset
    below its partition's end that is not here holds a transaction marker or an aborted record),
    and each partition's end."""
    every: set[tuple[int, int]] = set()
    ends: dict[int, int] = {}
    _event_records(bootstrap, prefix, partitions, every, ends)
    return every, ends


def _event_records(
    bootstrap: str,
    prefix: str,
    partitions: int,
    every: set[tuple[int, int]] | None = None,
    ends: dict[int, int] | None = None,
) -> list[tuple[EventEnvelope, str, tuple[int, int]]]:
    from flowstream.kafka import clients

    consumer = clients.new_consumer(
        bootstrap, f"{prefix}-raw-reader", {"enable.partition.eof": True}
    )
    topic = f"{prefix}.events"
    consumer.assign([clients.TopicPartition(topic, p, 0) for p in range(partitions)])
    ends = {} if ends is None else ends
    for p in range(partitions):
        ends[p] = consumer.get_watermark_offsets(
            clients.TopicPartition(topic, p), timeout=10, cached=False
        )[1]
    found: list[tuple[EventEnvelope, str, tuple[int, int]]] = []
    eof: set[int] = set()
    deadline = time.monotonic() + 60
    while len(eof) < partitions and time.monotonic() < deadline:
        messages = consumer.consume(500, 0.2)
        for message in messages:
            error = message.error()
            if error is not None:
                partition = message.partition()
                at_end = message.offset() >= ends[partition] or ends[partition] == 0
                if error.code() == clients.KafkaError._PARTITION_EOF and at_end:
                    eof.add(partition)
        if every is not None:
            every.update((m.partition(), m.offset()) for m in messages if m.error() is None)
        for message, envelope in wire.event_records(messages, on_bad=_no_bad_record):
            at = (message.partition(), message.offset())
            found.append((envelope, wire.writer_of(message), at))
    consumer.close()
    return found


def _no_bad_record(bad: wire.BadRecord) -> None:
    raise AssertionError(f"a committed event record does not decode: {bad}")


def assert_no_duplicate_sequences(records: list[tuple[str, int, str, str]]) -> None:
    by_run: dict[str, list[int]] = {}
    for run_id, sequence, _, _ in records:
        by_run.setdefault(run_id, []).append(sequence)
    for run_id, sequences in by_run.items():
        assert sequences == list(range(1, len(sequences) + 1)), (run_id, sequences)


def assert_contiguous(history: list[EventEnvelope]) -> None:
    sequences = [e.sequence for e in history]
    assert sequences == list(range(1, len(history) + 1)), sequences


class Load:
    """Starts runs at a steady rate from a background thread until stopped."""

    def __init__(
        self, client: object, spec: object, prefix: str, rate: float, options: dict[str, object]
    ) -> None:
        import threading

        self.run_ids: list[str] = []
        self._stop = threading.Event()
        self._client = client
        self._spec = spec
        self._prefix = prefix
        self._interval = 1 / rate
        self._options = options
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        index = 0
        while not self._stop.is_set():
            run_id = f"{self._prefix}-{index:04d}"
            self._client.start(run_id, self._spec, self._options)  # type: ignore[attr-defined]
            self._client.flush()  # type: ignore[attr-defined]
            self.run_ids.append(run_id)
            index += 1
            time.sleep(self._interval)

    def stop(self) -> list[str]:
        self._stop.set()
        self._thread.join(10)
        return list(self.run_ids)


def wait_until(predicate: object, timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(message)


def three_brokers_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Wait until the three brokers of ``bootstrap`` are registered, then create ``topic``
    with ``partitions`` partitions replicated on all three."""
    wait_until(
        lambda: len(clients.probe_brokers(bootstrap, 5) or ()) == 3,
        90,
        "the three brokers did not all register",
    )
    admin = clients.new_admin(bootstrap)
    admin.create_topics([clients.NewTopic(topic, partitions, 3)])[topic].result(30)


class Cluster:
    """Topics under one prefix, a client, and the worker processes of one consumer group."""

    def __init__(
        self, bootstrap: str, prefix: str, root: Path, topology: Topology | None = None
    ) -> None:
        self.bootstrap = bootstrap
        self.prefix = prefix
        self.root = root
        self.group = f"{prefix}-group"
        self.step_log = root / "steps.jsonl"
        self.workers: dict[str, Worker] = {}
        apply_topics(bootstrap, prefix, topology=topology)
        self.client = FlowClient(
            Settings(bootstrap=bootstrap, topic_prefix=prefix, group=f"{prefix}-client"), wait=False
        )

    def start(
        self,
        name: str,
        extra_env: dict[str, str] | None = None,
        app: str = "tests.processor.apps:runtime",
        instance_id: str | None = None,
    ) -> Worker:
        worker = Worker(
            name,
            bootstrap=self.bootstrap,
            prefix=self.prefix,
            group=self.group,
            state_dir=self.root / "state",
            step_log=self.step_log,
            app=app,
            extra_env=extra_env,
            instance_id=instance_id,
        )
        self.workers[name] = worker
        return worker

    def logs(self) -> str:
        return "\n".join(f"--- {n}\n{w.output()[-1500:]}" for n, w in self.workers.items())

    def close(self) -> None:
        self.client.close()
        for worker in self.workers.values():
            worker.stop()


def free_port() -> int:
    """A TCP port nothing listens on now (for a worker's metrics)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def metric(port: int, name: str) -> float:
    """One sample of a worker's metrics page."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


def transactional_ids_of(cluster: Cluster, instance: str, timeout: float = 30) -> list[str]:
    """The transactional ids a live worker writes with now: made from the writer its last
    committed positions name (``<instance>/<token>``; see ``processor.fence``)."""
    topics = [f"{cluster.prefix}.{name}" for name in (CMD_START, CMD_SIGNAL, CMD_HOOK)]
    wanted = [
        clients.TopicPartition(topic, p)
        for topic in topics
        for p in range(cluster.client.partitions)
    ]
    reader = clients.new_consumer(
        cluster.bootstrap, cluster.group, {"isolation.level": "read_uncommitted"}
    )
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            writers = {
                tp.metadata
                for tp in reader.committed(wanted, timeout=10)
                if tp.metadata and tp.metadata.startswith(f"{instance}/")
            }
            if len(writers) == 1:
                return transactional_ids(cluster.group, writers.pop())
            time.sleep(0.2)
    finally:
        reader.close()
    raise AssertionError(f"no single writer of {instance} in the group's positions")


def positions_without_writer(cluster: Cluster, samples: int) -> list[tuple[str, int, int]]:
    """Committed positions of the command topics that name no writer, over ``samples`` reads
    0.1 s apart (each commit that moves a position must name its writer again)."""
    topics = [f"{cluster.prefix}.{name}" for name in (CMD_START, CMD_SIGNAL, CMD_HOOK)]
    wanted = [
        clients.TopicPartition(topic, p)
        for topic in topics
        for p in range(cluster.client.partitions)
    ]
    reader = clients.new_consumer(
        cluster.bootstrap, cluster.group, {"isolation.level": "read_uncommitted"}
    )
    unnamed: list[tuple[str, int, int]] = []
    try:
        for _ in range(samples):
            for tp in reader.committed(wanted, timeout=10):
                if tp.offset > 0 and not tp.metadata:
                    unnamed.append((tp.topic, tp.partition, tp.offset))
            time.sleep(0.1)
    finally:
        reader.close()
    return unnamed
