"""A move forwards the commands the old processors had not applied: the later of the group's
positions and those the old events partitions recorded last (``positions`` records or headers,
committed with the commands' effects; the group's offsets follow outside the transactions and
lag when a processor dies). Against the real broker: the last record of each partition is found
reading backwards, past other records and an aborted transaction."""

from __future__ import annotations

import uuid

import pytest

from flowstream import wire
from flowstream.kafka import clients, topics
from flowstream.repartition.plan import recorded_positions
from flowstream.topology import load_topology

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]


def test_the_last_positions_record_of_each_partition_is_found(kafka_bootstrap: str) -> None:
    prefix = f"t-move-recorded-{uuid.uuid4().hex[:8]}"
    topics.apply(kafka_bootstrap, load_topology(), prefix=prefix, replication_factor=1)
    events, start = f"{prefix}.events", f"{prefix}.cmd.start"
    producer = clients.new_transactional_producer(kafka_bootstrap, f"{prefix}-writer")
    producer.init_transactions(30)

    def transaction(records: list[tuple[int, bytes, object]], *, commit: bool = True) -> None:
        producer.begin_transaction()
        for partition, value, headers in records:
            producer.produce(events, value=value, key=b"r", partition=partition, headers=headers)
        producer.flush(30)
        (producer.commit_transaction if commit else producer.abort_transaction)(30)

    def positions(offset: int) -> tuple[int, bytes, object]:
        return (0, wire.positions_value("w/1", {start: offset}), wire.POSITIONS_HEADERS)

    other = (b"parked", [(wire.RECORD_HEADER, wire.RecordKind.INBOX.value.encode())])
    transaction(
        [positions(5), (1, wire.positions_value("w/1", {start: 2}), wire.POSITIONS_HEADERS)]
    )
    transaction([positions(9)])
    transaction([(0, *other)] * 7)  # more than a window after it
    transaction([positions(40)], commit=False)  # aborted: not what was applied
    transaction([(2, *other)] * 3)  # a partition that recorded nothing
    # Positions that ride on a record the transaction wrote anyway, as its header: later than
    # partition 1's record, and partition 3's only ones, followed by a record without.
    value, headers = other
    carried = [*headers, (wire.POSITIONS_HEADER, wire.positions_value("w/1", {start: 6}))]
    transaction([(1, value, carried), (3, value, carried), (3, *other)])

    found = recorded_positions(kafka_bootstrap, events, 8, window=3)
    assert found == {(start, 0): 9, (start, 1): 6, (start, 3): 6}
