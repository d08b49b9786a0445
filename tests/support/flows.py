"""One scenario, two modes: the ``flows`` fixture and the drivers behind it (issue 17).

A scenario test asks ``flows(runtime, **engine_options)`` for a driver and speaks one
vocabulary to it: ``start``, ``signal``, ``resume_hook``, ``resume_hook_by_token``,
``dispose_hook``, ``cancel`` (``force=True`` ends the run at once), ``retry`` (an operator's
retry), ``fire_due`` (after moving ``flow.clock``), ``snapshot``, ``history``, ``state``,
``next_wakeup``, ``continuation_chain`` and ``until``. Each command returns the snapshot of the
run that applied it once it is *settled*, as the embedded engine's call returns it.

* ``embedded`` (one id per store kind: memory, rocksdb and the Kafka-backed store): a
  ``FlowEngine`` over a store of the ``tests.support.stores`` kinds, on the test's clock.
* ``kafka``: a real ``Processor`` (``tests.support.processors``) on the broker of
  ``kafka_bootstrap``, shared by the session's tests (one per configuration), driven through
  ``FlowClient``: every command waits for its outcome (a rejection raises the embedded
  engine's error), then the driver reads the run's history from the events topic until the
  run is settled at the processor's clock: ended; or waiting for input, a deadline still
  ahead, or an operator (a failing task whose automatic retries are exhausted), with each
  child it waits for settled too. Run ids are put in a namespace of the test
  (``flow.id("r1")`` is the real id), since the session's runs share topics.

Where the modes differ by design, the test says so with ``flow.mode`` and docs/parity.md says
why. ``until(run_id, predicate)`` is for effects that reach another run later on Kafka (a
forced cancel of a child on another partition): embedded, it checks once.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest

from flowstream.engine import FlowEngine, RuntimeBuilds
from flowstream.errors import FlowError, RunNotFoundError
from flowstream.model.base import JSON
from flowstream.model.events import EventEnvelope
from flowstream.model.messages import CommandOutcome
from flowstream.model.snapshot import RunStatus, WorkflowRunSnapshot
from flowstream.model.spec import WorkflowSpec
from flowstream.replay.liveness import ConditionKind, condition
from flowstream.replay.state import RunState, Wakeup
from flowstream.replay.task_failures import TaskRetryPolicy
from flowstream.stores.base import EventStore
from tests.support import EPOCH, FakeClock, RecordingRuntime, run
from tests.support.processors import ProcessorHost, ProcessorPool
from tests.support.stores import StoreFactory, factory_for

__all__ = ["MODES", "EmbeddedFlow", "Flow", "Flows", "KafkaFlow", "flows", "processor_pool"]

#: How long a Kafka-mode run may take to settle after a command.
SETTLE_S = 30.0

MODES = [
    pytest.param(("embedded", "memory"), id="embedded-memory"),
    pytest.param(("embedded", "rocksdb"), id="embedded-rocksdb"),
    pytest.param(("embedded", "kafka"), id="embedded-kafkastore", marks=pytest.mark.kafka),
]
#: The mode against real processors on the broker runs by default (FLOWSTREAM_PARITY_KAFKA=0
#: leaves it out, for a quick embedded-only pass): docs/parity.md.
if os.environ.get("FLOWSTREAM_PARITY_KAFKA") != "0":
    MODES.append(pytest.param(("kafka", None), id="kafka-processor", marks=pytest.mark.kafka))


class Flow(Protocol):
    """What a scenario test speaks, in either mode."""

    mode: str
    clock: FakeClock
    runtime: RecordingRuntime

    def id(self, name: str) -> str: ...
    def start(self, run_id: str, spec: WorkflowSpec, input: JSON = None) -> WorkflowRunSnapshot: ...
    def signal(
        self, run_id: str, name: str, payload: JSON = None, *, id: str
    ) -> WorkflowRunSnapshot: ...
    def resume_hook(
        self, run_id: str, hook_id: str, payload: JSON = None
    ) -> WorkflowRunSnapshot: ...
    def resume_hook_by_token(self, token: str, payload: JSON = None) -> WorkflowRunSnapshot: ...
    def dispose_hook(self, run_id: str, hook_id: str) -> WorkflowRunSnapshot: ...
    def cancel(
        self, run_id: str, reason: str | None = None, *, force: bool = False
    ) -> WorkflowRunSnapshot: ...
    def retry(self, run_id: str) -> WorkflowRunSnapshot: ...
    def fire_due(self) -> None: ...
    def snapshot(self, run_id: str) -> WorkflowRunSnapshot: ...
    def history(self, run_id: str) -> list[EventEnvelope]: ...
    def history_now(self, run_id: str) -> list[EventEnvelope]: ...
    def state(self, run_id: str) -> RunState: ...
    def exists(self, run_id: str) -> bool: ...
    def next_wakeup(self) -> Wakeup | None: ...
    def continuation_chain(self, run_id: str) -> list[str]: ...
    def until(
        self, run_id: str, predicate: Callable[[WorkflowRunSnapshot], bool]
    ) -> WorkflowRunSnapshot: ...


class EmbeddedFlow:
    """The scenario vocabulary over a ``FlowEngine`` in this process."""

    mode = "embedded"

    def __init__(
        self, store: EventStore, runtime: RecordingRuntime, clock: FakeClock, **options: Any
    ) -> None:
        self.store = store
        self.runtime = runtime
        self.clock = clock
        self.engine = FlowEngine(store, runtime, clock=clock, **options)

    def id(self, name: str) -> str:
        return name

    def start(self, run_id: str, spec: WorkflowSpec, input: JSON = None) -> WorkflowRunSnapshot:
        return run(self.engine.start(run_id, spec, input))

    def signal(
        self, run_id: str, name: str, payload: JSON = None, *, id: str
    ) -> WorkflowRunSnapshot:
        return run(self.engine.send_signal(run_id, id, name, payload))

    def resume_hook(self, run_id: str, hook_id: str, payload: JSON = None) -> WorkflowRunSnapshot:
        return run(self.engine.resume_hook(run_id, hook_id, payload))

    def resume_hook_by_token(self, token: str, payload: JSON = None) -> WorkflowRunSnapshot:
        return run(self.engine.resume_hook_by_token(token, payload))

    def dispose_hook(self, run_id: str, hook_id: str) -> WorkflowRunSnapshot:
        return run(self.engine.dispose_hook(run_id, hook_id))

    def cancel(
        self, run_id: str, reason: str | None = None, *, force: bool = False
    ) -> WorkflowRunSnapshot:
        if force:
            return run(self.engine.force_cancel(run_id, reason))
        return run(self.engine.request_cancellation(run_id, reason))

    def retry(self, run_id: str) -> WorkflowRunSnapshot:
        return run(self.engine.drive(run_id, retry_task=True))

    def fire_due(self) -> None:
        run(self.engine.resume_due(self.clock()))

    def snapshot(self, run_id: str) -> WorkflowRunSnapshot:
        return self.engine.snapshot(run_id)

    def history(self, run_id: str) -> list[EventEnvelope]:
        return self.store.read(run_id)

    def history_now(self, run_id: str) -> list[EventEnvelope]:
        return self.store.read(run_id)

    def state(self, run_id: str) -> RunState:
        return self.store.state(run_id)

    def exists(self, run_id: str) -> bool:
        return self.store.exists(run_id)

    def next_wakeup(self) -> Wakeup | None:
        return self.engine.next_wakeup()

    def continuation_chain(self, run_id: str) -> list[str]:
        return self.engine.continuation_chain(run_id)

    def until(
        self, run_id: str, predicate: Callable[[WorkflowRunSnapshot], bool]
    ) -> WorkflowRunSnapshot:
        snapshot = self.snapshot(run_id)
        assert predicate(snapshot), snapshot
        return snapshot


class KafkaFlow:
    """The scenario vocabulary over a real processor, through ``FlowClient``."""

    mode = "kafka"

    def __init__(self, host: ProcessorHost, runtime: RecordingRuntime) -> None:
        self.host = host
        self.runtime = runtime
        self.client = host.client
        self.clock = host.clock
        self.clock.set(EPOCH)
        self.namespace = f"k{uuid.uuid4().hex[:9]}"
        host.router.register(self.namespace, runtime)
        #: Real run ids seen (started here, or found as children and successors): passed back
        #: into the driver, they are not put in the namespace again.
        self._known: set[str] = set()
        #: The state each run had when last read.
        self._last: dict[str, RunState] = {}

    def id(self, name: str) -> str:
        """The real id of the test's run ``name``: an id already real (one in the namespace, or
        one seen as a child or a successor) is itself."""
        if name in self._known or (name.startswith(f"{self.namespace}-") and len(name) > 11):
            return name
        return f"{self.namespace}-{name}"

    def _real(self, name: str) -> str:
        real = self.id(name)
        self._known.add(real)
        return real

    # -- commands -------------------------------------------------------------------------

    def _applied(self, outcome: CommandOutcome | None, fallback: str) -> WorkflowRunSnapshot:
        key = outcome.key if outcome is not None and outcome.key else fallback
        self.host.events.history(key, SETTLE_S, barrier=True)  # its effect is read, then on
        return self._settled(key, follow=True).snapshot()

    def start(self, run_id: str, spec: WorkflowSpec, input: JSON = None) -> WorkflowRunSnapshot:
        real = self._real(run_id)
        return self._applied(self.client.start(real, spec, input), real)

    def signal(
        self, run_id: str, name: str, payload: JSON = None, *, id: str
    ) -> WorkflowRunSnapshot:
        real = self._real(run_id)
        return self._applied(self.client.signal(real, name, payload, id=id), real)

    def resume_hook(self, run_id: str, hook_id: str, payload: JSON = None) -> WorkflowRunSnapshot:
        real = self._real(run_id)
        return self._applied(self.client.resume_hook(real, hook_id, payload), real)

    def resume_hook_by_token(self, token: str, payload: JSON = None) -> WorkflowRunSnapshot:
        outcome = self.client.resume_hook_by_token(token, payload)
        assert outcome is not None and outcome.key, outcome
        self._known.add(outcome.key)
        return self._applied(outcome, outcome.key)

    def dispose_hook(self, run_id: str, hook_id: str) -> WorkflowRunSnapshot:
        real = self._real(run_id)
        return self._applied(self.client.dispose_hook(real, hook_id), real)

    def cancel(
        self, run_id: str, reason: str | None = None, *, force: bool = False
    ) -> WorkflowRunSnapshot:
        real = self._real(run_id)
        return self._applied(self.client.cancel(real, reason, force=force), real)

    def retry(self, run_id: str) -> WorkflowRunSnapshot:
        """The processor drives the run after the outcome (its sweep, next iteration): a run
        whose task is failing is settled again once that drive appended its events."""
        real = self._real(run_id)
        before = self._leaf(real)
        outcome = self.client.retry(real)
        if before is not None and before.task_failure is not None and not before.is_terminal:
            deadline = time.monotonic() + SETTLE_S
            leaf = before.run_id
            while (now := self._read(leaf)) is None or now.last_sequence == before.last_sequence:
                assert time.monotonic() < deadline, f"the retry of {leaf} was never driven"
                time.sleep(0.02)
        return self._applied(outcome, real)

    def _leaf(self, run_id: str) -> RunState | None:
        """The last run of ``run_id``'s chain as it is now (not waited for)."""
        state = self._read(run_id)
        while state is not None and state.status is RunStatus.CONTINUED_AS_NEW:
            assert state.outcome is not None and state.outcome.successor_run_id is not None
            state = self._read(state.outcome.successor_run_id)
        return state

    def fire_due(self) -> None:
        """Every run of the test settled at the clock: the processor's timer scan fired what
        came due."""
        for run_id in self._existing():
            self._settled(run_id, follow=False)

    def _existing(self) -> list[str]:
        """The test's runs that exist (a start may have been refused)."""
        return [r for r in sorted(self._known) if self._read(r) is not None]

    def close(self) -> None:
        """End the test's open runs, so the tokens they hold are free for the next test (hook
        tokens are claimed across the whole deployment, and the session's tests share it)."""
        for run_id, last in sorted(self._last.items()):
            if last.is_terminal:
                continue
            try:
                self.client.cancel(run_id, "end of test", force=True)
            except FlowError:
                pass  # ended meanwhile as a child of a run cancelled before, say

    # -- reads ----------------------------------------------------------------------------

    def snapshot(self, run_id: str) -> WorkflowRunSnapshot:
        return self.state(run_id).snapshot()

    def history(self, run_id: str) -> list[EventEnvelope]:
        return list(self.state(run_id).history)

    def history_now(self, run_id: str) -> list[EventEnvelope]:
        """The committed history as it is now, not waiting for the run to settle (for a step
        handler that looks at its own run). Read past every transaction open now, once it
        commits: the processor runs a step once ``commit_transaction`` has returned, and the
        broker writes the commit markers that make those events readable after that."""
        return self.host.events.history(self.id(run_id), timeout=SETTLE_S, barrier=True)

    def state(self, run_id: str) -> RunState:
        return self._settled(self._real(run_id), follow=False, read=True)

    def exists(self, run_id: str) -> bool:
        """Whether the run has a committed event now (not waited for)."""
        return self._read(self.id(run_id)) is not None

    def next_wakeup(self) -> Wakeup | None:
        wakeups = [
            w for run_id in self._existing() for w in self._settled(run_id, follow=False).wakeups()
        ]
        return min(wakeups, key=lambda w: (w.due, w.run_id, w.subject_id), default=None)

    def continuation_chain(self, run_id: str) -> list[str]:
        chain = [self._real(run_id)]
        while True:
            state = self._settled(chain[-1], follow=False)
            if state.status is not RunStatus.CONTINUED_AS_NEW:
                return chain
            assert state.outcome is not None and state.outcome.successor_run_id is not None
            chain.append(state.outcome.successor_run_id)

    def until(
        self, run_id: str, predicate: Callable[[WorkflowRunSnapshot], bool]
    ) -> WorkflowRunSnapshot:
        real = self._real(run_id)
        deadline = time.monotonic() + SETTLE_S
        while True:
            snapshot = self._settled(real, follow=False).snapshot()
            if predicate(snapshot):
                return snapshot
            assert time.monotonic() < deadline, f"run {real} never got there: {snapshot}"
            time.sleep(0.05)

    # -- settling -------------------------------------------------------------------------

    def _read(self, run_id: str) -> RunState | None:
        """The run as the events topic has it now (polled through the host's ``EventCache``)."""
        self.host.check()
        history = self.host.events.history(run_id, timeout=SETTLE_S)
        if not history:
            return None
        self._known.add(run_id)
        state = self._last[run_id] = RunState.from_history(history)
        # The ids a test may take from this state are real ids: its children, its successor
        # and its link. (Learning them only while walking a run that waits for them missed a
        # run that had ended by the time it was first read, on a fast machine.)
        self._known.update(child.run_id for child in state.children.values())
        if state.outcome is not None and state.outcome.successor_run_id is not None:
            self._known.add(state.outcome.successor_run_id)
        if state.parent is not None:
            self._known.add(state.parent.run_id)
        return state

    def _settled(self, run_id: str, *, follow: bool, read: bool = False) -> RunState:
        """``run_id`` (with ``follow``, the last run of its chain) once it is settled; for a
        ``read``, ``RunNotFoundError`` at once if the run does not exist (as embedded)."""
        deadline = time.monotonic() + SETTLE_S
        if read and self._read(run_id) is None:
            raise RunNotFoundError(run_id)
        while True:
            state, why = self._check(run_id, follow, set())
            if why is None:
                assert state is not None
                return state
            if time.monotonic() > deadline:
                raise AssertionError(f"run {run_id} did not settle in {SETTLE_S} s: {why}")
            time.sleep(0.03)

    def _check(
        self, run_id: str, follow: bool, seen: set[str]
    ) -> tuple[RunState | None, str | None]:
        """The run's state, and why it is not settled yet (``None``: it is)."""
        if run_id in seen:
            return None, f"run {run_id} is in a cycle"
        seen.add(run_id)
        state = self._read(run_id)
        if state is None:
            return None, f"run {run_id} does not exist yet"
        if follow and state.status is RunStatus.CONTINUED_AS_NEW:
            assert state.outcome is not None and state.outcome.successor_run_id is not None
            return self._check(state.outcome.successor_run_id, follow, seen)
        now = self.clock()
        found = condition(state, now)
        kind = found.kind
        if kind is ConditionKind.TERMINAL:
            return state, None
        if kind in (ConditionKind.FAILING, ConditionKind.WAITING_DEADLINE):
            if found.due is not None and found.due <= now:
                return state, f"due: {found.text}"
        elif kind is not ConditionKind.WAITING_INPUT:
            return state, found.text
        for child_id in state.blocking_children:
            child = state.children[child_id]
            self._known.add(child.run_id)
            child_state, why = self._check(child.run_id, True, seen)
            if why is not None:
                return state, f"child {child_id}: {why}"
            assert child_state is not None
            if child_state.is_terminal:
                return state, f"child {child_id} ended; its parent has not recorded it yet"
            if state.cancellation is not None and child_state.cancellation is None:
                # (blocking while cancelling: its policy is to request the child's cancellation)
                return state, f"the cancellation of child {child_id} is on its way"
        return state, None


class Flows:
    """``flows(runtime, **engine_options)``: a driver of the test's mode."""

    def __init__(
        self,
        mode: str,
        *,
        stores: StoreFactory | None = None,
        pool: ProcessorPool | None = None,
    ) -> None:
        self.mode = mode
        #: The embedded mode's stores (``None`` on Kafka).
        self.stores = stores
        self._pool = pool
        self.clock = FakeClock()
        self.made: list[KafkaFlow] = []

    def __call__(self, runtime: RecordingRuntime, **options: Any) -> Flow:
        if self.mode == "embedded":
            assert self.stores is not None
            store = self.stores.open(clock=self.clock)
            return EmbeddedFlow(store, runtime, self.clock, **options)
        assert self._pool is not None
        builds, settings = _processor_options(options)
        flow = KafkaFlow(self._pool.host(builds=builds, settings=settings), runtime)
        self.made.append(flow)
        return flow


def _processor_options(options: dict[str, Any]) -> tuple[tuple[str | None, ...], dict[str, Any]]:
    """The processor configuration that stands for the embedded engine's options."""
    builds: tuple[str | None, ...] = (None,)
    settings: dict[str, Any] = {}
    for name, value in options.items():
        if name == "builds" and isinstance(value, RuntimeBuilds):
            served: set[str | None] = {value.current, *value.compatible}
            if value.accept_unpinned:
                served.add(None)
            builds = tuple(sorted(served, key=lambda b: b or ""))
        elif name == "task_retry" and isinstance(value, TaskRetryPolicy):
            settings.update(
                task_retry_initial_ms=value.initial_ms,
                task_retry_max_interval_ms=value.max_interval_ms,
                task_retry_max_automatic=value.max_automatic,
                task_fail_after=value.fail_after,
            )
        elif name == "task_retry" and value is None:
            continue
        elif name == "max_continuations":
            settings["max_continuations"] = value
        elif name == "eager_steps":
            settings["eager_steps"] = value
        else:
            raise TypeError(f"the kafka mode has no processor setting for {name}={value!r}")
    return builds, settings


@pytest.fixture(scope="package")
def processor_pool(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProcessorPool]:
    """The processors of the scenario tests, one per configuration (asked for only by the
    ``kafka`` mode): the broker-side setup is paid once, not per module or test, and they
    stop when the package's tests are done (their loops would go on through the rest of the
    session)."""
    bootstrap = request.getfixturevalue("kafka_bootstrap")
    pool = ProcessorPool(bootstrap, tmp_path_factory.mktemp("processors"), "scenarios")
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(params=MODES)
def flows(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Flows]:
    mode, kind = request.param
    if mode == "kafka":
        made = Flows("kafka", pool=request.getfixturevalue("processor_pool"))
        try:
            yield made
        finally:
            for flow in made.made:
                flow.close()
        return
    factory = factory_for(request, kind, tmp_path)
    try:
        yield Flows("embedded", stores=factory)
    finally:
        factory.close_all()
