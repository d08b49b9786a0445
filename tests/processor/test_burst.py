"""Issue 15, defect 5: unbounded work in one iteration against the transaction timeout.

A burst of starts arrives at once. The processor before its rebuild applied a whole fetched
batch of commands and every queued step outcome inside one transaction; on this two-core machine
that outlived a 1 s transaction timeout, the coordinator fenced the producer, the partitions were
taken again and the same batch was applied again. An iteration now takes decisions for a bounded
time and seals the transaction, so the burst costs no producer reset.
"""

from __future__ import annotations

import time

import pytest

from flowstream.model.spec import WorkflowSpec
from tests.processor.harness import Cluster, free_port, metric

pytestmark = pytest.mark.kafka

SPEC = WorkflowSpec(name="order")
BURST = 3000


@pytest.mark.timeout(300)
def test_a_burst_of_starts_costs_no_producer_reset(cluster: Cluster) -> None:
    port = free_port()
    worker = cluster.start(
        "burst",
        {"FLOWSTREAM_METRICS_PORT": str(port), "FLOWSTREAM_TRANSACTION_TIMEOUT_MS": "1000"},
    )
    cluster.client.start("warm-up", SPEC, {})
    cluster.client.flush()
    cluster.client.wait("warm-up", timeout=60)
    run_ids = [f"burst-{i:05d}" for i in range(BURST)]
    for run_id in run_ids:
        cluster.client.start(run_id, SPEC, {})
    cluster.client.flush()
    began = time.monotonic()
    results = cluster.client.wait_all(run_ids, timeout=240)
    took = time.monotonic() - began
    assert worker.process.poll() is None, worker.output()[-3000:]
    assert {r.status.value for r in results.values()} == {"completed"}
    resets = metric(port, "flowstream_producer_resets_total")
    assert resets == 0, f"{resets:.0f} producer resets in {took:.1f} s:\n{worker.output()[-3000:]}"
