"""The floor of one small Kafka transaction on this broker, and what registering a partition costs.

One transactional producer (built by ``flowstream.kafka.clients``, as the processor's are) runs
``--rounds`` transactions one after another, each ``begin``, three 100-byte records to partition 0,
``flush`` and ``commit``, in two ways that alternate:

* **plain**: the first record registers the partition with the transaction (librdkafka sends
  AddPartitionsToTxn from a 1 ms timer, then the record);
* **anchored**: an empty record registers the partition first (timed on its own, as the
  processor's anchors are), so the three records find it registered.

Prints the median of each phase in ms. The processor's step cycle pays the plain cost whenever
its anchor for the next transaction is not done by the time the step's outcome is decided.

Usage: ``python -m benchmarks.txn_floor [--rounds 300]``
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from benchmarks import harness
from flowstream.kafka import clients


def _round(p: Any, topic: str, anchored: bool) -> tuple[float, float, float]:
    began = time.perf_counter()
    p.begin_transaction()
    if anchored:
        p.produce(topic, b"", partition=0)
        p.flush(30)
    registered = time.perf_counter()
    for _ in range(3):
        p.produce(topic, b"x" * 100, partition=0)
    p.flush(30)
    written = time.perf_counter()
    p.commit_transaction(30)
    committed = time.perf_counter()
    return (
        (registered - began) * 1000,
        (written - registered) * 1000,
        (committed - written) * 1000,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args(argv)
    started = harness.ensure_broker()
    try:
        topic = f"{harness.new_prefix('floor')}.records"
        admin = clients.new_admin(harness.BOOTSTRAP)
        future = admin.create_topics(
            [clients.NewTopic(topic, num_partitions=8, replication_factor=1)]
        )
        future[topic].result(30)
        producer = clients.new_transactional_producer(harness.BOOTSTRAP, topic, {"linger.ms": 1})
        producer.init_transactions(30)
        for _ in range(50):  # warm-up: the broker's JIT and the coordinator's caches
            _round(producer, topic, anchored=False)
        rows: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
        for i in range(2 * args.rounds):
            anchored = bool(i % 2)
            rows[anchored].append(_round(producer, topic, anchored))
        print("median ms        register   3 records   commit   total")
        for anchored, label in ((False, "plain"), (True, "anchored")):
            phases = [statistics.median(column) for column in zip(*rows[anchored], strict=True)]
            total = statistics.median(sum(r) for r in rows[anchored])
            print(
                f"{label:<12} {phases[0]:>12.2f} {phases[1]:>11.2f} {phases[2]:>8.2f} {total:>7.2f}"
            )
    finally:
        if started:
            harness.stop_broker()


if __name__ == "__main__":
    main()
