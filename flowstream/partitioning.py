"""The one partitioning function: run id -> partition number, identical to Kafka's Java client.

Every producer in flowstream passes ``partition=partition_for(run_id, n)`` explicitly, so the
mapping never depends on a client library's default partitioner. The function reproduces the
Java producer's ``BuiltInPartitioner.partitionForKey``::

    toPositive(murmur2(key.getBytes(UTF_8))) % numPartitions

with ``murmur2`` from ``org.apache.kafka.common.utils.Utils`` (MurmurHash2, seed ``0x9747b28c``)
and ``toPositive(x) = x & 0x7fffffff``. librdkafka's ``murmur2_random`` partitioner computes the
same value for non-empty keys, which is why :mod:`flowstream.kafka.clients` configures it on
every producer: a record sent without an explicit partition still lands where this function says.

The mapping changes if the partition count changes, so the count of run-keyed topics never
changes in place (see ``topology/topics.toml``): a deployment moves to another count under a new
prefix (:mod:`flowstream.repartition`).
"""

from __future__ import annotations

__all__ = ["murmur2", "partition_for"]

_MASK32 = 0xFFFFFFFF
_SEED = 0x9747B28C
_M = 0x5BD1E995
_R = 24


def murmur2(data: bytes) -> int:
    """Kafka's 32-bit MurmurHash2 of ``data``, as an unsigned int (Java's int bits)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK32
    body = length - length % 4
    for i in range(0, body, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK32
        k ^= k >> _R
        k = (k * _M) & _MASK32
        h = (h * _M) & _MASK32
        h ^= k
    tail = length - body
    if tail == 3:
        h ^= data[body + 2] << 16
    if tail >= 2:
        h ^= data[body + 1] << 8
    if tail >= 1:
        h ^= data[body]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h


def partition_for(run_id: str, partitions: int) -> int:
    """The partition of ``run_id`` among ``partitions``, as Kafka's Java producer would pick it."""
    if partitions < 1:
        raise ValueError(f"partitions must be at least 1, got {partitions}")
    return (murmur2(run_id.encode("utf-8")) & 0x7FFFFFFF) % partitions
