"""The chaos test's short form: three brokers, three workers, 150 runs of every kind (steps, a
retry, a batch, a timer, a signal, a hook, a child) and one fault of each kind (worker SIGKILL,
SIGSTOP, state-directory wipe, broker SIGKILL), then the independent audit of the events topic
(``benchmarks/chaos_audit.py``). The long form is ``python -m benchmarks.chaos``."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.chaos import FAULT_KINDS, SHORT, format_result, run_chaos
from flowstream.devkafka import Cluster

pytestmark = [pytest.mark.kafka3, pytest.mark.timeout(1200)]


def test_a_short_chaos_run_leaves_no_violation(kafka3_cluster: Cluster, tmp_path: Path) -> None:
    result = run_chaos(kafka3_cluster, SHORT, tmp_path)
    for line in format_result(result):
        print(line)
    assert result.figures["faults_by_kind"] == dict.fromkeys(FAULT_KINDS, 1)
    assert result.figures["unfinished_at_end"] == 0
    assert result.audit.violation_count == 0, "\n".join(result.audit.violations)
