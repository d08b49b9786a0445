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

#: Issue 15, defect 4, as the long form meets it about four times in 600 runs: one processor
#: commits a run's events out of sequence order on its partition (the spare transaction, promoted
#: without waiting for the sealed one's records, writes its records first; both commit), and a
#: later restore of that partition skips the records that "do not follow" (defect 3), revives the
#: run on a shorter history and appends its sequences again. Only violations of runs whose
#: history shows that out-of-order write are allowed; remove this once the pipeline is rebuilt.
OUT_OF_ORDER = (
    "issue 15 defects 4 and 3: a run's events committed out of sequence order, then restored "
    "on a shorter history"
)


def test_a_short_chaos_run_leaves_no_violation(kafka3_cluster: Cluster, tmp_path: Path) -> None:
    result = run_chaos(kafka3_cluster, SHORT, tmp_path)
    for line in format_result(result):
        print(line)
    assert result.figures["faults_by_kind"] == dict.fromkeys(FAULT_KINDS, 1)
    assert result.figures["unfinished_at_end"] == 0
    audit = result.audit
    if (
        audit.violation_count
        and not audit.unattributed
        and all("sequence-order" in checks for checks in audit.by_run.values())
    ):
        pytest.xfail(f"{OUT_OF_ORDER}: {sorted(audit.by_run)}")
    assert audit.violation_count == 0, "\n".join(audit.violations)
