"""Continuation chains, children and controls on Kafka processors behave as in the embedded
engine (issue 17), proven on the real broker with a real ``flowstream worker``:

* a child that continues as new reports its chain's final outcome to its parent;
* a signal, a cancellation or a forced cancellation addressed to a chain's root id follows the
  chain to its active run, also when it comes right behind the continuation (the successor's
  start may not be applied yet on its partition), and is answered by the run that applied it;
* a forced cancellation reaches the children on every partition per their policy: one that
  requests cancellation ends cancelled, an abandoned one runs on where it lives, once;
* each child's start is produced once, in the transaction that records the request, and an
  operator's retry of the parent sends the starts of its open children again.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from flowstream import codec
from flowstream.client import EventTail, FlowClient
from flowstream.errors import RunConflictError, RunNotFoundError
from flowstream.kafka import clients
from flowstream.model.base import JSON
from flowstream.model.messages import (
    CancelRun,
    CommandMessage,
    OutcomeStatus,
    SendSignal,
    StartRun,
)
from flowstream.model.snapshot import RunStatus, WorkflowRunSnapshot
from flowstream.partitioning import partition_for
from flowstream.replay.decide import derived_run_id
from flowstream.settings import Settings
from tests.kafka.chain_apps import KID, PARENT
from tests.processor.harness import Cluster, Worker, committed_events, step_runs, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

APP = "tests.kafka.chain_apps:runtime"


@pytest.fixture
def cluster(kafka_bootstrap: str, unique_prefix: str, tmp_path: Path) -> Iterator[Cluster]:
    group = Cluster(kafka_bootstrap, unique_prefix, tmp_path)
    group.start("w1", app=APP)
    try:
        yield group
    finally:
        group.close()


# -- helpers ------------------------------------------------------------------------------------


def kid_run(parent: str, kid: str) -> str:
    return derived_run_id(parent, "child", kid)


def crossing_parents(stem: str, count: int, kids: list[str], partitions: int) -> list[str]:
    """``count`` parent ids whose every child in ``kids`` lives on another partition."""
    found: list[str] = []
    index = 0
    while len(found) < count:
        parent = f"{stem}-{index}"
        index += 1
        home = partition_for(parent, partitions)
        if all(partition_for(kid_run(parent, k), partitions) != home for k in kids):
            found.append(parent)
    return found


def maybe_snapshot(client: FlowClient, run_id: str) -> WorkflowRunSnapshot | None:
    try:
        return client.snapshot(run_id, timeout=10)
    except RunNotFoundError:
        return None


def chain_runs(
    client: FlowClient,
    root: str,
    done: Callable[[WorkflowRunSnapshot], bool],
    *,
    timeout: float = 90,
    why: Callable[[], str] = str,
) -> list[WorkflowRunSnapshot]:
    """The runs of ``root``'s chain, followed along every continuation, once ``done`` holds
    for the last one."""
    deadline = time.monotonic() + timeout
    runs: list[WorkflowRunSnapshot] = []
    run_id = root
    while True:
        snapshot = maybe_snapshot(client, run_id)
        if snapshot is not None and snapshot.status is RunStatus.CONTINUED_AS_NEW:
            assert snapshot.outcome is not None and snapshot.outcome.successor_run_id
            runs.append(snapshot)
            run_id = snapshot.outcome.successor_run_id
            continue
        if snapshot is not None and done(snapshot):
            return [*runs, snapshot]
        status = "absent" if snapshot is None else snapshot.status.value
        assert time.monotonic() < deadline, (
            f"chain of {root}: run {run_id} after {len(runs)} hops is {status}\n{why()}"
        )
        time.sleep(0.2)


def ended(snapshot: WorkflowRunSnapshot) -> bool:
    return snapshot.outcome is not None


def suspended(snapshot: WorkflowRunSnapshot) -> bool:
    return snapshot.status is RunStatus.SUSPENDED


def commands_on(cluster: Cluster, suffix: str) -> list[CommandMessage]:
    """Every committed command of topic ``suffix``, decoded."""
    tail = EventTail(
        Settings(bootstrap=cluster.bootstrap, group=f"{cluster.prefix}-{suffix}-reader"),
        list(range(cluster.client.partitions)),
        topic=f"{cluster.prefix}.{suffix}",
    )
    try:
        records = tail.read_records_to_end(timeout=30)
    finally:
        tail.close()
    return [codec.decode_command(m.value()) for m in records if m.value()]


def ballast_runs(cluster: Cluster) -> dict[int, str]:
    """One run per partition that exists and waits, for ``queue_ballast``."""
    client = cluster.client
    runs: dict[int, str] = {}
    index = 0
    while len(runs) < client.partitions:
        run_id = f"ballast-{index}"
        index += 1
        runs.setdefault(partition_for(run_id, client.partitions), run_id)
    for run_id in runs.values():
        client.start(run_id, KID, BALLAST_INPUT)
    client.flush()
    for run_id in runs.values():
        chain_runs(client, run_id, suspended, why=cluster.logs)
    return runs


BALLAST_INPUT: JSON = {"wait_first": True}


def queue_ballast(cluster: Cluster, runs: dict[int, str], copies: int) -> None:
    """Put a backlog on every partition of ``cmd.start``: ``copies`` repeated starts of the
    ballast run there (each a no-op that takes a drive). A start the processor sends now is
    read only after it, while the other command topics are read at once: a command sent on one
    of those right behind that start overtakes it."""
    producer = clients.new_producer(cluster.bootstrap, {"linger.ms": 20})
    topic = f"{cluster.prefix}.cmd.start"
    for _ in range(copies):
        for partition, run_id in runs.items():
            value = codec.encode_message(StartRun(run_id=run_id, spec=KID, input=BALLAST_INPUT))
            producer.produce(topic, value=value, key=run_id.encode(), partition=partition)
            producer.poll(0)
    assert producer.flush(60) == 0


def go_then(cluster: Cluster, run_ids: list[str], reason: str, *, force: bool) -> None:
    """Send each run its first ``go`` and, right behind it on the same topic (so the run reads
    them in this order), a cancellation."""
    producer = clients.new_producer(cluster.bootstrap, {"linger.ms": 0})
    topic = f"{cluster.prefix}.cmd.signal"
    for run_id in run_ids:
        for command in (
            SendSignal(run_id=run_id, signal_id="first", name="go"),
            CancelRun(run_id=run_id, reason=reason, force=force),
        ):
            partition = partition_for(run_id, cluster.client.partitions)
            value = codec.encode_message(command)
            producer.produce(topic, value=value, key=run_id.encode(), partition=partition)
    assert producer.flush(30) == 0


def crosses(client: FlowClient, runs: list[WorkflowRunSnapshot]) -> bool:
    return len({partition_for(r.run_id, client.partitions) for r in runs}) > 1


# -- a child that continues as new reports to its parent ---------------------------------------


def test_a_child_chain_on_other_partitions_reports_its_final_outcome(cluster: Cluster) -> None:
    """Each kid continues as new twice (its runs spread over partitions); the chain's last run
    ends completed with a signal sent to the kid's root id, or failed: the parent records that
    outcome under the kid's id and completes."""
    client = cluster.client
    kids = ["signalled", "failing"]
    parents = crossing_parents("reporting", 3, kids, client.partitions)
    for parent in parents:
        client.start(
            parent,
            PARENT,
            {
                "kids": [
                    {"id": "signalled", "hops": 2, "wait": "signal"},
                    {"id": "failing", "hops": 2, "fail": "no stock"},
                ]
            },
        )
    client.flush()
    for parent in parents:
        chain_runs(client, kid_run(parent, "signalled"), suspended, why=cluster.logs)
        client.signal(kid_run(parent, "signalled"), "go", {"to": parent}, id="sig-1")
    client.flush()
    results = client.wait_all(parents, timeout=90)
    for parent, result in results.items():
        assert result.status is RunStatus.COMPLETED, cluster.logs()
        assert result.output == {
            "signalled": {"type": "completed", "output": {"go": {"to": parent}}, "error": None},
            "failing": {"type": "failed", "output": None, "error": "no stock"},
        }
        for kid in kids:
            runs = chain_runs(client, kid_run(parent, kid), ended)
            assert len(runs) == 3
            assert runs[-1].parent is not None and runs[-1].parent.reports_to == parent


# -- controls addressed to a chain's root follow the chain --------------------------------------


def test_signal_cancel_and_force_cancel_by_the_root_id_reach_the_active_run(
    cluster: Cluster,
) -> None:
    client = cluster.client
    roots = {"signalled": "root-signalled", "cancelled": "root-cancelled", "forced": "root-forced"}
    for root in roots.values():
        client.start(root, KID, {"hops": 3, "wait": "signal"})
    client.flush()
    for root in roots.values():
        chain_runs(client, root, suspended, why=cluster.logs)
    client.signal(roots["signalled"], "go", {"by": "root id"}, id="sig-1")
    client.cancel(roots["cancelled"], "asked")
    client.cancel(roots["forced"], "now", force=True)
    client.flush()
    signalled = chain_runs(client, roots["signalled"], ended, why=cluster.logs)
    assert signalled[-1].status is RunStatus.COMPLETED
    assert signalled[-1].output == {"go": {"by": "root id"}}
    cancelled = chain_runs(client, roots["cancelled"], ended, why=cluster.logs)
    assert cancelled[-1].status is RunStatus.CANCELLED
    assert cancelled[-1].cancellation is not None
    assert cancelled[-1].cancellation.reason == "asked"  # workflow code saw the request
    forced = chain_runs(client, roots["forced"], ended, why=cluster.logs)
    assert forced[-1].status is RunStatus.CANCELLED and forced[-1].outcome is not None
    assert forced[-1].outcome.error == "now"
    for runs in (signalled, cancelled, forced):
        assert len(runs) == 4
    assert any(crosses(client, runs) for runs in (signalled, cancelled, forced))


def test_a_control_sent_to_the_root_is_answered_by_the_run_that_applied_it(
    cluster: Cluster,
) -> None:
    """Every command answers: a signal to a chain's root is forwarded hop by hop with its
    command id and answered by the active run; a signal id used again with other content is
    refused there with the embedded engine's ``RunConflictError``; a late cancel is a no-op."""
    client = cluster.client
    waiting = FlowClient(
        Settings(
            bootstrap=cluster.bootstrap,
            topic_prefix=cluster.prefix,
            group=f"{cluster.prefix}-waiting",
        )
    )
    try:
        waiting.start("answered", KID, {"hops": 2, "wait": "signal"}, timeout=60)
        leaf = chain_runs(client, "answered", suspended, why=cluster.logs)[-1].run_id
        outcome = waiting.signal("answered", "go", "once", timeout=60, id="sig-1")
        assert outcome is not None and outcome.status is OutcomeStatus.APPLIED
        assert outcome.key == leaf
        steps = waiting.outcomes(outcome.command_id, "answered")
        assert steps[0].status is OutcomeStatus.FORWARDED and steps[-1] == outcome
        done = chain_runs(client, "answered", ended, why=cluster.logs)[-1]
        assert done.status is RunStatus.COMPLETED and done.output == {"go": "once"}
        with pytest.raises(RunConflictError):
            waiting.signal("answered", "go", "twice", timeout=60, id="sig-1")
        late = waiting.cancel("answered", "late", timeout=60)
        assert late is not None and late.status is OutcomeStatus.NOOP and late.key == leaf
    finally:
        waiting.close()


@pytest.mark.parametrize("force", [False, True], ids=["cancel", "force-cancel"])
def test_a_cancel_right_behind_a_continuation_reaches_the_successor(
    cluster: Cluster, force: bool
) -> None:
    """A cancel for a chain's root comes right behind the signal that makes the root continue
    as new, while the successor's start waits in a backlog on its partition: the cancel passed
    on must not overtake that start (where it would find no run and be lost, and the successor
    would run on)."""
    client = cluster.client
    roots = [f"racing-{i}" for i in range(4)]
    for root in roots:
        client.start(root, KID, {"wait_first": True, "hops": 1, "wait": "signal"})
    client.flush()
    for root in roots:
        chain_runs(client, root, suspended, why=cluster.logs)
    queue_ballast(cluster, ballast_runs(cluster), 2_500)
    go_then(cluster, roots, "stop", force=force)
    for root in roots:
        runs = chain_runs(client, root, ended, timeout=90, why=cluster.logs)
        assert len(runs) == 2 and runs[-1].status is RunStatus.CANCELLED, (root, runs[-1])


# -- a forced cancellation reaches children on every partition ---------------------------------


def test_force_cancel_follows_each_childs_policy_on_other_partitions(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The parent's children live on other partitions and run a step held by a file: the one
    that requests cancellation ends cancelled; the abandoned one runs on on its own partition
    and completes, its run created and its step run once (not again on the parent's)."""
    client = cluster.client
    hold = tmp_path / "release"
    [parent] = crossing_parents("forced-parent", 1, ["keep", "free"], client.partitions)
    client.start(
        parent,
        PARENT,
        {
            "kids": [
                {"id": "keep", "hold_file": str(hold)},
                {"id": "free", "hold_file": str(hold), "policy": "abandon"},
            ]
        },
    )
    client.flush()
    keep, free = kid_run(parent, "keep"), kid_run(parent, "free")
    wait_until(
        lambda: (
            step_runs(cluster.step_log)[(free, "work")] == 1
            and step_runs(cluster.step_log)[(keep, "work")] == 1
        ),
        60,
        "the children's steps did not start",
    )
    client.cancel(parent, "ops", force=True)
    client.flush()
    result = client.wait(parent, timeout=60)
    assert result.status is RunStatus.CANCELLED
    assert result.children["keep"].outcome is not None
    assert result.children["keep"].outcome.type == "cancelled"
    assert result.children["free"].outcome is None  # abandoned: not waited for
    assert client.wait(keep, timeout=60).status is RunStatus.CANCELLED, cluster.logs()
    time.sleep(6)  # a liveness scan (every 5 s) drives whatever it finds stalled
    hold.touch()
    assert client.wait(free, timeout=60).status is RunStatus.COMPLETED, cluster.logs()
    time.sleep(6)
    created = [
        envelope.run_id
        for envelope, _ in committed_events(cluster.bootstrap, cluster.prefix, client.partitions)
        if envelope.event.type == "run_created"
    ]
    assert Counter(created)[free] == 1, "the abandoned child was created twice"
    assert step_runs(cluster.step_log)[(free, "work")] == 1


def test_force_cancel_right_behind_a_child_start_ends_the_child(cluster: Cluster) -> None:
    """A forced cancel for the parent comes right behind the signal that makes it request a
    child on another partition, while the child's start waits in a backlog there: the child's
    cancel must not overtake its start, or the child would run on alone."""
    client = cluster.client
    parents = crossing_parents("hasty", 4, ["kid"], client.partitions)
    for parent in parents:
        client.start(
            parent, PARENT, {"wait_first": True, "kids": [{"id": "kid", "wait": "signal"}]}
        )
    client.flush()
    for parent in parents:
        chain_runs(client, parent, suspended, why=cluster.logs)
    queue_ballast(cluster, ballast_runs(cluster), 2_500)
    go_then(cluster, parents, "ops", force=True)
    results = client.wait_all(parents, timeout=60)
    assert {r.status for r in results.values()} == {RunStatus.CANCELLED}
    assert all("kid" in r.children for r in results.values())  # requested, then cancelled
    for parent in parents:
        kid = kid_run(parent, "kid")
        assert client.wait(kid, timeout=90).status is RunStatus.CANCELLED, cluster.logs()


def test_a_cancel_for_a_child_whose_start_is_parked_waits_behind_it(cluster: Cluster) -> None:
    """The child's build is served by no worker yet, so its start waits in its partition's
    inbox; the parent's forced cancel sends the child a cancel, which must wait there too (it
    found no run and was refused, and the child ran on once a worker served its build)."""
    client = cluster.client
    [parent] = crossing_parents("pinned", 1, ["kid"], client.partitions)
    kid = kid_run(parent, "kid")
    client.start(parent, PARENT, {"kids": [{"id": "kid", "build": "kid-v2", "wait": "signal"}]})
    client.flush()
    wait_until(
        lambda: client.parked(kid), 60, f"the child's start was not parked\n{cluster.logs()}"
    )
    client.cancel(parent, "ops", force=True)
    client.flush()
    assert client.wait(parent, timeout=60).status is RunStatus.CANCELLED
    wait_until(lambda: len(client.parked(kid)) == 2, 60, "the child's cancel was not parked")
    assert cluster.workers["w1"].stop() == 0
    worker = Worker(
        "w2",
        bootstrap=cluster.bootstrap,
        prefix=cluster.prefix,
        group=cluster.group,
        state_dir=cluster.root / "state",
        step_log=cluster.step_log,
        app=APP,
        builds=(f"kid-v2={APP}",),
    )
    cluster.workers["w2"] = worker
    assert client.wait(kid, timeout=90).status is RunStatus.CANCELLED, cluster.logs()
    assert client.parked(kid) == []


# -- each child's start is produced once --------------------------------------------------------


def child_starts(cluster: Cluster) -> Counter[str]:
    return Counter(
        c.run_id
        for c in commands_on(cluster, "cmd.start")
        if isinstance(c, StartRun) and c.parent is not None and not c.parent.continued
    )


def test_each_child_start_is_produced_once(cluster: Cluster) -> None:
    """24 children in one batch, each reporting (and so driving the parent) on its own: the
    parent's drives do not send the open children's starts again (24 x 23 / 2 more before)."""
    client = cluster.client
    kids = [{"id": f"k{i:02d}"} for i in range(24)]
    client.start("fan-out", PARENT, {"kids": kids})
    client.flush()
    result = client.wait("fan-out", timeout=120)
    assert result.status is RunStatus.COMPLETED, cluster.logs()
    assert len(result.output) == 24  # type: ignore[arg-type]
    starts = child_starts(cluster)
    assert starts == Counter({kid_run("fan-out", str(k["id"])): 1 for k in kids})


def test_an_operator_retry_of_the_parent_sends_its_open_childrens_starts_again(
    cluster: Cluster,
) -> None:
    """The recovery path for a start that was lost (say the command topic's retention passed
    before the child's partition read it): ``flowstream kafka retry <parent>``."""
    client = cluster.client
    client.start("retried", PARENT, {"kids": [{"id": "kid", "wait": "signal"}]})
    client.flush()
    kid = kid_run("retried", "kid")
    chain_runs(client, kid, suspended, why=cluster.logs)
    assert child_starts(cluster) == Counter({kid: 1})
    client.retry("retried")
    client.flush()
    wait_until(lambda: child_starts(cluster)[kid] == 2, 30, "the retry sent no start")
    client.signal(kid, "go", "after the retry", id="sig-1")
    client.flush()
    result = client.wait("retried", timeout=60)
    assert result.status is RunStatus.COMPLETED, cluster.logs()
    assert result.output == {
        "kid": {"type": "completed", "output": {"go": "after the retry"}, "error": None}
    }
    assert [e.event.type for e in client.history(kid)].count("run_created") == 1
