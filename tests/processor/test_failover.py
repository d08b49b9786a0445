"""Failure tests against the real broker: SIGKILL, SIGSTOP (zombie fencing), a fenced producer, a
lost state directory, timers across a failover. Each asserts that every run's committed history
is contiguous with no duplicate sequence and that every started run reaches its outcome."""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from flowstream import codec
from flowstream.errors import RunNotFoundError
from flowstream.kafka import clients
from flowstream.model.events import EventEnvelope, RunStarted
from flowstream.partitioning import partition_for
from flowstream.topology import EVENTS, load_topology
from tests.processor.apps import SPEC
from tests.processor.harness import (
    Cluster,
    Load,
    Worker,
    assert_no_duplicate_sequences,
    committed_events,
    positions_without_writer,
    raw_events,
    step_log,
    transactional_ids_of,
    wait_until,
)
from tests.support import envelope

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

# Steps started once their step_started committed (the default), or as soon as decided.
both_modes = pytest.mark.parametrize(
    "env",
    [{"FLOWSTREAM_EAGER_STEPS": "false"}, {"FLOWSTREAM_EAGER_STEPS": "true"}],
    ids=["strict", "eager"],
)


def _check_invariants(cluster: Cluster, run_ids: list[str]) -> list[tuple[str, int, str, str]]:
    records = raw_events(cluster.bootstrap, cluster.prefix, cluster.client.partitions)
    assert_no_duplicate_sequences(records)
    started = {r for r, s, t, _ in records if t == "run_created"}
    assert set(run_ids) <= started
    return records


def _committed_steps_never_rerun(cluster: Cluster, run_ids: list[str]) -> None:
    """Every execution of a step began before its step_completed was committed."""
    executions = step_log(cluster.step_log)
    completed: dict[tuple[str, str], datetime] = {}
    histories: dict[str, list[EventEnvelope]] = {}
    for event, _ in committed_events(cluster.bootstrap, cluster.prefix, 8):
        histories.setdefault(event.run_id, []).append(event)
        if event.event.type == "step_completed":
            step_id = event.event.step_id
            completed[(event.run_id, step_id)] = event.timestamp
    wanted = set(run_ids)
    for entry in executions:
        run_id, step = str(entry["run"]), str(entry["step"])
        if run_id not in wanted:
            continue
        done = completed[(run_id, step)]
        began = datetime.fromtimestamp(float(entry["started"]), tz=done.tzinfo)
        if began > done:
            mine = [e for e in executions if e["run"] == run_id]
            history = [
                (e.sequence, e.event.type, e.timestamp.isoformat()) for e in histories[run_id]
            ]
            pytest.fail(f"{run_id}: {mine}\n{history}\n{cluster.logs()}")


@both_modes
def test_sigkill_one_of_three_processors_under_load(cluster: Cluster, env: dict[str, str]) -> None:
    # Eager: the killed processor ran steps whose step_started never committed; the heirs run
    # them again, and still no step whose outcome committed ever runs again.
    for name in ("w1", "w2", "w3"):
        cluster.start(name, env)
    load = Load(cluster.client, SPEC, "kill", rate=25, options={"step_sleep_ms": 300})
    # Counted in runs, not seconds: a loaded host starts fewer per second.
    wait_until(lambda: len(load.run_ids) >= 100, 120, "the load never reached 100 runs")
    cluster.workers["w2"].kill()
    wait_until(lambda: len(load.run_ids) >= 160, 120, "no runs were started after the kill")
    run_ids = load.stop()
    results = cluster.client.wait_all(run_ids, timeout=180)
    assert {r.status.value for r in results.values()} == {"completed"}, cluster.logs()
    _check_invariants(cluster, run_ids)
    _committed_steps_never_rerun(cluster, run_ids)


def test_paused_processor_never_makes_its_pending_events_visible(cluster: Cluster) -> None:
    zombie = cluster.start("zombie")
    load = Load(cluster.client, SPEC, "stop", rate=25, options={"step_sleep_ms": 300})
    time.sleep(5)  # the zombie owns every partition and has steps and transactions in flight
    zombie.signal(signal.SIGSTOP)
    paused_at = time.time()
    cluster.start("heir")
    time.sleep(3)
    run_ids = load.stop()
    # The heir takes the partitions once the zombie's session expires, and finishes the runs.
    results = cluster.client.wait_all(run_ids, timeout=120)
    assert {r.status.value for r in results.values()} == {"completed"}, cluster.logs()
    before_resume = raw_events(cluster.bootstrap, cluster.prefix, cluster.client.partitions)
    resumed_from = len(zombie.output())
    zombie.signal(signal.SIGCONT)
    time.sleep(8)  # give the zombie every chance to commit what it held
    after_resume = _check_invariants(cluster, run_ids)
    assert sorted(after_resume) == sorted(before_resume), "the zombie made events visible"
    heir_events = [r for r in after_resume if r[3] == "heir"]
    assert heir_events, "the heir appended nothing: the test did not exercise a takeover"
    assert paused_at > 0
    # The zombie learns it was fenced and stops, or rejoins as a fresh member; it never
    # crash-loops silently.
    zombie_log = zombie.output()
    assert "Traceback" not in zombie_log, zombie_log[-3000:]
    assert zombie.process.poll() in (None, 3), zombie_log[-3000:]
    # Refused by the group (its session ran out), it fences nobody and rejoins at once: it used
    # to ask again every 0.5 s for 300 s, and fenced the heir's producers first.
    if zombie.process.poll() is None:
        wait_until(
            lambda: "assigned partitions" in zombie.output()[resumed_from:],
            60,
            "the resumed zombie never rejoined the group",
        )
        refused = zombie.output()[resumed_from:].split("assigned partitions")[0]
        assert "fenced the transactional ids" not in refused, refused[-3000:]


def test_restart_with_deleted_state_rebuilds_from_the_events_topic(cluster: Cluster) -> None:
    worker = cluster.start("w1")
    done = [f"before-{i}" for i in range(5)]
    for run_id in done:
        cluster.client.start(run_id, SPEC, {})
    cluster.client.start("waiting", SPEC, {"signal": True})
    cluster.client.flush()
    cluster.client.wait_all(done, timeout=60)
    assert worker.stop() == 0
    shutil.rmtree(cluster.root / "state" / "w1")

    cluster.start("w1-again")
    cluster.client.start(done[0], SPEC, {})  # a repeated start must not create a second run
    cluster.client.signal("waiting", "go", {"after": "restore"}, id="go-1")
    cluster.client.flush()
    result = cluster.client.wait("waiting", timeout=90)
    assert result.status.value == "completed", cluster.logs()
    assert result.output["go"] == {"after": "restore"}  # type: ignore[index]
    records = _check_invariants(cluster, [*done, "waiting"])
    assert sum(1 for r in records if r[0] == done[0] and r[2] == "run_created") == 1
    assert sum(1 for r in records if r[0] == done[0]) == len(cluster.client.history(done[0]))


def test_a_bad_record_on_the_events_topic_quarantines_its_run_only(cluster: Cluster) -> None:
    worker = cluster.start("w1")
    cluster.client.start("waiting", SPEC, {"signal": True})
    cluster.client.flush()
    deadline = time.monotonic() + 60
    created = False
    while not created and time.monotonic() < deadline:
        time.sleep(0.2)
        with contextlib.suppress(clients.KafkaException, RunNotFoundError):  # not yet
            created = bool(cluster.client.history("waiting"))
    assert created, cluster.logs()
    assert worker.stop() == 0
    shutil.rmtree(cluster.root / "state" / "w1")
    # On another partition than the run's (the client's own reader would refuse them).
    ghost = next(
        f"ghost-{i}"
        for i in range(100)
        if partition_for(f"ghost-{i}", cluster.client.partitions)
        != partition_for("waiting", cluster.client.partitions)
    )
    topic = load_topology().names(cluster.prefix)[EVENTS]
    producer = clients.new_producer(cluster.bootstrap)
    for value in (
        b"not avro",
        codec.encode_event(envelope(ghost, 1, RunStarted())),
        codec.encode_event(envelope(ghost, 2, RunStarted())),
    ):
        partition = partition_for(ghost, cluster.client.partitions)
        producer.produce(topic, value, key=ghost.encode(), partition=partition)
    assert producer.flush(30) == 0

    again = cluster.start("w1-again")
    cluster.client.signal("waiting", "go", {"after": "restore"}, id="go-1")
    cluster.client.flush()
    result = cluster.client.wait("waiting", timeout=90)
    assert result.status.value == "completed", cluster.logs()
    # The ghost's first record does not decode: the ghost is quarantined, its later records
    # skipped; the run beside it restored and moved on.
    assert again.output().count(f"run {ghost} is quarantined") == 1, again.output()[-3000:]


def test_timers_due_during_a_failover_fire_once_after_takeover(cluster: Cluster) -> None:
    first = cluster.start("t1")
    run_ids = [f"timer-{i:02d}" for i in range(12)]
    for run_id in run_ids:
        cluster.client.start(run_id, SPEC, {"timer_ms": 2500})
    cluster.client.flush()
    time.sleep(2)  # every run is now suspended on its timer, held by t1
    first.kill()
    cluster.start("t2")
    results = cluster.client.wait_all(run_ids, timeout=120)
    assert {r.status.value for r in results.values()} == {"completed"}, cluster.logs()
    records = _check_invariants(cluster, run_ids)
    for run_id in run_ids:
        kinds = [t for r, _, t, _ in records if r == run_id]
        assert kinds.count("wait_created") == 1
        assert kinds.count("wait_completed") == 1


FENCED = "the producer is fenced"


def _finish_after_fencing(cluster: Cluster, worker: Worker, load: Load) -> None:
    """The fenced worker replaced its producer, stayed up and finished every run exactly once."""
    time.sleep(2)  # runs keep arriving after the new producer took over
    run_ids = load.stop()
    results = cluster.client.wait_all(run_ids, timeout=120)
    assert {r.status.value for r in results.values()} == {"completed"}, cluster.logs()
    assert worker.process.poll() is None, cluster.logs()
    _check_invariants(cluster, run_ids)
    _committed_steps_never_rerun(cluster, run_ids)
    assert "Traceback" not in worker.output(), cluster.logs()


@pytest.mark.parametrize("slot", [0, 1], ids=["first-producer", "second-producer"])
def test_a_processor_whose_transactional_id_is_taken_over_goes_on(
    cluster: Cluster, slot: int
) -> None:
    worker = cluster.start("f1")
    load = Load(cluster.client, SPEC, "fence", rate=10, options={"step_sleep_ms": 50})
    cluster.client.wait("fence-0000", timeout=90)  # the processor is up and committing
    # Another producer initialises one of the processor's two transactional ids: the
    # coordinator bumps the epoch and aborts that producer's open transaction; its next
    # transactional call fails with a fatal _FENCED error.
    usurper = clients.new_transactional_producer(
        cluster.bootstrap, transactional_ids_of(cluster, "f1")[slot]
    )
    usurper.init_transactions(30)
    try:
        wait_until(lambda: FENCED in worker.output(), 60, "the processor was never fenced")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{worker.output()[-6000:]}\n{worker.stacks()}") from None
    _finish_after_fencing(cluster, worker, load)


def test_a_transaction_the_coordinator_timed_out_costs_a_new_producer(cluster: Cluster) -> None:
    # A short transaction timeout and a long session: a stalled processor keeps its partitions,
    # but the coordinator aborts the transaction it had open (and fences its producer).
    worker = cluster.start(
        "f2",
        {"FLOWSTREAM_TRANSACTION_TIMEOUT_MS": "1500", "FLOWSTREAM_SESSION_TIMEOUT_MS": "20000"},
    )
    # Enough load that transactions follow each other: the coordinator holds one open from
    # its positions (sent first) to its commit, and most of the time under this load, not
    # always: stall again until one was caught open.
    load = Load(cluster.client, SPEC, "stall", rate=40, options={"step_sleep_ms": 50})
    cluster.client.wait("stall-0000", timeout=90)
    for stalls in range(1, 9):
        worker.signal(signal.SIGSTOP)
        time.sleep(4)  # the timeout, plus the broker's abort check interval
        worker.signal(signal.SIGCONT)
        time.sleep(2)
        if FENCED in worker.output():
            print(f"fenced after {stalls} stalls")
            break
    assert FENCED in worker.output(), cluster.logs() + worker.stacks()
    _finish_after_fencing(cluster, worker, load)


def test_a_transactional_call_that_never_returns_costs_a_new_producer(cluster: Cluster) -> None:
    # librdkafka may never return from a transactional call (its issues 5456 and 5511: seen
    # when a broker was killed). The app makes the 40th commit block for good; the processor
    # gives up that producer after its stuck limit (15 s), replaces it, finishes every run
    # exactly once, and still exits cleanly.
    worker = cluster.start("h1", app="tests.processor.hang_app:runtime")
    load = Load(cluster.client, SPEC, "hang", rate=10, options={"step_sleep_ms": 50})
    cluster.client.wait("hang-0000", timeout=90)
    wait_until(lambda: "the producer hangs" in worker.output(), 90, "the hang was not noticed")
    _finish_after_fencing(cluster, worker, load)
    assert worker.stop(timeout=20) == 0, worker.output()[-3000:]


@both_modes
def test_steps_in_flight_when_the_producer_is_replaced_run_for_the_new_owner(
    cluster: Cluster, env: dict[str, str], tmp_path: Path
) -> None:
    # One step slot: run a's step holds it until the file exists, run b's waits for it. The
    # reset replaces every partition's owner while both tasks belong to the old one: b's task
    # then never starts (its owner is gone), so the new owner must run b's attempt itself;
    # a's handler is already running, so the new owner takes its outcome.
    worker = cluster.start("f3", {**env, "FLOWSTREAM_STEP_CONCURRENCY": "1"})
    release = tmp_path / "release"
    held = ["hold-a", "hold-b"]
    for run_id in held:
        cluster.client.start(run_id, SPEC, {"hold_file": str(release)})
        cluster.client.flush()
        wait_until(lambda: step_log(cluster.step_log), 90, "a's step never ran")  # a first

    def both_started() -> bool:
        return sum(
            e.event.type == "step_started" and e.run_id in held
            for e, _ in committed_events(cluster.bootstrap, cluster.prefix, 8)
        ) == len(held)

    wait_until(both_started, 60, "the held steps were never started\n" + cluster.logs())
    assert [e["run"] for e in step_log(cluster.step_log)] == ["hold-a"]
    restores = worker.output().count("restored in")
    for transactional_id in transactional_ids_of(cluster, "f3"):  # both of its producers
        usurper = clients.new_transactional_producer(cluster.bootstrap, transactional_id)
        usurper.init_transactions(30)
    cluster.client.start("after-reset", SPEC, {})  # its transaction meets the fence
    cluster.client.flush()
    wait_until(lambda: FENCED in worker.output(), 60, "never fenced\n" + cluster.logs())
    wait_until(
        lambda: worker.output().count("restored in") > restores,
        60,
        "the partitions were not taken again\n" + cluster.logs(),
    )
    release.touch()
    run_ids = [*held, "after-reset"]
    results = cluster.client.wait_all(run_ids, timeout=60)
    assert {r.status.value for r in results.values()} == {"completed"}, cluster.logs()
    _check_invariants(cluster, run_ids)
    _committed_steps_never_rerun(cluster, run_ids)
    # a's handler was running through the reset: the new owner recorded its outcome instead
    # of running the attempt again.
    ran = [(e["run"], e["step"]) for e in step_log(cluster.step_log)]
    assert sorted(ran) == sorted((r, s) for r in run_ids for s in ("validate", "reserve", "charge"))
    assert "Traceback" not in worker.output(), cluster.logs()


def test_a_gone_owner_is_fenced_so_its_open_transaction_does_not_hold_the_partitions(
    cluster: Cluster,
) -> None:
    # The previous owner died with a transaction open on every partition, and a timeout of
    # 120 s: its pending positions hold the next owner's committed() and its records hold
    # every events partition's last stable offset until the transaction ends.
    subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.processor.ghost_owner",
            cluster.bootstrap,
            cluster.prefix,
            cluster.group,
            str(cluster.client.partitions),
        ],
        check=True,
        timeout=60,
    )
    began = time.monotonic()
    worker = cluster.start("heir")
    run_ids = [f"after-ghost-{i}" for i in range(8)]
    for run_id in run_ids:
        cluster.client.start(run_id, SPEC, {})
    cluster.client.flush()
    results = cluster.client.wait_all(run_ids, timeout=60)
    assert {r.status.value for r in results.values()} == {"completed"}, cluster.logs()
    assert time.monotonic() - began < 90, "the heir waited for the dead owner's timeout"
    assert "fenced the transactional ids of ghost" in worker.output(), worker.output()[-3000:]


def test_the_heir_of_a_killed_worker_fences_the_writer_its_positions_name(
    cluster: Cluster,
) -> None:
    # Every position a transaction commits (its fence and the positions its commit moves
    # again) names the writer, so the heir of a SIGKILLed worker finds it and fences it.
    heir = cluster.start("heir")
    victim = cluster.start("victim")
    load = Load(cluster.client, SPEC, "heir", rate=20, options={"step_sleep_ms": 50})
    wait_until(
        lambda: "assigned partitions" in victim.output(), 60, "the victim never got partitions"
    )
    time.sleep(4)  # the victim commits on its partitions
    transactional_ids_of(cluster, "victim")  # its writer is named in the group's positions
    unnamed = positions_without_writer(cluster, samples=20)
    assert not unnamed, f"committed positions that name no writer: {unnamed[:5]}"
    victim.kill()
    time.sleep(2)
    run_ids = load.stop()
    results = cluster.client.wait_all(run_ids, timeout=120)
    assert {r.status.value for r in results.values()} == {"completed"}, cluster.logs()
    wait_until(
        lambda: "fenced the transactional ids of victim/" in heir.output(),
        30,
        "the heir never fenced the victim's writer\n" + heir.output()[-3000:],
    )
