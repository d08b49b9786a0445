"""The event-store contract, and the shared machinery the local stores build on.

Rules every store keeps (the conformance suite in ``tests/stores`` proves each one):

1. ``append_if_sequence(run_id, expected_sequence, events)`` appends only when the run's last
   sequence equals ``expected_sequence`` (0 for a new run); otherwise it raises
   ``EventConflictError`` and writes nothing.
2. Appended events get contiguous sequences from ``expected_sequence + 1``, one commit timestamp
   and fresh event ids; the whole batch becomes visible atomically, or none of it.
3. Every batch is validated by the run's state machine (``RunState.apply``) before it is written:
   an illegal transition raises ``InvalidTransitionError`` and writes nothing.
4. An event whose JSON encoding exceeds ``MAX_EVENT_BYTES`` raises ``PayloadTooLargeError`` and
   writes nothing.
5. A ``hook_created`` whose token digest belongs to an active hook of another run or hook raises
   ``HookTokenConflictError`` (naming the owner, never the token) and writes nothing.
6. ``read(run_id)`` returns the complete history in sequence order (``RunNotFoundError`` when
   there is none); ``state(run_id)`` returns its validated projection.
7. Due timers and delayed retries are kept in an index by due time, updated in the same atomic
   write as the events, so ``due_wakeups(now)`` never scans histories.
8. ``open_runs(after, limit)`` lists the runs that are not terminal, by run id, from an index
   updated in the same atomic write as the events (a run joins it with its first event and
   leaves it with its terminal one), so the liveness scan never reads finished histories.
9. After ``await wait_durable()`` returns, every append made before the call survives a crash or a
   power loss (appends are atomic and ordered, so a lost tail is a prefix cut, never a hole).
10. A store that keeps the run index (``run_index()``: a ``RunTable``) writes each append's row,
    secondary keys and counters in the same atomic write as its events (a store that groups
    appends into one write writes them once per run, from its newest state); a store that keeps
    none answers ``run_index()`` with an index built from every run's state at the call.
"""

from __future__ import annotations

import logging
import os
import random
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime

from flowstream.errors import (
    EventConflictError,
    FlowError,
    HookTokenConflictError,
    InvalidTransitionError,
    PayloadTooLargeError,
    RunNotFoundError,
)
from flowstream.index.table import Change, MemoryKeyValues, RunTable, write_changes
from flowstream.model.base import validate_run_id
from flowstream.model.events import EventEnvelope, FlowEvent, HookCreated
from flowstream.model.snapshot import HookStatus
from flowstream.replay.state import RunState, Wakeup

__all__ = [
    "MAX_EVENT_BYTES",
    "AppendResult",
    "EventStore",
    "IndexChanges",
    "build_run_table",
    "new_event_id",
    "utc_now",
]

LOG = logging.getLogger("flowstream.store")

#: Largest accepted event, as encoded JSON.
MAX_EVENT_BYTES = 1024 * 1024

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


# Event ids only need to be unique, not secret: 128 bits from a generator seeded by the OS
# (reseeded in a forked child) cost a fraction of ``uuid4``'s system call per event.
_ids = random.Random(os.urandom(32))
os.register_at_fork(after_in_child=lambda: _ids.seed(os.urandom(32)))


def new_event_id() -> str:
    """A fresh event id: 32 hex digits, 128 random bits."""
    return f"{_ids.getrandbits(128):032x}"


class IndexChanges:
    """Index updates that ride in the same atomic write as an append."""

    __slots__ = (
        "added_wakeups",
        "claimed_hooks",
        "removed_wakeups",
        "run_index",
        "run_open",
        "status",
    )

    def __init__(self) -> None:
        self.added_wakeups: list[Wakeup] = []
        self.removed_wakeups: list[Wakeup] = []
        self.claimed_hooks: list[tuple[str, str, str]] = []  # (digest, run_id, hook_id)
        #: The run joins the open-runs index (True), leaves it (False), or stays (None).
        self.run_open: bool | None = None
        #: The run index's key changes (``RunTable.change``), for a store that keeps it.
        self.run_index: list[Change] = []
        #: The run's public status before the append (``None``: a new run) and after it, when
        #: the append changed it, for a store that ``counts_statuses`` (a partition store).
        self.status: tuple[str | None, str] | None = None


AppendResult = list[EventEnvelope]


class EventStore(ABC):
    """Append-only per-run histories with optimistic concurrency (see the module rules)."""

    #: Whether appends report the run's public status before and after (``IndexChanges.status``)
    #: for a store that counts its runs by status.
    counts_statuses = False

    def __init__(self, *, clock: Clock = utc_now) -> None:
        self._clock = clock
        self._lock = threading.RLock()
        self._states: dict[str, RunState] = {}
        self._listeners: list[Callable[[list[EventEnvelope]], None]] = []
        #: The run index this store keeps in its appends' writes (rule 10), if any.
        self._run_table: RunTable | None = None

    def add_listener(self, listener: Callable[[list[EventEnvelope]], None]) -> None:
        """Call ``listener`` with every batch of envelopes right after it commits."""
        self._listeners.append(listener)

    # -- the contract ----------------------------------------------------------------------

    def append_if_sequence(
        self, run_id: str, expected_sequence: int, events: Sequence[FlowEvent]
    ) -> AppendResult:
        """Append ``events`` after ``expected_sequence`` or raise (rules 1–5)."""
        with self._lock:
            state = self._state_or_none(run_id)
            actual = 0 if state is None else state.last_sequence
            if actual != expected_sequence:
                raise EventConflictError(run_id, expected_sequence, actual)
            if not events:
                return []
            if state is None:
                validate_run_id(run_id)
            now = self._clock()
            envelopes = [
                EventEnvelope(
                    run_id=run_id,
                    sequence=expected_sequence + offset,
                    event_id=new_event_id(),
                    timestamp=now,
                    event=event,
                )
                for offset, event in enumerate(events, start=1)
            ]
            encoded = [self._encode(envelope) for envelope in envelopes]
            changes = IndexChanges()
            self._check_hook_claims(run_id, events, changes)
            before = [] if state is None else state.wakeups()
            table = self._run_table
            facts = None if table is None else table.held_facts(run_id, state)
            counts = self.counts_statuses
            was = None if state is None or not counts else state.public_status()
            try:
                if state is None:
                    state = RunState.first(envelopes[0])
                    rest: Iterable[EventEnvelope] = envelopes[1:]
                else:
                    rest = envelopes
                for envelope in rest:
                    state.apply(envelope)
            except InvalidTransitionError:
                self._forget_failed(run_id, state, expected_sequence)
                raise
            after = state.wakeups()
            if state.is_terminal:
                changes.run_open = False
            elif expected_sequence == 0:
                changes.run_open = True
            changes.removed_wakeups = [w for w in before if w not in after]
            changes.added_wakeups = [w for w in after if w not in before]
            if table is not None:
                if self._groups_index:
                    table.stage(run_id, facts, state)
                else:
                    changes.run_index = table.change(facts, state)
            if counts:
                status = state.public_status()
                if status is not was:
                    changes.status = (None if was is None else was.value, status.value)
            try:
                self._persist(run_id, envelopes, encoded, changes)
            except BaseException:
                self._forget_failed(run_id, state, expected_sequence)
                if table is not None and not self._groups_index:
                    table.reload()
                raise
            self._remember(run_id, state)
            self._notify(envelopes)
            return envelopes

    def read(self, run_id: str) -> list[EventEnvelope]:
        """The complete history of ``run_id`` in sequence order."""
        return list(self.state(run_id).history)

    def state(self, run_id: str) -> RunState:
        """The validated projection of ``run_id`` (cached; advanced by each append)."""
        with self._lock:
            state = self._state_or_none(run_id)
            if state is None:
                raise RunNotFoundError(run_id)
            return state

    def exists(self, run_id: str) -> bool:
        with self._lock:
            return self._state_or_none(run_id) is not None

    def find_hook(self, token_digest: str) -> tuple[str, str] | None:
        """The (run id, hook id) that last claimed a token digest, if any."""
        with self._lock:
            return self._hook_owner(token_digest)

    def run_index(self) -> RunTable:
        """The run index (rule 10): the one this store keeps, else one built now from every
        run's state (which costs a read of every history)."""
        if self._run_table is not None:
            return self._run_table
        return build_run_table(self, MemoryKeyValues())

    @abstractmethod
    def list_runs(self) -> list[str]:
        """Every run id in the store, sorted."""

    @abstractmethod
    def open_runs(self, after: str | None, limit: int) -> list[str]:
        """Up to ``limit`` runs that are not terminal, by run id, after ``after`` (rule 8)."""

    @abstractmethod
    def due_wakeups(self, now: datetime) -> list[Wakeup]:
        """Timers and delayed retries due at or before ``now``, by due time."""

    @abstractmethod
    def next_wakeup(self) -> Wakeup | None:
        """The earliest scheduled timer or delayed retry."""

    def close(self) -> None:
        """Release resources; the default does nothing."""

    async def wait_durable(self) -> None:
        """Return once every append made so far survives a power loss.

        Hosts call it before a step handler runs and before they report a run's state, so a
        store may commit appends to disk in groups. The default stores are durable at once.
        """

    # -- what a backend provides -----------------------------------------------------------

    @abstractmethod
    def _load(self, run_id: str) -> list[EventEnvelope] | None:
        """The persisted history, or ``None`` when the run does not exist."""

    @abstractmethod
    def _persist(
        self,
        run_id: str,
        envelopes: list[EventEnvelope],
        encoded: list[bytes],
        changes: IndexChanges,
    ) -> None:
        """Write the envelopes and index changes atomically."""

    @abstractmethod
    def _hook_owner(self, token_digest: str) -> tuple[str, str] | None: ...

    # -- shared helpers --------------------------------------------------------------------

    @property
    def _groups_index(self) -> bool:
        """Whether the run index's changes wait in the table (``RunTable.stage``) for the
        store's next write (which takes them), or join each append's own write."""
        return False

    def _forget_failed(self, run_id: str, state: RunState | None, kept: int) -> None:
        """An append to ``run_id`` failed, perhaps after it advanced ``state``: the cached
        projection goes (it is read again), and a run the index has staged gets back the
        state of the ``kept`` events the store holds."""
        self._states.pop(run_id, None)
        table = self._run_table
        if table is not None and table.staged(run_id):
            held = None if state is None or kept == 0 else state.history[:kept]
            table.restage(run_id, None if held is None else RunState.from_history(held))

    def _state_or_none(self, run_id: str) -> RunState | None:
        state = self._states.get(run_id)
        if state is not None:
            return state
        history = self._load(run_id)
        if history is None:
            return None
        state = RunState.from_history(history)
        self._remember(run_id, state)
        return state

    def _remember(self, run_id: str, state: RunState) -> None:
        self._states[run_id] = state

    def _notify(self, envelopes: list[EventEnvelope]) -> None:
        """Hand a committed batch to every listener; a failing listener is logged, not raised."""
        for listener in self._listeners:
            try:
                listener(envelopes)
            except Exception:  # the events are committed; a listener cannot undo that
                LOG.exception("a store listener failed on run %s", envelopes[0].run_id)

    def _encode(self, envelope: EventEnvelope) -> bytes:
        data = envelope.model_dump_json().encode()
        if len(data) > MAX_EVENT_BYTES:
            raise PayloadTooLargeError(envelope.run_id, len(data), MAX_EVENT_BYTES)
        return data

    def _states_for_index(self) -> Iterable[RunState]:
        """Every run's state, read without caching it; a run whose history does not validate
        is left out (it reports its error when read)."""
        for run_id in self.list_runs():
            try:
                history = self._load(run_id)
                if history is not None:
                    yield RunState.from_history(history)
            except FlowError as exc:
                LOG.warning("run %s is left out of the run index: %s", run_id, exc)

    def _check_hook_claims(
        self, run_id: str, events: Sequence[FlowEvent], changes: IndexChanges
    ) -> None:
        for event in events:
            if not isinstance(event, HookCreated):
                continue
            owner = self._hook_owner(event.token_digest)
            if owner is not None and owner != (run_id, event.hook_id):
                owner_run, owner_hook = owner
                owner_state = self._state_or_none(owner_run)
                hook = None if owner_state is None else owner_state.hooks.get(owner_hook)
                if (
                    owner_state is not None
                    and not owner_state.is_terminal
                    and hook is not None
                    and hook.status is HookStatus.ACTIVE
                ):
                    raise HookTokenConflictError(run_id, owner_run, owner_hook)
            changes.claimed_hooks.append((event.token_digest, run_id, event.hook_id))


def build_run_table(store: EventStore, kv: MemoryKeyValues) -> RunTable:
    """A run index in ``kv`` built from every run of ``store``."""

    table = RunTable(kv)
    table.build(store._states_for_index(), lambda changes: write_changes(kv, changes))
    return table
