"""``OwnerFence``: on taking partitions, abort what their previous owner left open, if it is gone.

A member that dies with a transaction open holds back the partitions that transaction touched:
its records on the events topic hold the last stable offset, and the consumer positions it
sent are a pending offset commit, so the next owner's ``committed()`` (a ``read_committed``
consumer asks for stable offsets) waits. Left alone, the coordinator aborts the transaction
once it is ``transaction.timeout.ms`` old, and failover takes at least that long.

Every transaction names its writer in the metadata of the positions it commits (the instance
id). On an assignment the new owner reads the last committed positions without waiting for
stable ones (an admin call), and for each previous owner that is not a member of the group any
more it initialises that owner's transactional ids itself: the coordinator aborts what they had
open and fences the dead producers (a paused one, woken later, finds itself fenced and
rejoins). That is all it does; if it fails (the owner is unknown, the coordinator is moving),
the coordinator's timeout still ends the transaction, later.

An owner still in the group is never fenced: its partitions moved in a rebalance, and it
committed what it had before giving them up.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from flowstream.kafka import clients
from flowstream.processor.context import Context

__all__ = ["OwnerFence", "transactional_ids"]

LOG = logging.getLogger("flowstream.processor")

#: The longest an assignment waits for the fences (the coordinator's timeout is the fallback).
_FENCE_S = 10.0


def transactional_ids(group: str, instance: str) -> list[str]:
    """The transactional ids of the two producers of ``instance`` in ``group``:
    ``<group>/<instance>`` and ``<group>/<instance>#1``. An instance id has neither ``/`` nor
    ``#`` (``Settings``), so no two pairs (group, instance) share an id."""
    return [f"{group}/{instance}", f"{group}/{instance}#1"]


class OwnerFence:
    """Fences the transactional ids of a dead previous owner of the partitions taken."""

    def __init__(self, ctx: Context, admin: Any) -> None:
        self.ctx = ctx
        self.admin = admin
        #: Instances fenced by this member (for tests and the log).
        self.fenced: list[str] = []

    def previous_owners(self, assigned: Iterable[Any]) -> set[str]:
        """The instances that wrote the last committed positions of ``assigned``."""
        s = self.ctx.settings
        wanted = {(tp.topic, tp.partition) for tp in assigned}
        request = clients.ConsumerGroupTopicPartitions(
            s.group, [clients.TopicPartition(t, p) for t, p in sorted(wanted)]
        )
        found = self.admin.list_consumer_group_offsets(
            [request], require_stable=False, request_timeout=5
        )[s.group].result(8)
        return {
            tp.metadata
            for tp in found.topic_partitions
            if tp.metadata and tp.metadata != s.instance_id and tp.offset >= 0
        }

    def live_instances(self) -> set[str]:
        """The instance ids of the group's members (their client id is ``<group>/<instance>``)."""
        group = self.ctx.settings.group
        found = self.admin.describe_consumer_groups([group], request_timeout=5)[group].result(8)
        prefix = f"{group}/"
        return {
            m.client_id[len(prefix) :]
            for m in getattr(found, "members", [])
            if m.client_id.startswith(prefix)
        }

    def fence(self, assigned: list[Any]) -> None:
        """Abort what a gone previous owner of ``assigned`` left open; never raises."""
        began = time.monotonic()
        try:
            owners = self.previous_owners(assigned)
            if owners:
                owners -= self.live_instances()
        except Exception as exc:  # a liveness shortcut only: the timeout still applies
            LOG.info("previous owners not looked up (%s): not fenced", exc)
            return
        if not owners:
            return
        ids = [
            t for owner in sorted(owners) for t in transactional_ids(self.ctx.settings.group, owner)
        ]
        with ThreadPoolExecutor(max_workers=len(ids), thread_name_prefix="fence") as pool:
            done = list(pool.map(self._fence_one, ids))
        fenced = [i for i, ok in zip(ids, done, strict=True) if ok]
        self.fenced.extend(sorted(owners))
        self.ctx.metrics.owner_fences.inc(len(owners))
        LOG.info(
            "fenced the transactional ids of %s (previous owners, gone from the group) in "
            "%.2f s: %d of %d",
            ", ".join(sorted(owners)),
            time.monotonic() - began,
            len(fenced),
            len(ids),
        )

    def _fence_one(self, transactional_id: str) -> bool:
        producer = clients.new_transactional_producer(
            self.ctx.settings.bootstrap, transactional_id, {"transaction.timeout.ms": 60_000}
        )
        try:
            producer.init_transactions(_FENCE_S)
            return True
        except clients.KafkaException as exc:
            LOG.info("transactional id %s not fenced (%s)", transactional_id, exc)
            return False
        finally:
            producer.flush(0)
