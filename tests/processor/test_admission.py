"""Nothing is written before it is known to be valid, on the broker (issue 16, items 2 and 8): a
start whose input does not validate against the workflow's input model is dead-lettered with the
reason and appends nothing; a start of a workflow the processor's runtime does not serve waits in
the inbox with the reason, and appends nothing either. A start dead-lettered after it wrote
leaves a run the next owner drives, and ``flowstream kafka retry`` drives one at once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from flowstream import codec
from flowstream.cli import main
from flowstream.client import EventTail
from flowstream.errors import RunNotFoundError
from flowstream.examples.order import SPEC as ORDER
from flowstream.model.messages import DeadLetter
from flowstream.settings import Settings
from tests.processor.admission_apps import PARENT
from tests.processor.admission_apps import SPEC as FRAGILE
from tests.processor.apps import SPEC as THREE_STEPS
from tests.processor.harness import Cluster, raw_events, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]

ORDER_APP = "flowstream.examples.order:runtime"


def dead_letters(cluster: Cluster, count: int, timeout: float = 30) -> list[DeadLetter]:
    """The first ``count`` records of the dead-letter topic (fewer if they do not come)."""
    tail = EventTail(
        Settings(bootstrap=cluster.bootstrap, group=f"{cluster.prefix}-dl"),
        list(range(cluster.client.partitions)),
        topic=f"{cluster.prefix}.deadletter",
    )
    letters: list[DeadLetter] = []
    deadline = time.monotonic() + timeout
    try:
        while len(letters) < count and time.monotonic() < deadline:
            for message in tail._consumer.consume(100, 0.2):
                if message.error() is None:
                    letters.append(codec.decode_dead_letter(message.value()))
    finally:
        tail.close()
    return letters


def test_a_start_whose_input_does_not_validate_is_dead_lettered_and_appends_nothing(
    cluster: Cluster,
) -> None:
    worker = cluster.start("w1", app=ORDER_APP)
    client = cluster.client
    client.start("bad-order", ORDER, {"order_id": "bad-order", "sku": "s", "quantity": "two"})
    client.flush()
    [letter] = dead_letters(cluster, 1, timeout=60)
    assert letter.source_topic == f"{cluster.prefix}.cmd.start"
    assert "does not validate against OrderInput" in letter.reason, letter.reason
    assert "quantity" in letter.reason and "amount_cents" in letter.reason
    assert "two" not in letter.reason  # fields are named, values never shown
    with pytest.raises(RunNotFoundError):
        client.history("bad-order", timeout=10)
    assert not any(run_id == "bad-order" for run_id, *_ in raw_events(
        cluster.bootstrap, cluster.prefix, client.partitions))  # fmt: skip
    assert "Traceback" not in worker.output()


def test_a_start_of_a_workflow_not_served_waits_with_the_reason_and_appends_nothing(
    cluster: Cluster,
) -> None:
    cluster.start("w1", app=ORDER_APP)
    client = cluster.client
    client.start("three-1", THREE_STEPS, {})
    client.flush()
    wait_until(lambda: client.parked("three-1", timeout=10), 60, "the start was never parked")
    [reason] = client.parked("three-1", timeout=10)
    assert "workflow three-steps" in reason and "serves order" in reason, reason
    with pytest.raises(RunNotFoundError):
        client.history("three-1", timeout=10)
    # A deployment that serves it takes the parked start up.
    cluster.workers.pop("w1").stop()
    cluster.start("w2")
    assert client.wait("three-1", timeout=90).status.value == "completed", cluster.logs()


FRAGILE_APP = "tests.processor.admission_apps:runtime"


def _start_fragile(cluster: Cluster, run_id: str, fixed: Path) -> list[str]:
    """Start a run whose code raises and wait until that failure is on record (the start's
    dead letter, or a ``workflow_task_failed`` in its history); its history's event types."""
    cluster.client.start(run_id, FRAGILE, {"fixed": str(fixed)})
    cluster.client.flush()

    def failed() -> bool:
        try:
            types = [e.event.type for e in cluster.client.history(run_id, timeout=10)]
        except RunNotFoundError:
            return False
        if "workflow_task_failed" in types:
            return True
        return any("the workflow code has a bug" in d.reason for d in dead_letters(cluster, 1, 1))

    wait_until(failed, 60, f"the failure of {run_id} was never recorded")
    return [e.event.type for e in cluster.client.history(run_id, timeout=10)]


def test_a_start_dead_lettered_after_writing_is_driven_by_the_next_owner(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Item 8: the start appended ``run_created`` (and whatever the engine repairs) before the
    code raised; once the code is fixed, the partition's next owner drives the run on."""
    fixed = tmp_path / "fixed"
    cluster.start("w1", app=FRAGILE_APP)
    written = _start_fragile(cluster, "fragile-1", fixed)
    assert written[0] == "run_created", written
    fixed.touch()
    cluster.workers.pop("w1").stop()
    cluster.start("w1", app=FRAGILE_APP)  # the same state directory: restored from its offset
    assert cluster.client.wait("fragile-1", timeout=90).status.value == "completed", cluster.logs()


def test_kafka_retry_drives_a_run_again_after_a_fix(
    cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fixed = tmp_path / "fixed"
    # No automatic task retry within the test: on a loaded machine it can drive the fixed run
    # before the operator's retry arrives (which then answers noop).
    cluster.start("w1", {"FLOWSTREAM_TASK_RETRY_INITIAL_MS": "240000"}, app=FRAGILE_APP)
    _start_fragile(cluster, "fragile-2", fixed)
    fixed.touch()
    where = ["--bootstrap", cluster.bootstrap, "--prefix", cluster.prefix]
    assert main(["kafka", "retry", "fragile-2", *where]) == 0
    said = "retry of run fragile-2: applied (run fragile-2 is driven again)\n"
    assert capsys.readouterr().out == said
    assert cluster.client.wait("fragile-2", timeout=60).status.value == "completed", cluster.logs()
    # A retry of a run that ended changes nothing; one of a run that does not exist is refused.
    assert main(["kafka", "retry", "fragile-2", *where]) == 0
    said = "retry of run fragile-2: noop (run fragile-2 is completed: nothing to retry)\n"
    assert capsys.readouterr().out == said
    assert main(["kafka", "retry", "no-such-run", *where]) == 1
    assert "run no-such-run does not exist" in capsys.readouterr().err
    letters = dead_letters(cluster, 2, timeout=30)
    assert any("run no-such-run does not exist" in letter.reason for letter in letters)
    history = [e.event.type for e in cluster.client.history("fragile-2", timeout=10)]
    assert history.count("run_completed") == 1


def test_a_command_parked_past_its_time_to_live_is_dead_lettered_and_leaves_the_inbox(
    cluster: Cluster,
) -> None:
    """Item 8: a signal for a run that never starts is not kept for ever. It outlives a restart
    (the next owner restores it with the time it was parked) and is dead-lettered once past
    ``FLOWSTREAM_PARKED_TTL_MS``, with the reason; a fresh start of that run never sees it."""
    ttl = {"FLOWSTREAM_PARKED_TTL_MS": "4000"}
    cluster.start("w1", extra_env=ttl)
    client = cluster.client
    sent = time.monotonic()
    client.signal("never-started", "go", {"late": True}, id="sig-1")
    client.flush()
    wait_until(lambda: client.parked("never-started", timeout=10), 60, "never parked")
    cluster.workers.pop("w1").stop()
    cluster.start("w2", extra_env=ttl)  # a new state directory: restored from the topic
    [letter] = dead_letters(cluster, 1, timeout=60)
    assert time.monotonic() - sent >= 4
    assert letter.source_topic == f"{cluster.prefix}.cmd.signal"
    assert letter.key == b"never-started" and codec.decode_command(letter.value or b"").run_id
    assert "parked for" in letter.reason and "run does not exist yet" in letter.reason, letter
    wait_until(lambda: not client.parked("never-started", timeout=10), 30, "still parked")
    client.start("never-started", THREE_STEPS, {})
    client.flush()
    done = client.wait("never-started", timeout=60)
    assert done.status.value == "completed" and done.output["go"] is None  # type: ignore[index]


def test_a_child_whose_input_does_not_validate_fails_for_its_parent_and_is_never_created(
    cluster: Cluster,
) -> None:
    cluster.start("w1", app="tests.processor.admission_apps:family")
    client = cluster.client
    client.start("family-ok", PARENT, {"kid": {"count": 3}})
    client.start("family-bad", PARENT, {"kid": {"count": "three"}})
    client.flush()
    done = client.wait_all(["family-ok", "family-bad"], timeout=90)
    assert done["family-ok"].output == {"type": "completed", "output": 3, "error": None}
    bad = done["family-bad"].output
    assert isinstance(bad, dict) and bad["type"] == "failed", bad
    assert "does not validate against KidInput" in bad["error"] and "count" in bad["error"]
    kid = client.snapshot("family-bad", timeout=10).children["k"].run_id
    with pytest.raises(RunNotFoundError):
        client.history(kid, timeout=10)


def test_a_due_timer_of_a_run_not_served_here_is_not_parked_and_fires_for_its_owner(
    cluster: Cluster,
) -> None:
    """The wakeup stays indexed and fires again (every ``timer_refire_ms``): parking each firing
    would pile up copies in the inbox for as long as the wrong deployment owns the partition."""
    client = cluster.client
    cluster.start("w1")
    client.start("timed-1", THREE_STEPS, {"timer_ms": 1500})
    client.flush()

    def waiting() -> bool:
        try:
            return "pause" in client.snapshot("timed-1", timeout=10).waits
        except RunNotFoundError:
            return False

    wait_until(waiting, 60, "the run never waited on its timer")
    cluster.workers.pop("w1").stop()
    cluster.start("order-only", app=ORDER_APP, extra_env={"FLOWSTREAM_TIMER_REFIRE_MS": "300"})
    time.sleep(5)  # the timer is due: it fires again and again here, unserved
    assert client.parked("timed-1", timeout=10) == []
    assert client.snapshot("timed-1", timeout=10).status.value == "suspended"
    cluster.workers.pop("order-only").stop()
    cluster.start("w1")
    assert client.wait("timed-1", timeout=60).status.value == "completed", cluster.logs()
