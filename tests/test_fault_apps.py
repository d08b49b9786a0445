"""The test apps that patch the processor patch only the worker process that loads them
(``tests.support.fault_apps``): the processors this test process runs in its threads (the
scenario suite's kafka mode) keep the real pipeline, restorer and producers, whatever test
modules were collected before."""

from __future__ import annotations

import importlib

import pytest

from flowstream.processor.partitions import PartitionHost
from flowstream.processor.restore import StateRestorer
from flowstream.processor.txn.pipeline import TransactionPipeline

PATCHING_APPS = [
    "tests.processor.abort_app",
    "tests.processor.gated_app",
    "tests.processor.hang_app",
    "tests.kafka.outcome_abort_app",
]


@pytest.mark.parametrize("app", PATCHING_APPS)
def test_a_patching_app_refuses_the_test_process(app: str) -> None:
    with pytest.raises(ImportError, match="the test process must not import it"):
        importlib.import_module(app)


def test_the_test_process_runs_the_real_processor() -> None:
    """Collected with the whole suite (``test_eager_steps`` once imported ``abort_app`` for a
    constant), this failed: ``_commit_blocking`` was the app's, aborting every seventh commit."""
    patched = {
        "TransactionPipeline._commit_blocking": TransactionPipeline._commit_blocking,
        "PartitionHost.new_producer": PartitionHost.new_producer,
        "StateRestorer.restore_slice": StateRestorer.restore_slice,
    }
    for name, function in patched.items():
        assert function.__module__.startswith("flowstream."), (name, function.__module__)
        assert function.__qualname__ == name, (name, function.__qualname__)
