"""A RocksDB store opened again runs with this process's options, not its OPTIONS file's.

rocksdict opened an existing store's default column family with the options the store recorded,
so a reopened store had an 8 MiB block cache of its own and no bloom filter: at a million runs
each point lookup read a whole-file index block again (milliseconds each).
"""

from __future__ import annotations

from pathlib import Path

from flowstream.stores.partition import PartitionStore
from flowstream.stores.rocksdb import BLOCK_CACHE_BYTES, RocksDBEventStore


def _capacity(store: RocksDBEventStore) -> int:
    return int(store._db.property_value("rocksdb.block-cache-capacity"))


def test_a_reopened_store_uses_the_shared_cache(tmp_path: Path) -> None:
    RocksDBEventStore(tmp_path / "store").close()
    for read_only in (False, True):
        with RocksDBEventStore(tmp_path / "store", read_only=read_only) as store:
            assert _capacity(store) == BLOCK_CACHE_BYTES
    first = PartitionStore(0, tmp_path / "p0", lambda *_: None)
    first.close()
    again = PartitionStore(0, tmp_path / "p0", lambda *_: None)
    try:
        assert _capacity(again) == BLOCK_CACHE_BYTES
    finally:
        again.close()
