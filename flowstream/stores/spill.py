"""``HistorySpill``: records parked on local disk under their run, read back one run at a time in
run id order (how ``flowstream audit`` reads an events topic without holding it in memory).

Keys are ``<run_id>\\0<arrival:8 BE>``: a run's records come back in the order they were added,
every one of them (a duplicate is kept, as read), and the runs in the order of their ids as
Python sorts them (UTF-8 bytes sort as code points; no run id holds a NUL). The spill is a
scratch RocksDB without a write-ahead log, deleted by ``close``.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from rocksdict import Rdict, WriteBatch, WriteOptions

from flowstream.stores.rocksdb import store_options

__all__ = ["HistorySpill"]

#: Records gathered before they are written in one batch.
_BATCH = 5_000


class HistorySpill:
    """Records by run, on disk under ``directory`` (a new temporary directory by default)."""

    def __init__(self, directory: str | Path | None = None) -> None:
        self._root = Path(tempfile.mkdtemp(prefix="flowstream-spill-", dir=directory))
        self._db = Rdict(str(self._root / "spill"), options=store_options(create=True))
        self._write_options = WriteOptions()
        # A property at run time, whatever the stub says.
        setattr(self._write_options, "disable_wal", True)  # noqa: B010
        self._batch = WriteBatch(raw_mode=True)
        self._held = 0
        self._added = 0

    def __len__(self) -> int:
        """How many records were added."""
        return self._added

    def add(self, run_id: str, value: bytes) -> None:
        self._batch.put(run_id.encode() + b"\0" + self._added.to_bytes(8, "big"), value)
        self._added += 1
        self._held += 1
        if self._held >= _BATCH:
            self._flush()

    def _flush(self) -> None:
        if self._held:
            self._db.write(self._batch, self._write_options)
            self._batch = WriteBatch(raw_mode=True)
            self._held = 0

    def runs(self) -> Iterator[tuple[str, list[bytes]]]:
        """Each run with its records, by run id."""
        self._flush()
        run_key: bytes | None = None
        values: list[bytes] = []
        for raw_key, value in self._db.items():
            key = bytes(raw_key)  # type: ignore[arg-type]  # raw mode yields bytes
            this = key[:-9]
            if this != run_key:
                if run_key is not None:
                    yield run_key.decode(), values
                run_key, values = this, []
            values.append(bytes(value))
        if run_key is not None:
            yield run_key.decode(), values

    def close(self) -> None:
        self._db.close()
        shutil.rmtree(self._root, ignore_errors=True)

    def __enter__(self) -> HistorySpill:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
