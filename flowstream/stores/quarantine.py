"""``Quarantine``: a partition store's own metadata, and the runs it must never advance (a
record of their history cannot be read)."""

from __future__ import annotations

from typing import Any

from flowstream.replay.state import RunState

__all__ = ["Quarantine"]


class Quarantine:
    """The store's own metadata, and the runs it must never advance."""

    _db: Any
    _write_options: Any
    _quarantined: dict[str, str]
    _restored: dict[str, Any]
    _restaged: set[str]
    _states: dict[str, RunState]

    def _stage(self) -> Any:
        raise NotImplementedError

    def meta(self, name: str) -> bytes | None:
        """A value of the store's own metadata (``m/<name>``)."""
        raw = self._db.get(b"m/" + name.encode())
        return None if raw is None else bytes(raw)

    def set_meta(self, name: str, value: bytes) -> None:
        self._db.put(b"m/" + name.encode(), value, self._write_options)

    def quarantine(self, run_id: str, reason: str) -> None:
        """Never advance ``run_id`` again: a record of its history cannot be read. Its later
        records are skipped by the restore; the reason stays in RocksDB."""
        key = run_id.encode()
        batch = self._stage()
        batch.put(b"q" + key, reason.encode())
        batch.delete(b"x" + key)
        batch.delete(b"u" + key)
        self._quarantined[run_id] = reason
        self._restored.pop(run_id, None)
        self._restaged.discard(run_id)
        self._states.pop(run_id, None)

    def quarantined(self, run_id: str) -> str | None:
        """Why ``run_id`` is quarantined, or ``None``."""
        return self._quarantined.get(run_id)

    @property
    def quarantined_count(self) -> int:
        return len(self._quarantined)
