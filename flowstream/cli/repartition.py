"""``flowstream kafka repartition --to-prefix NEW [--partitions N]``: move a deployment to topics
with another partition count (:mod:`flowstream.repartition`), then audit the move.

Stop the old processors first. The verb copies the histories, carries the commands the old group
had not applied, and forwards the commands that still arrive on the old topics until SIGINT or
SIGTERM (or ``--forward-seconds``); start the processors of the new prefix, with a topology that
declares the new count, once it says it forwards. It ends with the audit of the old and the new
topics (``--audit-only``: that alone). Interrupted, it is resumed by running it again.
Exit codes: 0 moved and audited; 1 a check failed, the move stopped, or the audit found problems.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from typing import Any

from flowstream.errors import FlowError
from flowstream.kafka import clients
from flowstream.settings import Settings
from flowstream.topology import load_topology

__all__ = ["register"]

_TEXT = "move the deployment to topics with another partition count, under a new prefix"
_DESCRIPTION = (
    "Move a deployment to topics with another partition count under a new prefix. Stop the old "
    "processors first. It copies the histories, carries the commands the old group had not "
    "applied, and forwards the commands that still arrive on the old topics until SIGINT or "
    "SIGTERM (or --forward-seconds); start the processors of the new prefix, with a topology "
    "that declares the new count, once it says it forwards. It ends with an audit of the old "
    "and the new topics. Interrupted, it resumes when run again. Exit codes: 0 moved and "
    "audited; 1 a check failed, the move stopped, or the audit found problems."
)


def register(verbs: Any, common: argparse.ArgumentParser) -> None:
    verb: argparse.ArgumentParser = verbs.add_parser(
        "repartition", help=_TEXT, description=_DESCRIPTION, parents=[common]
    )
    verb.add_argument("--to-prefix", required=True, help="the new topics' prefix (empty)")
    verb.add_argument(
        "--partitions",
        type=int,
        help="the new partition count (default: the topology's)",
    )
    verb.add_argument("--group", help="the old processors' consumer group (FLOWSTREAM_GROUP)")
    verb.add_argument(
        "--replication-factor",
        type=int,
        help="override the declared replication factor of the new topics",
    )
    verb.add_argument(
        "--forward-seconds",
        type=float,
        help="forward commands this long, then stop (default: until SIGINT or SIGTERM; "
        "0: carry the waiting commands only)",
    )
    verb.add_argument(
        "--audit-only", action="store_true", help="audit a move begun earlier, change nothing"
    )
    verb.set_defaults(handler=_run)


def _say(line: str) -> None:
    print(line, flush=True)


def _run(args: argparse.Namespace) -> int:
    from flowstream.repartition.audit import audit_move
    from flowstream.repartition.move import run_move
    from flowstream.repartition.plan import MovePlan

    head = "error:"
    settings = Settings.from_env(
        bootstrap=args.bootstrap, topic_prefix=args.topic_prefix, group=args.group
    )
    stopped = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stopped.set()) for s in _SIGNALS}
    try:
        topology = load_topology(args.topology)
        plan = MovePlan.prepare(
            settings.bootstrap,
            topology,
            source=settings.topic_prefix,
            target=args.to_prefix,
            group=settings.group,
            partitions=args.partitions,
            replication_factor=args.replication_factor,
            timeout=args.timeout,
        )
        if not args.audit_only:
            until = (
                None if args.forward_seconds is None else time.monotonic() + args.forward_seconds
            )
            report = run_move(
                plan,
                stop=lambda: stopped.is_set() or (until is not None and time.monotonic() >= until),
                forward=args.forward_seconds != 0,
                say=_say,
                timeout=args.timeout,
            )
            if report.interrupted:
                return 1
            if plan.partitions != topology.run_partitions:
                _say(
                    f"note: the processors of {plan.target} need a topology that declares "
                    f"{plan.partitions} partitions (--topology, FLOWSTREAM_TOPOLOGY)"
                )
        _say(f"auditing {plan.source} against {plan.target}")
        audit = audit_move(plan)
        for line in audit.lines():
            _say(line)
        return 0 if audit.ok else 1
    except FlowError as exc:
        print(f"{head} {exc}", file=sys.stderr)
        return 1
    except clients.KafkaException as exc:
        print(f"{head} Kafka at {settings.bootstrap}: {exc}", file=sys.stderr)
        return 1
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


_SIGNALS = (signal.SIGINT, signal.SIGTERM)
