"""``flowstream topics apply|verify``: create and check the topics declared in ``topology/``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from flowstream.topology import TopologyError, load_topology

__all__ = ["register"]

_DEV_BOOTSTRAP = "127.0.0.1:19092"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "topics",
        help="create (apply) or check (verify) the Kafka topics of topology/topics.toml",
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, text in (
        ("apply", "create missing topics, then verify every declared topic"),
        ("verify", "check every declared topic exists with its partitions and cleanup policy"),
    ):
        action = actions.add_parser(name, help=text, description=text)
        action.add_argument(
            "--bootstrap",
            default=_DEV_BOOTSTRAP,
            help=f"Kafka bootstrap servers (default {_DEV_BOOTSTRAP}, the dev-kafka broker)",
        )
        action.add_argument(
            "--prefix", default=None, help="topic name prefix (default: the topology's prefix)"
        )
        action.add_argument(
            "--topology",
            type=Path,
            default=None,
            help="topology file (default $FLOWSTREAM_TOPOLOGY or topology/topics.toml)",
        )
        action.add_argument("--timeout", type=float, default=30.0, help="seconds (default 30)")
        if name == "apply":
            action.add_argument(
                "--replication-factor",
                type=int,
                default=None,
                help="override the declared replication factor (1 for a one-broker cluster)",
            )
        action.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    # Imported here so that `flowstream --help` does not load the Kafka client library.
    from flowstream.kafka import topics
    from flowstream.kafka.clients import KafkaException

    try:
        topology = load_topology(args.topology)
        if args.action == "apply":
            states = topics.apply(
                args.bootstrap,
                topology,
                prefix=args.prefix,
                replication_factor=args.replication_factor,
                timeout=args.timeout,
            )
        else:
            states = topics.verify(
                args.bootstrap, topology, prefix=args.prefix, timeout=args.timeout
            )
    except TopologyError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KafkaException as error:
        print(f"error: Kafka at {args.bootstrap}: {error}", file=sys.stderr)
        return 1
    for state in states:
        what = "created" if state.created else "ok"
        print(f"{what:8} {state.name} ({state.partitions} partitions)")
    return 0
