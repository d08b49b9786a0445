"""partition_for is Java's murmur2 partitioner (the broker-backed check is in tests/kafka)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowstream.partitioning import murmur2, partition_for

# Expected values from Kafka's own UtilsTest.testMurmur2 (Java ints).
JAVA_MURMUR2 = {
    "21": -973932308,
    "foobar": -790332482,
    "a-little-bit-long-string": -985981536,
    "a-little-bit-longer-string": -1486304829,
    "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    "abc": 479470107,
}


@pytest.mark.parametrize(("key", "expected"), sorted(JAVA_MURMUR2.items()))
def test_murmur2_matches_java(key: str, expected: int) -> None:
    assert murmur2(key.encode()) == expected & 0xFFFFFFFF


def test_partition_for_is_to_positive_modulo() -> None:
    for key, hashed in JAVA_MURMUR2.items():
        assert partition_for(key, 8) == (hashed & 0x7FFFFFFF) % 8


def test_one_partition_and_invalid_counts() -> None:
    assert partition_for("any-run", 1) == 0
    with pytest.raises(ValueError, match="at least 1"):
        partition_for("any-run", 0)


@given(st.text(min_size=1, max_size=80), st.integers(min_value=1, max_value=512))
def test_partition_in_range_and_stable(run_id: str, partitions: int) -> None:
    partition = partition_for(run_id, partitions)
    assert 0 <= partition < partitions
    assert partition == partition_for(run_id, partitions)
