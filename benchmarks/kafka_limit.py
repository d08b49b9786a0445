"""The physical limit of this machine for flowstream's Kafka pattern: consume, produce, commit.

A plain confluent-kafka loop (clients built by ``flowstream.kafka.clients``, so the same
``acks=all``, idempotence and ``read_committed`` settings as the processor) that consumes one
message and produces one record per message, inside a transaction that carries the consumer
offsets (``send_offsets_to_transaction``), batched as the processor batches: commit when
``commit_interval_ms`` (20 ms) elapsed since the transaction began or 500 messages were applied.
No decoding, no state, no workflow code: whatever flowstream achieves is a fraction of this.

It pre-fills ``<prefix>.in`` (8 partitions, like the run topics) with ``--messages`` records of
``--size`` bytes (112: the mean encoded event of the order workload), then times the loop from its
first consumed message until every output is committed. Prints records/s and, with
``--flowstream-events-per-s``, flowstream's events/s as a ratio of it.

Usage: ``python -m benchmarks.kafka_limit [--messages 50000] [--size 112]``
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from benchmarks import harness
from flowstream.kafka import clients

PARTITIONS = 8


def make_topics(admin: Any, names: list[str]) -> None:
    futures = admin.create_topics(
        [clients.NewTopic(n, num_partitions=PARTITIONS, replication_factor=1) for n in names]
    )
    for future in futures.values():
        future.result(30)


def prefill(topic: str, messages: int, size: int) -> None:
    producer = clients.new_producer(harness.BOOTSTRAP, {"linger.ms": 20})
    payload = os.urandom(size // 2).hex().encode()[:size]
    for i in range(messages):
        while True:
            try:
                producer.produce(
                    topic, value=payload, key=f"run-{i}".encode(), partition=i % PARTITIONS
                )
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    if producer.flush(60):
        raise SystemExit("prefill: not every record was acknowledged")


def loop(prefix: str, messages: int, interval_ms: int, max_batch: int) -> dict[str, Any]:
    """Consume → produce → commit with offsets until ``messages`` were processed."""
    source, sink = f"{prefix}.in", f"{prefix}.out"
    producer = clients.new_transactional_producer(
        harness.BOOTSTRAP, f"{prefix}-limit", {"linger.ms": 1}
    )
    producer.init_transactions(30)
    consumer = clients.new_consumer(harness.BOOTSTRAP, f"{prefix}-limit-group")
    consumer.assign([clients.TopicPartition(source, p, 0) for p in range(PARTITIONS)])
    positions: dict[int, int] = {}
    done = commits = in_txn = 0
    began = txn_began = None
    commit_time = 0.0
    while done < messages:
        batch = consumer.consume(num_messages=500, timeout=0.0 if in_txn else 0.05)
        for message in batch:
            if message.error() is not None:
                continue
            if began is None:
                began = time.perf_counter()
            if not in_txn:
                producer.begin_transaction()
                txn_began = time.monotonic()
            producer.produce(
                sink, value=message.value(), key=message.key(), partition=message.partition()
            )
            positions[message.partition()] = message.offset() + 1
            in_txn += 1
            done += 1
        producer.poll(0)
        assert txn_began is not None or not in_txn
        if in_txn and (
            time.monotonic() - txn_began >= interval_ms / 1000  # type: ignore[operator]
            or in_txn >= max_batch
            or done >= messages
        ):
            started = time.perf_counter()
            offsets = [clients.TopicPartition(source, p, o) for p, o in positions.items()]
            producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), 30)
            producer.commit_transaction(30)
            commit_time += time.perf_counter() - started
            commits += 1
            in_txn = 0
    assert began is not None
    wall = time.perf_counter() - began
    consumer.close()
    return {
        "messages": messages,
        "wall_s": round(wall, 3),
        "records_per_s": round(messages / wall, 1),
        "transactions": commits,
        "mean_commit_ms": round(commit_time / max(commits, 1) * 1000, 2),
        "commit_share": round(commit_time / wall, 3),
    }


def run(
    messages: int,
    size: int,
    interval_ms: int,
    max_batch: int,
    flowstream_events_per_s: float | None = None,
    out: str | None = None,
) -> dict[str, Any]:
    started_broker = harness.ensure_broker()
    try:
        prefix = harness.new_prefix("limit")
        admin = clients.new_admin(harness.BOOTSTRAP)
        make_topics(admin, [f"{prefix}.in", f"{prefix}.out"])
        prefill(f"{prefix}.in", messages, size)
        context = harness.machine()
        result = loop(prefix, messages, interval_ms, max_batch)
        admin.delete_topics([f"{prefix}.in", f"{prefix}.out"])
    finally:
        if started_broker:
            harness.stop_broker()
    record: dict[str, Any] = {
        "figure": "kafka_limit",
        "size": size,
        "commit_interval_ms": interval_ms,
        "max_batch": max_batch,
        **result,
        **context,
    }
    print(
        f"plain consume→produce→commit loop: {result['records_per_s']:.0f} records/s "
        f"({messages} × {size} B, {result['transactions']} transactions, "
        f"mean commit {result['mean_commit_ms']} ms, {result['commit_share']:.0%} of the wall "
        f"time in commits)"
    )
    if flowstream_events_per_s:
        ratio = flowstream_events_per_s / result["records_per_s"]
        record["flowstream_events_per_s"] = flowstream_events_per_s
        record["flowstream_ratio"] = round(ratio, 4)
        print(f"flowstream: {flowstream_events_per_s:.0f} events/s = {ratio:.1%} of the loop")
    harness.emit(record, out)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--size", type=int, default=112, help="bytes per record (a mean event)")
    parser.add_argument("--commit-interval-ms", type=int, default=20)
    parser.add_argument("--max-batch", type=int, default=500)
    parser.add_argument("--flowstream-events-per-s", type=float)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    run(
        args.messages,
        args.size,
        args.commit_interval_ms,
        args.max_batch,
        args.flowstream_events_per_s,
        args.out,
    )


if __name__ == "__main__":
    main()
