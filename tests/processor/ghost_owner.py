"""A stand-in for a processor that dies with a transaction open (run as a module).

It joins the group over the command topics like a processor, commits one transaction whose
positions name its writer (``WRITER``), opens a second one that writes to every events
partition and sends positions again, and exits without ending it: the transaction stays open
on the coordinator for its whole (long) timeout unless someone fences the writer's ids.
"""

from __future__ import annotations

import os
import sys

from flowstream.kafka import clients
from flowstream.processor.txn.slot import transactional_ids
from flowstream.topology import CMD_CANCEL, CMD_HOOK, CMD_SIGNAL, CMD_START, CMD_TIMER, EVENTS
from flowstream.wire import ANCHOR_HEADERS

#: The writer id of the dead member (``<instance>/<token>``).
WRITER = "ghost/0badf00d"


def main(bootstrap: str, prefix: str, group: str, partitions: int) -> None:
    commands = [
        f"{prefix}.{name}" for name in (CMD_START, CMD_SIGNAL, CMD_HOOK, CMD_CANCEL, CMD_TIMER)
    ]
    consumer = clients.new_consumer(
        bootstrap,
        group,
        {
            "session.timeout.ms": 2000,
            "heartbeat.interval.ms": 400,
            "partition.assignment.strategy": "range",
        },
    )
    consumer.subscribe(commands)
    while len(consumer.assignment()) < len(commands) * partitions:
        consumer.poll(0.2)
    producer = clients.new_transactional_producer(
        bootstrap, transactional_ids(group, WRITER)[0], {"transaction.timeout.ms": 120_000}
    )
    producer.init_transactions(30)
    for transaction in range(2):
        producer.begin_transaction()
        for partition in range(partitions):
            producer.produce(f"{prefix}.{EVENTS}", b"", partition=partition, headers=ANCHOR_HEADERS)
        positions = [
            clients.TopicPartition(topic, p, 0, metadata=WRITER)
            for topic in commands
            for p in range(partitions)
        ]
        producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata())
        producer.flush(20)
        if transaction == 0:
            producer.commit_transaction(20)
    print("ghost: dying with a transaction open", flush=True)
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
