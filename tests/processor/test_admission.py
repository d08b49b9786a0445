"""Nothing is written before it is known to be valid, on the broker (issue 16, items 2 and 8): a
start whose input does not validate against the workflow's input model is dead-lettered with the
reason and appends nothing; a start of a workflow the processor's runtime does not serve waits in
the inbox with the reason, and appends nothing either."""

from __future__ import annotations

import time

import pytest

from flowstream import codec
from flowstream.client import EventTail
from flowstream.errors import RunNotFoundError
from flowstream.examples.order import SPEC as ORDER
from flowstream.model.messages import DeadLetter
from flowstream.settings import Settings
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
