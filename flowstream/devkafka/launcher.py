"""Start, find, stop and break a local Kafka cluster of one or three combined nodes.

A cluster lives in a home directory::

    <home>/cluster.json             version, cluster id and node ports of what was formatted
    <home>/node-<id>/server.properties, log4j2.properties, tools-log4j2.properties
    <home>/node-<id>/data/          KRaft metadata and topic data (kept across stop/start)
    <home>/node-<id>/kafka.log      the JVM's stdout and stderr
    <home>/node-<id>/kafka.pid      PID of the running node

``Cluster.start`` is idempotent: nodes already running are left alone, the others are started,
and it returns once every broker answers metadata requests. A home formatted for another
layout (ports, node count, Kafka version) is wiped and formatted again.
"""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from flowstream.devkafka import process
from flowstream.devkafka.config import (
    BROKER,
    BROKER_LOG4J,
    CONTROLLER,
    HOST,
    TOOLS_LOG4J,
    NodeSpec,
    server_properties,
)
from flowstream.devkafka.errors import DevKafkaError
from flowstream.devkafka.jars import KAFKA_VERSION, default_cache_root, ensure_jars
from flowstream.devkafka.jvm import broker_command, find_java, storage_command
from flowstream.kafka.clients import probe_brokers

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_PORT_3",
    "Cluster",
    "NodeStatus",
    "default_home",
    "ensure_broker",
    "stop",
]

#: Client port of the single-node cluster; its controller listens on the next port.
DEFAULT_PORT = 19092
#: First client port of the three-broker cluster (29092-29094; its controller on 29192).
DEFAULT_PORT_3 = 29092
_CONTROLLER_OFFSET_3 = 100
#: The node id of the three-broker cluster's controller (the brokers are 1-3).
_CONTROLLER_ID_3 = 4
#: A controller alone holds only the cluster's metadata.
_CONTROLLER_HEAP = "256m"
DEFAULT_TIMEOUT_S = 120.0
_STOP_GRACE_S = 30.0


def default_home(brokers: int = 1) -> Path:
    """Where ``flowstream dev-kafka`` keeps a cluster unless told otherwise."""
    suffix = "" if brokers == 1 else f"-{brokers}"
    return default_cache_root() / f"dev-kafka{suffix}"


def _layout(brokers: int, port: int | None) -> tuple[NodeSpec, ...]:
    if brokers == 1:
        base = DEFAULT_PORT if port is None else port
        return (NodeSpec(1, base, base + 1),)
    if brokers == 3:
        base = DEFAULT_PORT_3 if port is None else port
        controller = NodeSpec(_CONTROLLER_ID_3, 0, base + _CONTROLLER_OFFSET_3, CONTROLLER)
        return (controller, *(NodeSpec(i + 1, base + i, 0, BROKER) for i in range(3)))
    raise DevKafkaError(f"a dev cluster has 1 or 3 brokers, not {brokers}")


def _kafka_uuid() -> str:
    """A Kafka ``Uuid`` string: URL-safe base64 of 16 random bytes, no padding, no leading '-'."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode("ascii")
        if not text.startswith("-"):
            return text


@dataclass(frozen=True)
class NodeStatus:
    """Whether one node runs, with the files that tell more."""

    node: NodeSpec
    pid: int | None
    log: Path

    @property
    def running(self) -> bool:
        return self.pid is not None


class Cluster:
    """A local cluster under ``home``: one combined broker+controller, or three brokers and
    their controller (``nodes`` are the brokers, ``all_nodes`` the controller too)."""

    def __init__(
        self,
        home: Path,
        *,
        brokers: int = 1,
        port: int | None = None,
        version: str = KAFKA_VERSION,
        cache_root: Path | None = None,
        heap: str = "512m",
    ) -> None:
        self.home = Path(home).expanduser().absolute()
        self.all_nodes = _layout(brokers, port)
        self.nodes = tuple(node for node in self.all_nodes if node.is_broker)
        self.version = version
        self.cache_root = cache_root
        self.heap = heap

    @classmethod
    def from_home(cls, home: Path) -> Cluster | None:
        """The cluster last formatted under ``home``, or ``None`` if there is none."""
        stored = _Manifest.read(Path(home).expanduser().absolute())
        if stored is None or len(stored.nodes) not in (1, 4):
            return None
        brokers = 1 if len(stored.nodes) == 1 else 3
        port = stored.nodes[0][1] if brokers == 1 else stored.nodes[1][1]
        cluster = cls(home, brokers=brokers, port=port, version=stored.version)
        return cluster if _node_tuples(cluster.all_nodes) == stored.nodes else None

    @property
    def bootstrap(self) -> str:
        """The ``bootstrap.servers`` string of every node."""
        return ",".join(node.address for node in self.nodes)

    def node(self, node_id: int) -> NodeSpec:
        """The node with ``node_id`` (1, or 1-3 and the controller, 4)."""
        for node in self.all_nodes:
            if node.node_id == node_id:
                return node
        ids = ", ".join(str(node.node_id) for node in self.all_nodes)
        raise DevKafkaError(f"no node {node_id} in this cluster (its nodes: {ids})")

    def node_dir(self, node_id: int) -> Path:
        return self.home / f"node-{node_id}"

    def log_path(self, node_id: int) -> Path:
        return self.node_dir(node_id) / "kafka.log"

    # -- status -------------------------------------------------------------------------

    def status(self) -> list[NodeStatus]:
        """Each node's PID (``None`` when it is not running) and log file."""
        return [
            NodeStatus(node, self._running_pid(node.node_id), self.log_path(node.node_id))
            for node in self.all_nodes
        ]

    def is_running(self) -> bool:
        """Whether every node runs."""
        return all(s.running for s in self.status())

    def _properties(self, node_id: int) -> Path:
        return self.node_dir(node_id) / "server.properties"

    def _pid_file(self, node_id: int) -> Path:
        return self.node_dir(node_id) / "kafka.pid"

    def _running_pid(self, node_id: int) -> int | None:
        pid = process.read_pid(self._pid_file(node_id))
        if pid is None:
            return None
        if process.is_alive(pid, str(self._properties(node_id))):
            return pid
        with contextlib.suppress(FileNotFoundError):
            self._pid_file(node_id).unlink()
        return None

    # -- start --------------------------------------------------------------------------

    def start(self, *, timeout: float = DEFAULT_TIMEOUT_S, fresh: bool = False) -> str:
        """Start every node that is not running and wait until all brokers answer.

        ``fresh`` wipes the data and logs of a cluster that is not running. Returns the bootstrap
        string.
        """
        running = {s.node.node_id for s in self.status() if s.running}
        if len(running) == len(self.all_nodes):
            self.wait_ready(timeout=timeout)
            return self.bootstrap
        self._check_other_layout()
        if fresh and not running:
            self._wipe()
        missing = [node for node in self.all_nodes if node.node_id not in running]
        self._check_ports(missing)
        java = find_java()
        libs = ensure_jars(self.cache_root, version=self.version)
        self._prepare(java, libs, missing)
        self._launch(java, libs, missing, timeout=timeout)
        return self.bootstrap

    def start_node(
        self, node_id: int, *, timeout: float = DEFAULT_TIMEOUT_S, nice: int = 0
    ) -> None:
        """Start one stopped node of a formatted cluster and wait until every broker answers;
        ``nice``: its process's niceness (see :meth:`renice`)."""
        node = self.node(node_id)
        if self._running_pid(node_id) is not None:
            return
        if not (self.home / "cluster.json").is_file():
            raise DevKafkaError(f"no cluster formatted in {self.home}: start the cluster first")
        self._check_ports([node])
        java = find_java()
        libs = ensure_jars(self.cache_root, version=self.version)
        self._launch(java, libs, [node], timeout=timeout, nice=nice)

    def renice(self, node_id: int, nice: int) -> bool:
        """Set the running node's niceness; ``False`` if it is not running or that is not
        allowed (only a privileged user may lower it again)."""
        pid = self._running_pid(node_id)
        return pid is not None and process.renice(pid, nice)

    def _check_other_layout(self) -> None:
        stored = _Manifest.read(self.home)
        if stored is None or self._matches(stored):
            return
        other = Cluster.from_home(self.home)
        if other is not None and any(s.running for s in other.status()):
            raise DevKafkaError(
                f"{self.home} runs a cluster at {other.bootstrap}; stop it first "
                f"(flowstream dev-kafka stop --home {self.home})"
            )
        self._wipe()

    def _matches(self, stored: _Manifest) -> bool:
        return stored.version == self.version and stored.nodes == _node_tuples(self.all_nodes)

    def _wipe(self) -> None:
        for path in self.home.glob("node-*"):
            shutil.rmtree(path / "data", ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):
                (path / "kafka.log").unlink()
        with contextlib.suppress(FileNotFoundError):
            (self.home / "cluster.json").unlink()

    def _check_ports(self, nodes: Iterable[NodeSpec]) -> None:
        for node in nodes:
            for port in (node.port, node.controller_port):
                if port and not process.port_is_free(port, HOST):
                    raise DevKafkaError(
                        f"port {port} on {HOST} is already in use by another process; "
                        "stop it or choose other ports with --port"
                    )

    def _prepare(self, java: str, libs: Path, nodes: Sequence[NodeSpec]) -> None:
        """Write every node's files and format the nodes that have no metadata yet."""
        stored = _Manifest.read(self.home)
        cluster_id = stored.cluster_id if stored else _kafka_uuid()
        self.home.mkdir(parents=True, exist_ok=True)
        _Manifest(self.version, cluster_id, _node_tuples(self.all_nodes)).write(self.home)
        formatting: list[tuple[NodeSpec, subprocess.Popen[str]]] = []
        for node in nodes:
            node_dir = self.node_dir(node.node_id)
            data = node_dir / "data"
            for sub in (node_dir, node_dir / "tmp", node_dir / "logs"):
                sub.mkdir(parents=True, exist_ok=True)
            self._properties(node.node_id).write_text(server_properties(node, self.all_nodes, data))
            (node_dir / "log4j2.properties").write_text(BROKER_LOG4J)
            (node_dir / "tools-log4j2.properties").write_text(TOOLS_LOG4J)
            if _formatted_id(data) == cluster_id:
                continue
            shutil.rmtree(data, ignore_errors=True)
            command = storage_command(
                java, libs, node_dir, self._properties(node.node_id), cluster_id
            )
            formatting.append(
                (
                    node,
                    subprocess.Popen(
                        command,
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        text=True,
                        cwd=node_dir,
                    ),
                )
            )
        failures = []
        for node, formatter in formatting:
            try:
                output, _ = formatter.communicate(timeout=300)
            except subprocess.TimeoutExpired:
                formatter.kill()
                output, _ = formatter.communicate()
            if formatter.returncode != 0:
                lines = [line for line in output.splitlines() if line.strip()]
                detail = lines[-1] if lines else "no output"
                failures.append(
                    f"formatting Kafka storage of node {node.node_id} failed "
                    f"(exit {formatter.returncode}): {detail}"
                )
        if failures:
            raise DevKafkaError(failures[0])

    def _launch(
        self,
        java: str,
        libs: Path,
        nodes: Sequence[NodeSpec],
        *,
        timeout: float,
        nice: int = 0,
    ) -> None:
        started: list[NodeSpec] = []
        try:
            for node in nodes:
                node_dir = self.node_dir(node.node_id)
                heap = self.heap if node.is_broker else _CONTROLLER_HEAP
                command = broker_command(java, libs, node_dir, self._properties(node.node_id), heap)
                pid = process.spawn(
                    command, log_path=self.log_path(node.node_id), cwd=node_dir, nice=nice
                )
                self._pid_file(node.node_id).write_text(f"{pid}\n", encoding="ascii")
                started.append(node)
            self.wait_ready(timeout=timeout, nodes=nodes)
        except BaseException:
            self._terminate(started, grace=5.0)
            raise

    # -- readiness ----------------------------------------------------------------------

    def wait_ready(
        self, *, timeout: float = DEFAULT_TIMEOUT_S, nodes: Sequence[NodeSpec] | None = None
    ) -> None:
        """Wait until the brokers of ``nodes`` (all by default) answer metadata requests that
        name them. Only those must be running: another node may be down meanwhile (a test
        that kills brokers restarts one while it kills the next)."""
        wanted = list(self.all_nodes if nodes is None else nodes)
        brokers = [node for node in wanted if node.is_broker]
        deadline = time.monotonic() + timeout
        expected = frozenset(node.node_id for node in brokers)
        while True:
            self._check_alive(wanted)
            if all(process.port_accepts(n.port or n.controller_port, HOST) for n in wanted) and (
                not brokers or expected <= self._answering(brokers)
            ):
                return
            if time.monotonic() >= deadline:
                raise DevKafkaError(
                    f"Kafka at {self.bootstrap} did not come up within {timeout:g} s; "
                    f"see {self._log_hint()}"
                )
            time.sleep(0.25)

    @staticmethod
    def _answering(brokers: Sequence[NodeSpec]) -> frozenset[int]:
        """The ids of the brokers a metadata request to ``brokers`` names."""
        return probe_brokers(",".join(n.address for n in brokers), timeout=5.0) or frozenset()

    def _check_alive(self, nodes: Sequence[NodeSpec]) -> None:
        for node in nodes:
            if self._running_pid(node.node_id) is not None:
                continue
            log = self.log_path(node.node_id)
            detail = _last_error(log)
            raise DevKafkaError(
                f"Kafka node {node.node_id} ({node.address}) is not running"
                + (f" ({detail})" if detail else "")
                + f"; see {log}"
            )

    def _log_hint(self) -> str:
        logs = [str(self.log_path(node.node_id)) for node in self.all_nodes]
        return logs[0] if len(logs) == 1 else f"{logs[0]} (and the other nodes' kafka.log)"

    # -- stop ---------------------------------------------------------------------------

    def stop(self, *, grace: float = _STOP_GRACE_S) -> bool:
        """Stop every node (SIGTERM all at once, SIGKILL after ``grace``); True if any ran."""
        return self._terminate(self.all_nodes, grace=grace)

    def stop_node(self, node_id: int, *, grace: float = _STOP_GRACE_S) -> bool:
        """Stop one node cleanly (SIGTERM, then SIGKILL after ``grace``)."""
        return self._terminate([self.node(node_id)], grace=grace)

    def kill_node(self, node_id: int) -> None:
        """SIGKILL one node, as a crash would, and wait until it is gone."""
        node = self.node(node_id)
        pid = self._running_pid(node.node_id)
        if pid is not None:
            process.kill(pid, str(self._properties(node.node_id)))
        with contextlib.suppress(FileNotFoundError):
            self._pid_file(node.node_id).unlink()

    def _terminate(self, nodes: Iterable[NodeSpec], *, grace: float) -> bool:
        targets = []
        for node in nodes:
            pid = self._running_pid(node.node_id)
            if pid is not None:
                targets.append((node, pid))
        process.terminate(
            [(pid, str(self._properties(node.node_id))) for node, pid in targets], grace=grace
        )
        for node, _ in targets:
            with contextlib.suppress(FileNotFoundError):
                self._pid_file(node.node_id).unlink()
        return bool(targets)


def ensure_broker(
    home: Path,
    port: int = DEFAULT_PORT,
    *,
    brokers: int = 1,
    timeout: float = DEFAULT_TIMEOUT_S,
    fresh: bool = False,
) -> str:
    """Start (or find running) the cluster under ``home`` and return its bootstrap string."""
    return Cluster(home, brokers=brokers, port=port).start(timeout=timeout, fresh=fresh)


def stop(home: Path, *, grace: float = _STOP_GRACE_S) -> bool:
    """Stop whatever cluster was formatted under ``home``; True if a node was running."""
    cluster = Cluster.from_home(home)
    return False if cluster is None else cluster.stop(grace=grace)


def _node_tuples(nodes: Iterable[NodeSpec]) -> tuple[tuple[int, int, int], ...]:
    return tuple((n.node_id, n.port, n.controller_port) for n in nodes)


@dataclass(frozen=True)
class _Manifest:
    """``cluster.json``: what the home's data directories were formatted for."""

    version: str
    cluster_id: str
    nodes: tuple[tuple[int, int, int], ...]

    @classmethod
    def read(cls, home: Path) -> _Manifest | None:
        try:
            data = json.loads((home / "cluster.json").read_text())
            return cls(
                version=str(data["version"]),
                cluster_id=str(data["cluster_id"]),
                nodes=tuple((int(a), int(b), int(c)) for a, b, c in data["nodes"]),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def write(self, home: Path) -> None:
        body = {"version": self.version, "cluster_id": self.cluster_id, "nodes": self.nodes}
        (home / "cluster.json").write_text(json.dumps(body, indent=2) + "\n")


def _formatted_id(data_dir: Path) -> str | None:
    try:
        text = (data_dir / "meta.properties").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "cluster.id":
            return value.strip()
    return None


def _last_error(log: Path) -> str | None:
    """The last ERROR or exception line of the log's tail, shortened to fit one line."""
    try:
        with log.open("rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - 65536))
            tail = handle.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    for line in reversed(tail):
        if " ERROR " in line or "Exception" in line or line.startswith("Error"):
            text = line.strip()
            return text if len(text) <= 240 else text[:237] + "..."
    return None
