"""``TokenIndex``: the hook-token claims a partition store keeps for the token digests of its
partition's keyspace (the partition of ``partition_for(digest)``), and what older releases left.

``c<token digest>``  ``<run_id>\\0<hook_id>``: the active claim of the digest, the one hook that
                     may be resumed by the token alone. The first claim wins; it is dropped when
                     its hook is resumed or disposed or its run ends (``ReleaseHookToken``).
``n<token digest>\\0<run_id>``  ``<hook_id>``: a claim of that run lost to the active one and
                     waits: when the claim is released, the run is woken (``RetryRun``) to
                     claim again at once, instead of at its next backed-off retry.
``t<token digest>``  ``<run_id>\\0<hook_id>``: the hook that held the digest last (its claim was
                     released), or that an earlier release registered for it last (restored
                     from its ``hook-token`` records, which were never released). Only where a
                     token-only resume goes when no claim is active; it blocks no claim.

A processor's partition store is opened with ``local_token_claims=False``: its ``hook_created``
events are not checked against the tokens of its own runs (store rule 5), because the claims
keep that rule cluster-wide, for the runs of this partition as for any other.

Entries are staged with the open transaction like every other write of the store (the overlay
``_staged_tokens``: key → owner, ``None`` for a deleted entry) and derived from the events topic
(``hook-claim`` and ``hook-release`` records), so a restore rebuilds them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from flowstream.model.events import FlowEvent, HookCreated
from flowstream.replay.state import RunState
from flowstream.stores.base import IndexChanges

__all__ = ["Owner", "TokenIndex"]

#: (run id, hook id).
Owner = tuple[str, str]

_CLAIM = b"c"
_LAST = b"t"
_WAITER = b"n"


class TokenIndex:
    """Hook-token claims of a ``PartitionStore`` (a mixin over its RocksDB and staged batch)."""

    _db: Any
    _staged_tokens: dict[bytes, Owner | None]
    _local_token_claims: bool
    _states: dict[str, RunState]

    if TYPE_CHECKING:  # ``RocksDBEventStore._scan``, which must not be shadowed at run time

        def _scan(
            self, prefix: bytes, end: bytes | None = None
        ) -> Iterator[tuple[bytes, bytes]]: ...

    def _stage(self) -> Any:
        raise NotImplementedError

    def _check_hook_claims(
        self, run_id: str, events: Sequence[FlowEvent], changes: IndexChanges
    ) -> None:
        if self._local_token_claims:
            super()._check_hook_claims(run_id, events, changes)  # type: ignore[misc]
            return
        for event in events:
            if type(event) is HookCreated:
                changes.claimed_hooks.append((event.token_digest, run_id, event.hook_id))

    def cached_state(self, run_id: str) -> RunState | None:
        """The projection of ``run_id`` this store holds in memory, if any (no read)."""
        return self._states.get(run_id)

    def _token_entry(self, key: bytes) -> Owner | None:
        if key in self._staged_tokens:
            return self._staged_tokens[key]
        raw = self._db.get(key)
        if raw is None:
            return None
        run_id, hook_id = bytes(raw).decode().split("\0", 1)
        return run_id, hook_id

    def _put_token(self, key: bytes, owner: Owner | None) -> None:
        if owner is None:
            self._stage().delete(key)
        else:
            self._stage().put(key, f"{owner[0]}\0{owner[1]}".encode())
        self._staged_tokens[key] = owner

    def index_hook_token(self, digest: str, run_id: str, hook_id: str) -> None:
        """Restore an earlier release's ``hook-token`` record (a routing fallback only)."""
        self._put_token(_LAST + digest.encode(), (run_id, hook_id))

    def hook_token_claim(self, digest: str) -> Owner | None:
        """The hook whose claim of ``digest`` is active, if any."""
        return self._token_entry(_CLAIM + digest.encode())

    def claim_hook_token(self, digest: str, run_id: str, hook_id: str) -> None:
        """Record (run, hook) as the active claim of ``digest`` (the caller checked it is free)."""
        self._put_token(_CLAIM + digest.encode(), (run_id, hook_id))

    def release_hook_token(self, digest: str, run_id: str, hook_id: str) -> bool:
        """Drop the claim of ``digest`` if (run, hook) holds it (False otherwise). The hook stays
        where a late resume by the token goes, until another claims it: its run answers a
        redelivery as the embedded engine does (identical: a no-op; other content: a conflict)."""
        key = _CLAIM + digest.encode()
        if self._token_entry(key) != (run_id, hook_id):
            return False
        self._put_token(key, None)
        self._put_token(_LAST + digest.encode(), (run_id, hook_id))
        return True

    def hook_token_owner(self, digest: str) -> Owner | None:
        """Where a token-only resume of ``digest`` goes: the active claim, else the hook that
        held it last."""
        claim = self.hook_token_claim(digest)
        return claim if claim is not None else self._token_entry(_LAST + digest.encode())

    def add_token_waiter(self, digest: str, run_id: str, hook_id: str) -> None:
        """Remember that (run, hook) lost its claim of ``digest`` and waits for it."""
        self._put_token(_WAITER + digest.encode() + b"\0" + run_id.encode(), (run_id, hook_id))

    def take_token_waiters(self, digest: str) -> list[str]:
        """The runs waiting for ``digest`` (by run id), forgotten as they are returned."""
        prefix = _WAITER + digest.encode() + b"\0"
        keys = {bytes(key) for key, _ in self._scan(prefix)}
        keys.update(key for key in self._staged_tokens if key.startswith(prefix))
        runs = []
        for key in sorted(keys):
            owner = self._token_entry(key)
            if owner is not None:
                runs.append(owner[0])
                self._put_token(key, None)
        return runs
